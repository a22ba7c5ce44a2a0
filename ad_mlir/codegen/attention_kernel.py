"""Causal flash attention with RoPE applied inside: a kernel template, emitted as Python source.

`emit_attention_module` writes a kernel module with the interface of the region kernels (a
`@triton.jit` function named as asked, `OUTPUT_DTYPES`, `output_shapes`, `launch`), so the
kernel cache, the runtime ops and the PTX tool treat it like any generated kernel.

The launch takes `q [B, Hq, S, D]`, `k`, `v [B, Hkv, S, D]`, then with RoPE `cos`, `sin`
`[Bc, S, D]` and with a mask `mask [Bm, Hm, S, S]` (bool, True = attend), any of them
non-contiguous (every tensor is read through its strides; a size-1 dim is read with stride 0,
which broadcasts it), and returns `out [B, Hq, S, D]`, contiguous.

One program takes BLOCK_M query rows of one (batch, head): grid (B * Hq, cdiv(S, BLOCK_M)).
It loads its Q tile once, applies RoPE in fp32 (HF's rotate_half form, on the two halves of
the head dim: `lo' = lo cos_lo - hi sin_lo`, `hi' = hi cos_hi + lo sin_hi`), folds the softmax
scale times log2(e) into it, and loops over BLOCK_N key blocks of its kv head
(`h // (Hq // Hkv)`: GQA reads the shared K/V in place), rotating each K tile after its
load. QK^T is two dots over the halves (no shuffle of the head dim); soft-capped scores
(Gemma2: `softcap * tanh(s / softcap)`) get the scale on Q and log2(e) after the cap. Scores of
keys past the
sequence end, above the diagonal (causal; the loop also stops at the diagonal block), outside
a sliding window (the loop also starts at the first row's window) or False in the mask are
-inf before the row max; the online softmax (m_i, l_i, acc) runs in
fp32 with exp2, and P is rounded to the value dtype for the PV dot, as FlashAttention does.
A row whose every key is masked has l_i = 0 and stores zeros, as torch's
`scaled_dot_product_attention` returns on CPU (torch 2.13) for such a row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ad_mlir.codegen.blocks import next_power_of_2
from ad_mlir.codegen.writer import IndentedWriter

LOG2E = 1.4426950408889634

_TL_DTYPE = {torch.float32: "tl.float32", torch.bfloat16: "tl.bfloat16", torch.float16: "tl.float16"}

MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256


def dot_dtype_line(dtype: torch.dtype) -> str:
    """The `DOT_DTYPE` constant of a template: the tiles' dtype for `tl.dot`."""
    if dtype != torch.bfloat16:
        return f"DOT_DTYPE = tl.constexpr({_TL_DTYPE[dtype]})"
    # The interpreter multiplies bf16 tiles as their raw uint16 bits: there the tiles,
    # already rounded to bf16, are multiplied in fp32 (the same products, accumulated in
    # fp32 as the tensor cores do). The jit decorator picks the interpreter the same way.
    return "DOT_DTYPE = tl.constexpr(tl.float32 if triton.knobs.runtime.interpret else tl.bfloat16)"


@dataclass(frozen=True)
class AttentionSpec:
    """What one attention kernel is specialized for (everything but the runtime sizes)."""

    head_dim: int
    """D: a power of two in 16..256 (32..256 with RoPE: each half feeds a dot, whose depth
    must be at least 16)."""
    dtype: torch.dtype
    """Of q, k, v and the output."""
    rope: bool
    """cos and sin are inputs; RoPE is applied to the Q and K tiles after their load."""
    has_mask: bool
    """A boolean mask is an input (True = attend, as in torch's SDPA)."""
    causal: bool
    """Key j is seen by query i only when j <= i (no mask tensor needed)."""
    scale: float
    """The softmax scale (usually head_dim ** -0.5), baked into the kernel."""
    cos_dtype: torch.dtype | None = None
    """Of cos and sin when `rope`; may differ from `dtype` (fp32 tables with bf16 q)."""
    window: int | None = None
    """With `causal`: key j is seen by query i only when i - window < j (a sliding window)."""
    softcap: float | None = None
    """Scores s = scale * q.k become `softcap * tanh(s / softcap)` (Gemma2) before masking."""

    def __post_init__(self) -> None:
        d = self.head_dim
        if d < MIN_HEAD_DIM or d > MAX_HEAD_DIM or d & (d - 1):
            raise ValueError(f"attention kernel: head_dim {d} is not a power of two in "
                             f"{MIN_HEAD_DIM}..{MAX_HEAD_DIM}; use the unfused attention for it")
        if self.rope and d < 2 * MIN_HEAD_DIM:
            raise ValueError(f"attention kernel: RoPE needs head_dim >= {2 * MIN_HEAD_DIM} (each half "
                             f"feeds a tl.dot of depth >= 16), got {d}; apply RoPE outside the kernel")
        if self.rope and self.cos_dtype is None:
            raise ValueError("attention kernel: rope=True needs cos_dtype (the dtype of the cos/sin inputs)")
        for what, dtype in (("dtype", self.dtype), ("cos_dtype", self.cos_dtype if self.rope else None)):
            if dtype is not None and dtype not in _TL_DTYPE:
                raise ValueError(f"attention kernel: {what} {dtype} is not one of {', '.join(map(str, _TL_DTYPE))}")
        if not math.isfinite(self.scale):
            raise ValueError(f"attention kernel: softmax scale {self.scale} is not finite")
        if self.softcap is not None and not (math.isfinite(self.softcap) and self.softcap > 0):
            raise ValueError(f"attention kernel: softcap {self.softcap} is not a positive number")
        if self.window is not None and (not self.causal or self.window < 1):
            raise ValueError(f"attention kernel: window {self.window} needs causal=True and must be positive")


# ------------------------------------------------------------------- block sizes


@dataclass(frozen=True)
class AttentionBlocks:
    block_m: int
    """Query rows per program."""
    block_n: int
    """Keys per loop iteration."""
    num_warps: int
    num_stages: int


_BLOCKS: dict[tuple[int, bool], AttentionBlocks] = {
    # (head_dim, 16-bit) -> the biggest tiles that compile for sm_90 without a spill in every
    # variant (RoPE, mask, causal on or off; cos/sin in the q dtype or fp32), measured with
    # tests/unit/test_attention_kernel.py's PTX check. 16-bit dots run on the tensor cores
    # (wgmma: 64 query rows per warp group); RoPE keeps a K tile and its cos/sin in fp32
    # registers, which is what bounds BLOCK_N at head_dim 128. fp32 dots (ieee) run on the
    # FMA units, which hold dot operands in registers: much smaller tiles.
    (16, True): AttentionBlocks(128, 64, 4, 3),
    (32, True): AttentionBlocks(128, 64, 4, 3),
    (64, True): AttentionBlocks(128, 64, 8, 3),
    (128, True): AttentionBlocks(128, 32, 8, 3),
    (256, True): AttentionBlocks(64, 16, 8, 2),
    (16, False): AttentionBlocks(64, 32, 4, 2),
    (32, False): AttentionBlocks(64, 32, 4, 2),
    (64, False): AttentionBlocks(32, 32, 4, 2),
    (128, False): AttentionBlocks(32, 16, 4, 2),
    (256, False): AttentionBlocks(16, 16, 4, 1),
}


def attention_blocks(head_dim: int, dtype: torch.dtype, seq_len: int) -> AttentionBlocks:
    """The blocks and launch options for `seq_len` queries of `head_dim`. Short sequences get
    fewer rows per program (at least 16, the smallest tl.dot) and fewer warps, so a prefill of
    a few tokens does not compute a 128-row tile of padding."""
    table = _BLOCKS[head_dim, dtype != torch.float32]
    block_m = min(table.block_m, max(16, next_power_of_2(seq_len)))
    num_warps = max(1, table.num_warps * block_m // table.block_m)
    return AttentionBlocks(block_m, table.block_n, num_warps, table.num_stages)


# ---------------------------------------------------------------------- the kernel

_ROPE_HELPER = '''\
@triton.jit
def _load_rotated(x, x_rows, x_sd, cos, cos_rows, cos_sd, sin, sin_rows, sin_sd, row_mask,
                  HALF: tl.constexpr):
    """The two halves of a [rows, 2 * HALF] tile after RoPE, in fp32: x * cos + rotate_half(x) * sin,
    rotate_half(x) = cat(-x[HALF:], x[:HALF])."""
    lo = tl.arange(0, HALF)[None, :]
    hi = lo + HALF
    m = row_mask[:, None]
    x_lo = tl.load(x + x_rows[:, None] + lo * x_sd, mask=m, other=0).to(tl.float32)
    x_hi = tl.load(x + x_rows[:, None] + hi * x_sd, mask=m, other=0).to(tl.float32)
    cos_lo = tl.load(cos + cos_rows[:, None] + lo * cos_sd, mask=m, other=0).to(tl.float32)
    cos_hi = tl.load(cos + cos_rows[:, None] + hi * cos_sd, mask=m, other=0).to(tl.float32)
    sin_lo = tl.load(sin + sin_rows[:, None] + lo * sin_sd, mask=m, other=0).to(tl.float32)
    sin_hi = tl.load(sin + sin_rows[:, None] + hi * sin_sd, mask=m, other=0).to(tl.float32)
    return x_lo * cos_lo - x_hi * sin_lo, x_hi * cos_hi + x_lo * sin_hi
'''


_SOFTCAP_HELPER = '''\
@triton.jit
def _soft_capped(qk, SOFTCAP: tl.constexpr):
    """SOFTCAP * tanh(qk / SOFTCAP), tanh from exp2 (libdevice is not in the interpreter):
    sign(x) (1 - t) / (1 + t), t = e^(-2|x|)."""
    x = qk / SOFTCAP
    t = tl.exp2(tl.abs(x) * -2.885390081777927)  # -2 log2(e)
    return SOFTCAP * tl.where(x < 0, t - 1.0, 1.0 - t) / (1.0 + t)
'''


class _Tensor:
    """A kernel input: its name and the names of its stride arguments, one per dim."""

    def __init__(self, name: str, dims: str):
        self.name = name
        self.strides = [f"{name}_s{d}" for d in dims]


class AttentionEmitter:
    """Writes the `@triton.jit` kernel and the launcher for one `AttentionSpec`."""

    def __init__(self, spec: AttentionSpec, name: str):
        self.spec = spec
        self.name = name
        self.tables = [_Tensor("cos", "bsd"), _Tensor("sin", "bsd")] if spec.rope else []
        self.mask = _Tensor("mask", "bhqk") if spec.has_mask else None
        qkv = [_Tensor(n, "bhsd") for n in "qkv"]
        self.inputs = [*qkv, *self.tables, *([self.mask] if self.mask else [])]

    @property
    def elem(self) -> str:
        return _TL_DTYPE[self.spec.dtype]

    def dot_operand(self, expr: str) -> str:
        """`expr` rounded to the element dtype, as a tl.dot operand (see DOT_DTYPE)."""
        operand = expr if expr.isidentifier() else f"({expr})"
        return f"{operand}.to({self.elem}).to(DOT_DTYPE)"

    def params(self) -> list[str]:
        names = [t.name for t in self.inputs] + ["out", "seq_len", "n_heads", "kv_group"]
        names += [s for t in self.inputs for s in t.strides]
        return [*names, "BLOCK_M: tl.constexpr", "BLOCK_N: tl.constexpr"]

    def emit_kernel(self) -> str:
        w = IndentedWriter()
        w.line("@triton.jit")
        w.line(f"def {self.name}({', '.join(self.params())}):")
        with w.indent():
            self.emit_prologue(w)
            self.emit_q_tile(w)
            self.emit_loop(w)
            self.emit_store(w)
        return w.text()

    def emit_prologue(self, w: IndentedWriter) -> None:
        # Products of a batch or head index with a stride reach past 2**31 elements on big
        # inputs: they are int64 scalars; offsets inside a tile stay int32.
        w.line("bh = tl.program_id(0)")
        if self.spec.causal:
            # The last query blocks see the most keys: they start first, the short ones fill the tail.
            w.line("start_m = (tl.num_programs(1) - 1 - tl.program_id(1)) * BLOCK_M")
        else:
            w.line("start_m = tl.program_id(1) * BLOCK_M")
        w.line("b = (bh // n_heads).to(tl.int64)")
        w.line("h = (bh % n_heads).to(tl.int64)")
        w.line("kvh = h // kv_group")
        w.line("rows = tl.arange(0, BLOCK_M)")
        w.line("keys = tl.arange(0, BLOCK_N)")
        w.line(f"dims = tl.arange(0, {self.spec.head_dim})")
        w.line("m_pos = start_m + rows")
        w.line("m_in = m_pos < seq_len")
        w.line("start_m64 = start_m.to(tl.int64)")
        w.line("q_blk = q + b * q_sb + h * q_sh + start_m64 * q_ss")
        w.line("k_head = k + b * k_sb + kvh * k_sh")
        w.line("v_head = v + b * v_sb + kvh * v_sh")
        for t in self.tables:
            w.line(f"{t.name}_batch = {t.name} + b * {t.name}_sb")
        if self.mask:
            w.line("mask_blk = mask + b * mask_sb + h * mask_sh + start_m64 * mask_sq")

    def emit_q_tile(self, w: IndentedWriter) -> None:
        spec = self.spec
        # exp2 of scores in log2 units: the scale times log2(e) rides on Q, once per program
        # (the scale alone when the scores are soft-capped: log2(e) comes after the cap).
        w.line(f"qk_scale = {spec.scale * (1.0 if spec.softcap else LOG2E)!r}")
        if spec.rope:
            w.line("q_lo, q_hi = _load_rotated(")
            with w.indent():
                w.line("q_blk, rows * q_ss, q_sd,")
                w.line("cos_batch + start_m64 * cos_ss, rows * cos_ss, cos_sd,")
                w.line("sin_batch + start_m64 * sin_ss, rows * sin_ss, sin_sd,")
                w.line(f"m_in, {spec.head_dim // 2},")
            w.line(")")
            w.line(f"q_lo = {self.dot_operand('q_lo * qk_scale')}")
            w.line(f"q_hi = {self.dot_operand('q_hi * qk_scale')}")
        else:
            w.line("q_tile = tl.load(q_blk + rows[:, None] * q_ss + dims[None, :] * q_sd, mask=m_in[:, None], "
                   "other=0).to(tl.float32)")
            w.line(f"q_tile = {self.dot_operand('q_tile * qk_scale')}")

    def emit_loop(self, w: IndentedWriter) -> None:
        spec = self.spec
        w.line('m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)')
        w.line("l_i = tl.zeros([BLOCK_M], tl.float32)")
        w.line(f"acc = tl.zeros([BLOCK_M, {spec.head_dim}], tl.float32)")
        # Keys past the diagonal block are all masked for every row of this block: not visited;
        # nor, in a sliding window, the keys before the first row's window.
        end = "tl.minimum(seq_len, start_m + BLOCK_M)" if spec.causal else "seq_len"
        start = f"tl.maximum(0, start_m - {spec.window - 1})" if spec.window else "0"
        w.line(f"for start_n in range({start}, {end}, BLOCK_N):")
        with w.indent():
            w.line("n_pos = start_n + keys")
            w.line("n_in = n_pos < seq_len")
            w.line("start_n64 = tl.cast(start_n, tl.int64)")
            self.emit_scores(w)
            self.emit_masking(w)
            w.line("m_new = tl.maximum(m_i, tl.max(qk, 1))")
            # A row with no key seen yet has m_new = -inf: subtracting 0 instead keeps
            # exp2(-inf - -inf) = NaN out of p and alpha (both are 0 there).
            w.line('m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)')
            w.line("p = tl.exp2(qk - m_ref[:, None])")
            w.line("alpha = tl.exp2(m_i - m_ref)")
            w.line("l_i = l_i * alpha + tl.sum(p, 1)")
            w.line("v_tile = tl.load(v_head + start_n64 * v_ss + keys[:, None] * v_ss + dims[None, :] * v_sd, "
                   "mask=n_in[:, None], other=0)")
            w.line(f"acc = tl.dot({self.dot_operand('p')}, v_tile.to(DOT_DTYPE), acc * alpha[:, None]{self.precision})")
            w.line("m_i = m_new")

    @property
    def precision(self) -> str:
        # fp32 inputs: no tf32, so the GPU and the interpreter agree with torch's fp32 matmul.
        return ', input_precision="ieee"' if self.spec.dtype == torch.float32 else ""

    def emit_scores(self, w: IndentedWriter) -> None:
        spec = self.spec
        if spec.rope:
            w.line("k_lo, k_hi = _load_rotated(")
            with w.indent():
                w.line("k_head + start_n64 * k_ss, keys * k_ss, k_sd,")
                w.line("cos_batch + start_n64 * cos_ss, keys * cos_ss, cos_sd,")
                w.line("sin_batch + start_n64 * sin_ss, keys * sin_ss, sin_sd,")
                w.line(f"n_in, {spec.head_dim // 2},")
            w.line(")")
            w.line(f"qk = tl.dot(q_lo, tl.trans({self.dot_operand('k_lo')}){self.precision})")
            w.line(f"qk = tl.dot(q_hi, tl.trans({self.dot_operand('k_hi')}), qk{self.precision})")
        else:
            w.line("k_tile = tl.load(k_head + start_n64 * k_ss + keys[:, None] * k_ss + dims[None, :] * k_sd, "
                   "mask=n_in[:, None], other=0)")
            w.line(f"qk = tl.dot(q_tile, tl.trans(k_tile.to(DOT_DTYPE)){self.precision})")
        if spec.softcap:
            w.line(f"qk = _soft_capped(qk, {float(spec.softcap)!r}) * {LOG2E!r}")

    def emit_masking(self, w: IndentedWriter) -> None:
        visible = "n_in[None, :]"
        if self.spec.causal:
            visible += " & (n_pos[None, :] <= m_pos[:, None])"
        if self.spec.window:
            visible += f" & (n_pos[None, :] > m_pos[:, None] - {self.spec.window})"
        if self.mask:
            w.line("attend = tl.load(mask_blk + start_n64 * mask_sk + rows[:, None] * mask_sq + keys[None, :] * mask_sk, "
                   "mask=m_in[:, None] & n_in[None, :], other=0)")
            visible += " & (attend != 0)"
        w.line(f'qk = tl.where({visible}, qk, float("-inf"))')

    def emit_store(self, w: IndentedWriter) -> None:
        # l_i = 0 only where every key is masked; acc is 0 there too, so the row stores 0.
        w.line("out_tile = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]")
        w.line(f"out_blk = out + (bh.to(tl.int64) * seq_len + start_m64) * {self.spec.head_dim}")
        w.line(f"tl.store(out_blk + rows[:, None] * {self.spec.head_dim} + dims[None, :], out_tile.to({self.elem}), "
               "mask=m_in[:, None])")

    # -- the host side ----------------------------------------------------------------

    def emit_launcher(self) -> str:
        spec, w = self.spec, IndentedWriter()
        dtype = str(spec.dtype)  # "torch.bfloat16"
        w.line(f"OUTPUT_DTYPES = ({dtype}, )")
        w.line()
        w.line()
        w.line("def output_shapes(tensors):")
        with w.indent():
            w.line("return [tuple(tensors[0].shape)]")
        w.line()
        w.line()
        w.line("def _stride(t, dim):")
        with w.indent():
            w.line('"""A size-1 dim is read with stride 0: it broadcasts (cos of batch 1, a [1, 1, S, S] mask)."""')
            w.line("return 0 if t.shape[dim] == 1 else t.stride(dim)")
        w.line()
        w.line()
        w.line("def launch(kernel, tensors, scalars):")
        with w.indent():
            w.line(f"{''.join(t.name + ', ' for t in self.inputs)}= tensors")
            w.line("batch, n_heads, seq_len, head_dim = q.shape")
            w.line(f"if head_dim != {spec.head_dim} or n_heads % k.shape[1] != 0:")
            with w.indent():
                w.line(f'raise ValueError(f"attention kernel for head_dim {spec.head_dim}: q {{tuple(q.shape)}} and '
                       'k {tuple(k.shape)} do not fit (the q heads must be a multiple of the kv heads)")')
            w.line(f"out = torch.empty((batch, n_heads, seq_len, head_dim), dtype={dtype}, device=q.device)")
            w.line("if out.numel() == 0:")
            with w.indent():
                w.line("return [out]")
            w.line(f"blocks = attention_blocks({spec.head_dim}, {dtype}, seq_len)")
            # (batch, head) on the unbounded grid dim; q heads that share a kv head run side by side.
            w.line("grid = (batch * n_heads, triton.cdiv(seq_len, blocks.block_m))")
            args = [t.name for t in self.inputs] + ["out", "seq_len", "n_heads", "n_heads // k.shape[1]"]
            args += [f"_stride({t.name}, {d})" for t in self.inputs for d in range(len(t.strides))]
            w.line("kernel[grid](")
            with w.indent():
                w.line(", ".join(args) + ",")
                w.line("BLOCK_M=blocks.block_m, BLOCK_N=blocks.block_n, num_warps=blocks.num_warps,")
                # FMA contraction on, as Triton 3.9 defaults (3.10 turns it off unless asked).
                w.line("num_stages=blocks.num_stages, enable_fp_fusion=True,")
            w.line(")")
            w.line("return [out]")
        return w.text()


def emit_attention_module(spec: AttentionSpec, name: str, header: str) -> str:
    """The whole kernel file: imports, the `@triton.jit` kernel (and its RoPE helper) and its
    launcher. `header` goes first (the cache's key and provenance comment)."""
    emitter = AttentionEmitter(spec, name)
    parts = [
        header,
        "import torch",
        "import triton",
        "import triton.language as tl",
        "",
        "from ad_mlir.codegen.attention_kernel import attention_blocks",
        "",
        dot_dtype_line(emitter.spec.dtype),
        "",
        "",
    ]
    if spec.rope:
        parts += [_ROPE_HELPER, ""]
    if spec.softcap:
        parts += [_SOFTCAP_HELPER, ""]
    parts += [emitter.emit_kernel(), "", emitter.emit_launcher()]
    return "\n".join(parts)
