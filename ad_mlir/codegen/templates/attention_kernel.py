"""Causal flash attention with RoPE applied inside: a kernel template, emitted as Python source.

`emit_attention_module` writes a kernel module with the interface of the region kernels (a
`@triton.jit` function named as asked, `OUTPUT_DTYPES`, `output_shapes`, `launch`), so the
kernel cache, the runtime ops and the PTX tool treat it like any generated kernel.

The launch takes `q [B, Hq, S, D]`, `k`, `v [B, Hkv, S, D]`, then with RoPE `cos`, `sin`
`[Bc, S, R]` (R the rotary dim: the first R dims of each head rotate, the rest pass), with
QK-norm `q_norm`, `k_norm [D]` and with a mask `mask [Bm, Hm, S, S]` (bool, True = attend), any
of them non-contiguous (every tensor is read through its strides; a size-1 dim is read with stride 0,
which broadcasts it), and returns `out [B, Hq, S, D]`, contiguous.

One program takes BLOCK_M query rows of one (batch, head): grid (B * Hq, cdiv(S, BLOCK_M)).
It loads its Q tile once, RMS-normalizes each row with QK-norm (Qwen3, Gemma3: fp32, rounded
where HF rounds), applies RoPE in fp32, folds the softmax scale times log2(e) into it, and loops
over BLOCK_N key blocks of its kv head (`h // (Hq // Hkv)`: GQA reads the shared K/V in place),
normalizing and rotating each K tile after its load. The head dim is held as pieces (`HeadPieces`):
the two members of each rotated pair side by side (`a` and `b`: dims i and i + R/2 in HF's
rotate_half form, 2i and 2i + 1 in the interleaved form of GPT-J, GLM; i < R/2 for a rotary dim
R), and the dims past R that RoPE passes through (`p`, partial rotary), each padded to a power of
two of at least 16 (a tl.dot's depth) and masked (loaded as 0, so padding adds nothing to a dot).
RoPE is then elementwise on the pieces (`a' = a cos_a - b sin_a`, `b' = b cos_b + a sin_b`), and
QK^T is one dot per piece (the dot of two heads does not depend on the order of their dims): no
shuffle of the head dim, any head_dim. Soft-capped scores (Gemma2: `softcap * tanh(s / softcap)`)
get the scale on Q and log2(e) after the cap. Scores of keys past the sequence end, above the
diagonal (causal; the loop also stops at the diagonal block), outside a sliding window (the loop
also starts at the first row's window) or False in the mask are -inf before the row max; the
online softmax (m_i, l_i, acc) runs in fp32 with exp2, and P is rounded to the value dtype for
the PV dot, as FlashAttention does. V and the output are [rows, head_dim] tiles padded to a
power of two and masked. A row whose every key is masked has l_i = 0 and stores zeros, as
torch's `scaled_dot_product_attention` returns on CPU (torch 2.13) for such a row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from string import Template

import torch

from ad_mlir.codegen.emitters import KernelEmitter
from ad_mlir.codegen.templates.skeleton import TL_DTYPE, dot_dtype_line, module_source
from ad_mlir.codegen.templates.writer import IndentedWriter
from ad_mlir.dialects import ad
from ad_mlir.dialects.ad import QkNorm
from ad_mlir.dialects.kernel_forms import (
    HeadPieces,
    check_rope_dims,
    head_pieces,
    next_power_of_2,
)
from ad_mlir.semantics.op_table import torch_dtype

LOG2E = 1.4426950408889634

class RotaryHead:
    """The rotary dim and the pieces of the head of a template's spec (its `head_dim`, `rope`
    and `rotary_dim` fields)."""

    head_dim: int
    rope: bool
    rotary_dim: int | None

    @property
    def rotary(self) -> int:
        """The rotary dim (the whole head unless `rotary_dim` says less)."""
        return self.rotary_dim if self.rotary_dim is not None else self.head_dim

    @property
    def pieces(self) -> HeadPieces:
        return head_pieces(self.head_dim, self.rotary if self.rope else None)


@dataclass(frozen=True)
class AttentionSpec(RotaryHead):
    """What one attention kernel is specialized for (everything but the runtime sizes)."""

    head_dim: int
    """D: any size whose padded pieces fit MAX_HEAD_DIM (`check_rope_dims`)."""
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
    rotary_dim: int | None = None
    """With `rope`: the dims of each head that rotate, the first ones (partial rotary: GPT-NeoX,
    Phi, GLM); None is all of them. The tables are this wide."""
    interleaved: bool = False
    """With `rope`: pairs (2i, 2i + 1) rotate (GPT-J, GLM), not HF's rotate_half (i, i + R/2)."""
    window: int | None = None
    """With `causal`: key j is seen by query i only when i - window < j (a sliding window)."""
    softcap: float | None = None
    """Scores s = scale * q.k become `softcap * tanh(s / softcap)` (Gemma2) before masking."""
    qk_norm: QkNorm | None = None
    """q_norm and k_norm weights [D] are inputs (after the tables): the Q and K tiles are
    RMS-normalized per head after their load, before RoPE."""

    def __post_init__(self) -> None:
        check_rope_dims("attention kernel", self.head_dim, self.rotary if self.rope else None, self.interleaved)
        if self.rope and self.cos_dtype is None:
            raise ValueError("attention kernel: rope=True needs cos_dtype (the dtype of the cos/sin inputs)")
        for what, dtype in (("dtype", self.dtype), ("cos_dtype", self.cos_dtype if self.rope else None)):
            if dtype is not None and dtype not in TL_DTYPE:
                raise ValueError(f"attention kernel: {what} {dtype} is not one of {', '.join(map(str, TL_DTYPE))}")
        if not math.isfinite(self.scale):
            raise ValueError(f"attention kernel: softmax scale {self.scale} is not finite")
        if self.softcap is not None and not (math.isfinite(self.softcap) and self.softcap > 0):
            raise ValueError(f"attention kernel: softcap {self.softcap} is not a positive number")
        if self.qk_norm is not None and not self.rope:
            raise ValueError("attention kernel: qk_norm needs rope=True (only ad.rope_attention holds a QK-norm)")
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
    # (head width `HeadPieces.width`, 16-bit) -> the biggest tiles that compile for sm_90 without a spill in every
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


def attention_blocks(width: int, dtype: torch.dtype, seq_len: int, qk_norm: bool = False) -> AttentionBlocks:
    """The blocks and launch options for `seq_len` queries of heads held `width` wide
    (`HeadPieces.width`: the head dim for a power of two). Short sequences get fewer rows per
    program (at least 16, the smallest tl.dot) and fewer warps, so a prefill of a few tokens
    does not compute a 128-row tile of padding. fp32 tiles with QK-norm run on twice the warps:
    the norm's rows and weights on top of the dot operands held in registers spilled at head_dim
    256 (432 bytes at 4 warps; none at 8)."""
    table = _BLOCKS[width, dtype != torch.float32]
    block_m = min(table.block_m, max(16, next_power_of_2(seq_len)))
    num_warps = max(1, table.num_warps * block_m // table.block_m)
    if qk_norm and dtype == torch.float32:
        num_warps *= 2
    return AttentionBlocks(block_m, table.block_n, num_warps, table.num_stages)


# ---------------------------------------------------------------------- the kernel

_ROPE_HELPER = '''\
@triton.jit
def _pair_pieces(x, x_rows, x_sd, row_mask, HALF: tl.constexpr, HALF_P: tl.constexpr, INTERLEAVED: tl.constexpr):
    """Pieces a and b of rows of a [rows, head_dim] tensor, [rows, HALF_P] (lanes >= HALF: 0):
    dims i and i + HALF, or with INTERLEAVED dims 2i and 2i + 1, loaded as one contiguous tile
    and split in registers (strided loads would not vectorize)."""
    if INTERLEAVED:
        j = tl.arange(0, 2 * HALF_P)[None, :]
        pairs = tl.load(x + x_rows[:, None] + j * x_sd, mask=row_mask[:, None] & (j < 2 * HALF), other=0.0)
        return tl.split(tl.reshape(pairs, (pairs.shape[0], HALF_P, 2)))
    i = tl.arange(0, HALF_P)[None, :]
    m = row_mask[:, None] & (i < HALF)
    return (tl.load(x + x_rows[:, None] + i * x_sd, mask=m, other=0.0),
            tl.load(x + x_rows[:, None] + (i + HALF) * x_sd, mask=m, other=0.0))


@triton.jit
def _store_pair_pieces(x, x_rows, x_sd, a, b, row_mask, HALF: tl.constexpr, HALF_P: tl.constexpr,
                       INTERLEAVED: tl.constexpr):
    """Pieces a and b (as `_pair_pieces` gives them) stored into their dims of rows of x."""
    if INTERLEAVED:
        j = tl.arange(0, 2 * HALF_P)[None, :]
        pairs = tl.reshape(tl.join(a, b), (a.shape[0], 2 * HALF_P))
        tl.store(x + x_rows[:, None] + j * x_sd, pairs, mask=row_mask[:, None] & (j < 2 * HALF))
    else:
        i = tl.arange(0, HALF_P)[None, :]
        m = row_mask[:, None] & (i < HALF)
        tl.store(x + x_rows[:, None] + i * x_sd, a, mask=m)
        tl.store(x + x_rows[:, None] + (i + HALF) * x_sd, b, mask=m)


@triton.jit
def _passed_piece(x, x_rows, x_sd, row_mask, START: tl.constexpr, WIDTH: tl.constexpr, WIDTH_P: tl.constexpr):
    """Dims START .. START + WIDTH of rows of a [rows, head_dim] tensor, padded to WIDTH_P, fp32."""
    j = tl.arange(0, WIDTH_P)[None, :]
    return tl.load(x + x_rows[:, None] + (START + j) * x_sd, mask=row_mask[:, None] & (j < WIDTH),
                   other=0.0).to(tl.float32)


@triton.jit
def _rotated(a, b, cos, cos_rows, cos_sd, sin, sin_rows, sin_sd, row_mask, HALF: tl.constexpr, HALF_P: tl.constexpr,
             INTERLEAVED: tl.constexpr):
    """RoPE of fp32 pieces a, b (`_pair_pieces`): x * cos + rotate(x) * sin."""
    cos_a, cos_b = _pair_pieces(cos, cos_rows, cos_sd, row_mask, HALF, HALF_P, INTERLEAVED)
    sin_a, sin_b = _pair_pieces(sin, sin_rows, sin_sd, row_mask, HALF, HALF_P, INTERLEAVED)
    cos_a, cos_b, sin_a, sin_b = cos_a.to(tl.float32), cos_b.to(tl.float32), sin_a.to(tl.float32), sin_b.to(tl.float32)
    return a * cos_a - b * sin_a, b * cos_b + a * sin_b


@triton.jit
def _load_pieces(x, x_rows, x_sd, cos, cos_rows, cos_sd, sin, sin_rows, sin_sd, row_mask,
                 HALF: tl.constexpr, HALF_P: tl.constexpr, REST: tl.constexpr, REST_P: tl.constexpr,
                 TAIL: tl.constexpr, TAIL_P: tl.constexpr, ROPE: tl.constexpr, INTERLEAVED: tl.constexpr):
    """Rows of a [rows, head_dim] tensor as its pieces (`HeadPieces`): a, b (the rotated pairs,
    after RoPE when ROPE: x * cos + rotate(x) * sin), p and t (the dims after them, passed
    through; a again when absent, unused), in fp32, 0 in padding lanes and masked rows: padding
    adds 0 to a dot."""
    a, b = _pair_pieces(x, x_rows, x_sd, row_mask, HALF, HALF_P, INTERLEAVED)
    a, b = a.to(tl.float32), b.to(tl.float32)
    if ROPE:
        a, b = _rotated(a, b, cos, cos_rows, cos_sd, sin, sin_rows, sin_sd, row_mask, HALF, HALF_P, INTERLEAVED)
    p = a
    if REST > 0:
        p = _passed_piece(x, x_rows, x_sd, row_mask, 2 * HALF, REST, REST_P)
    t = a
    if TAIL > 0:
        t = _passed_piece(x, x_rows, x_sd, row_mask, 2 * HALF + REST, TAIL, TAIL_P)
    return a, b, p, t
'''

_QK_NORM_HELPER = '''\
@triton.jit
def _load_normed_pieces(x, x_rows, x_sd, w, w_sd, cos, cos_rows, cos_sd, sin, sin_rows, sin_sd, row_mask,
                        HALF: tl.constexpr, HALF_P: tl.constexpr, REST: tl.constexpr, REST_P: tl.constexpr,
                        TAIL: tl.constexpr, TAIL_P: tl.constexpr, ROPE: tl.constexpr, INTERLEAVED: tl.constexpr):
    """`_load_pieces` of the rows RMS-normalized over the head first (QkNorm, weight w [head_dim]
    held as the same pieces): fp32 math, rounded to $elem where HF's RMSNorm rounds."""
    a, b, p, t = _load_pieces(x, x_rows, x_sd, x, x_rows, 0, x, x_rows, 0, row_mask,
                              HALF, HALF_P, REST, REST_P, TAIL, TAIL_P, False, INTERLEAVED)
    squares = tl.sum(a * a, 1) + tl.sum(b * b, 1)
    if REST > 0:
        squares += tl.sum(p * p, 1)
    if TAIL > 0:
        squares += tl.sum(t * t, 1)
    r = tl.rsqrt(squares / (2 * HALF + REST + TAIL) + $eps)[:, None]
    one = tl.arange(0, 1)  # the weight, as one row
    w_a, w_b, w_p, w_t = _load_pieces(w, one, w_sd, w, one, 0, w, one, 0, one == 0,
                                      HALF, HALF_P, REST, REST_P, TAIL, TAIL_P, False, INTERLEAVED)
    a, b, p, t = _weighted(a, r, w_a), _weighted(b, r, w_b), _weighted(p, r, w_p), _weighted(t, r, w_t)
    if ROPE:
        a, b = _rotated(a, b, cos, cos_rows, cos_sd, sin, sin_rows, sin_sd, row_mask, HALF, HALF_P, INTERLEAVED)
    return a, b, p, t


@triton.jit
def _weighted(x, r, w):
    """A piece x normalized (times r) and weighted by its weight piece w, rounded to $elem."""
$weighting
'''
_GEMMA_WEIGHTING = '''\
    return (x * r * (w + $offset)).to($elem).to(tl.float32)'''
_LLAMA_WEIGHTING = '''\
    # Llama: the normalized rows rounded to $elem, times (weight + offset) in $elem
    return ((x * r).to($elem).to(tl.float32) * (w + $offset).to($elem).to(tl.float32)).to($elem).to(tl.float32)'''


def qk_norm_helper(norm: QkNorm, dtype: torch.dtype) -> str:
    """The `_load_normed_pieces` helper of a kernel module (after `_ROPE_HELPER`)."""
    weighting = _GEMMA_WEIGHTING if norm.weight_in_fp32 else _LLAMA_WEIGHTING
    fields = {"eps": repr(float(norm.eps)), "offset": repr(float(norm.offset)), "elem": TL_DTYPE[dtype]}
    return Template(_QK_NORM_HELPER.replace("$weighting", weighting)).substitute(fields)


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
        self.pieces = spec.pieces
        self.tables = [_Tensor("cos", "bsd"), _Tensor("sin", "bsd")] if spec.rope else []
        self.norms = [_Tensor("q_norm", "d"), _Tensor("k_norm", "d")] if spec.qk_norm else []
        self.mask = _Tensor("mask", "bhqk") if spec.has_mask else None
        qkv = [_Tensor(n, "bhsd") for n in "qkv"]
        self.inputs = [*qkv, *self.tables, *self.norms, *([self.mask] if self.mask else [])]

    @property
    def elem(self) -> str:
        return TL_DTYPE[self.spec.dtype]

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
        w.line(f"dims = tl.arange(0, {self.pieces.head_p})")
        w.line(f"d_in = dims < {self.spec.head_dim}")
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

    def emit_pieces(self, w: IndentedWriter, x: str, base: str, start: str, rows: str, row_mask: str) -> None:
        """`x_a, x_b, x_p, x_t = _load_pieces(...)`: rows `start + rows` of `base`, normalized with
        QK-norm and rotated with RoPE."""
        spec, pieces = self.spec, self.pieces
        w.line(f"{', '.join(f'{x}_{n}' for n in ('a', 'b', 'p', 't'))} = {self.tile_loader}(")
        with w.indent():
            w.line(f"{base}, {rows} * {x}_ss, {x}_sd," + self.norm_weight(x))
            for t in ("cos", "sin"):
                # Without RoPE the tables are never read: x stands in for them.
                w.line(f"{t}_batch + {start} * {t}_ss, {rows} * {t}_ss, {t}_sd," if spec.rope
                       else f"{base}, {rows}, 0,")
            w.line(f"{row_mask}, {', '.join(map(str, pieces.constexprs.values()))}, {spec.rope}, {spec.interleaved},")
        w.line(")")

    def emit_q_tile(self, w: IndentedWriter) -> None:
        # exp2 of scores in log2 units: the scale times log2(e) rides on Q, once per program
        # (the scale alone when the scores are soft-capped: log2(e) comes after the cap).
        w.line(f"qk_scale = {self.spec.scale * (1.0 if self.spec.softcap else LOG2E)!r}")
        self.emit_pieces(w, "q", "q_blk", "start_m64", "rows", "m_in")
        for n in self.pieces.names:
            w.line(f"q_{n} = {self.dot_operand(f'q_{n} * qk_scale')}")

    @property
    def tile_loader(self) -> str:
        """The helper that loads and rotates (and with QK-norm normalizes) a Q or K tile."""
        return "_load_normed_pieces" if self.spec.qk_norm else "_load_pieces"

    def norm_weight(self, x: str) -> str:
        """The QK-norm weight arguments of `x`'s tile loader ("" without QK-norm)."""
        return f" {x}_norm, {x}_norm_sd," if self.spec.qk_norm else ""

    def emit_loop(self, w: IndentedWriter) -> None:
        spec = self.spec
        w.line('m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)')
        w.line("l_i = tl.zeros([BLOCK_M], tl.float32)")
        w.line(f"acc = tl.zeros([BLOCK_M, {self.pieces.head_p}], tl.float32)")
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
                   "mask=n_in[:, None] & d_in[None, :], other=0)")
            w.line(f"acc = tl.dot({self.dot_operand('p')}, v_tile.to(DOT_DTYPE), acc * alpha[:, None]{self.precision})")
            w.line("m_i = m_new")

    @property
    def precision(self) -> str:
        # fp32 inputs: no tf32, so the GPU and the interpreter agree with torch's fp32 matmul.
        return ', input_precision="ieee"' if self.spec.dtype == torch.float32 else ""

    def emit_scores(self, w: IndentedWriter) -> None:
        self.emit_pieces(w, "k", "k_head + start_n64 * k_ss", "start_n64", "keys", "n_in")
        for i, n in enumerate(self.pieces.names):
            acc = ", qk" if i else ""
            w.line(f"qk = tl.dot(q_{n}, tl.trans({self.dot_operand(f'k_{n}')}){acc}{self.precision})")
        if self.spec.softcap:
            w.line(f"qk = _soft_capped(qk, {float(self.spec.softcap)!r}) * {LOG2E!r}")

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
               "mask=m_in[:, None] & d_in[None, :])")

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
            w.line(f"blocks = attention_blocks({self.pieces.width}, {dtype}, seq_len, "
                   f"qk_norm={spec.qk_norm is not None})")
            # (batch, head) on the unbounded grid dim; q heads that share a kv head run side by side.
            w.line("grid = (batch * n_heads, cdiv(seq_len, blocks.block_m))")
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
    """The whole kernel file: imports, the `@triton.jit` kernel (and its helpers) and its
    launcher. `header` goes first (the cache's key and provenance comment)."""
    emitter = AttentionEmitter(spec, name)
    body = [_ROPE_HELPER]
    if spec.qk_norm:
        body.append(qk_norm_helper(spec.qk_norm, spec.dtype))
    if spec.softcap:
        body.append(_SOFTCAP_HELPER)
    body += [emitter.emit_kernel(), emitter.emit_launcher()]
    return module_source(header, {"ad_mlir.codegen.templates.attention_kernel": ["attention_blocks"]},
                         [dot_dtype_line(spec.dtype)], body)


def rotary_dim_of(op: ad.RopeAttentionOp | ad.RopeOp | ad.CachedAttentionOp) -> int:
    """The dims of each head RoPE rotates: the tables' width."""
    return op.cos.type.get_shape()[-1]


def attention_spec(op: ad.RopeAttentionOp) -> AttentionSpec:
    return AttentionSpec(
        head_dim=op.query.type.get_shape()[3],
        dtype=torch_dtype(op.query.type),
        rope=True,
        has_mask=op.attn_mask is not None,
        causal=op.is_causal is not None,
        scale=op.scale.value.data,
        cos_dtype=torch_dtype(op.cos.type),
        rotary_dim=rotary_dim_of(op),
        interleaved=op.interleaved is not None,
        window=op.window.value.data if op.window is not None else None,
        softcap=op.softcap.value.data if op.softcap is not None else None,
        qk_norm=QkNorm.of_op(op),
    )


EMITTER = KernelEmitter(lambda op, name, header: emit_attention_module(attention_spec(op), name, header))
