"""gpt-oss's MoE on MXFP4 experts (`ad.moe_mxfp4`): a kernel template of five launches, emitted as
Python source, in the shape of `moe_kernel.py`'s (whose ALIGN phase it shares).

The launch takes, in the op's operand order, `x [T, H]`, `router_logits [T, E]` (through their
strides), the gate/up experts' `blocks` ui8 [E, 2I, H / 32, 16], `scales` ui8 [E, 2I, H / 32],
`bias` [E, 2I], the same three of the down experts ([E, H, I / 32, 16], [E, H, I / 32], [E, H]),
and returns `out [T, H]`. One `@triton.jit` function, five phases (a constexpr):

- ROUTE, grid (cdiv(T, BLOCK_M),): the top k logits by k rounds of (max, lowest index holding
  it), their softmax in fp32 rounded to the input dtype (gpt-oss's router). Writes `route_ids`,
  `route_w` [T, k].
- ALIGN, grid (1,): `moe_kernel.ALIGN_PHASE`: the pairs sorted by expert into blocks of BLOCK_M
  rows, only experts that received pairs getting blocks.
- GATE_UP, grid (blocks, cdiv(I, BLOCK_N)): a block's rows gathered from x times its expert's
  gate rows (2n) and up rows (2n + 1). In the K loop each weight tile is decoded in registers:
  the bytes' low and high nibbles (elements 2j and 2j + 1) to their E2M1 values, times the
  block's E8M0 scale 2^(s - 127) (exact: its float bits are `s << 23`), cast to the input's
  dtype, then two `tl.dot`s, x's even columns with the low nibbles and its odd columns with the
  high ones (no shuffle of the decoded tile), into fp32 accumulators (Hopper has no FP4 MMA: the
  dots run in the activations' dtype). The epilogue rounds as transformers does on the
  dequantized weights: each GEMM's result, then the bias; `min(gate, limit)`, `clamp(up)`,
  `gate * sigmoid(alpha * gate)` and `(up + 1) *` each rounded; stored in `act` (sorted order).
- DOWN, grid (blocks, cdiv(H, BLOCK_N)): `act` rows times the expert's decoded down weights,
  rounded, plus the bias, rounded, times the pair's routing weight, rounded: stored at the
  pair's row of `y` [T * k, H].
- COMBINE, grid (T, cdiv(H, BLOCK_N)): each token's k rows of `y` summed in fp32 in slot order,
  rounded once into `out`.
"""

from __future__ import annotations

from dataclasses import dataclass
from string import Template

import torch

from ad_mlir.codegen.emitters import KernelEmitter, spec_check
from ad_mlir.codegen.templates.moe_kernel import ALIGN_PHASE, WEIGHTED_COMBINE_PHASE, MoeSpec
from ad_mlir.codegen.templates.skeleton import TL_DTYPE, dot_dtype_line, module_source
from ad_mlir.dialects import ad
from ad_mlir.dialects.kernel_forms import next_power_of_2
from ad_mlir.semantics.op_table import torch_dtype

ROUTE, ALIGN, GATE_UP, DOWN, COMBINE = range(5)
MX_BLOCK = 32


@dataclass(frozen=True)
class MoeMxfp4Spec:
    """What one MXFP4 MoE kernel is specialized for (everything but the token count)."""

    hidden: int
    intermediate: int
    experts: int
    top_k: int
    dtype: torch.dtype
    """Of x, the biases and the output (the router logits: any float dtype, read through their
    pointer's type)."""
    alpha: float
    limit: float

    def __post_init__(self) -> None:
        if self.dtype not in TL_DTYPE:
            raise ValueError(f"moe_mxfp4 kernel: dtype {self.dtype} is not one of {', '.join(map(str, TL_DTYPE))}")
        if not 1 <= self.top_k <= self.experts:
            raise ValueError(f"moe_mxfp4 kernel: top_k {self.top_k} is not in 1..{self.experts}")
        if self.hidden % MX_BLOCK or self.intermediate % MX_BLOCK:
            raise ValueError(f"moe_mxfp4 kernel: hidden {self.hidden} and intermediate {self.intermediate} must be "
                             f"multiples of {MX_BLOCK}")

    def blocks_of(self) -> MoeSpec:
        """The plain MoE spec of these sizes, whose block choices (`moe_kernel.gemm_blocks`,
        `route_block`, `align_chunk`) this kernel takes: its K tiles (32 or 64) hold whole MX
        blocks."""
        return MoeSpec(self.hidden, self.intermediate, self.experts, 0, self.top_k, self.dtype, False, True, False)


_KERNEL = '''\
@triton.jit
def _e2m1(code):
    # The E2M1 value of 4-bit codes: magnitude (2 + m) * 2^e / 4 for exponent bits e > 0, m / 2 for e = 0.
    e = (code >> 1) & 3
    m = code & 1
    magnitude = tl.where(e == 0, m.to(tl.float32) * 0.5, ((2 + m) << e).to(tl.float32) * 0.25)
    return tl.where((code & 8) != 0, -magnitude, magnitude)


@triton.jit
def _mxfp4_tile(blocks, scales, rows, kb, row_in, kb_in, K_BYTES: tl.constexpr):
    # Rows `rows` (flat over experts) of a packed weight, bytes `kb`: the values of the low and high
    # nibbles (elements 2j, 2j + 1) times their block's scale 2^(s - 127), in DOT_DTYPE.
    m = row_in[:, None] & kb_in[None, :]
    b = tl.load(blocks + rows[:, None] * K_BYTES + kb[None, :], mask=m, other=0).to(tl.int32)
    s = tl.load(scales + rows[:, None] * (K_BYTES // 16) + (kb // 16)[None, :], mask=m, other=127).to(tl.int32)
    scale = tl.where(s == 0, 5.877471754111438e-39, (s << 23).to(tl.float32, bitcast=True))
    return (_e2m1(b & 15) * scale).to(DOT_DTYPE), (_e2m1(b >> 4) * scale).to(DOT_DTYPE)


@triton.jit
def $name(x, logits, gu_blocks, gu_scales, gu_bias, dn_blocks, dn_scales, dn_bias, out, route_ids, route_w,
        sorted_slots, block_expert, block_rows, act, y, n_tokens, max_blocks, x_s0, x_s1, l_s0, l_s1,
        PHASE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    if PHASE == 0:
        # ROUTE: BLOCK_M tokens; the top k logits, their softmax.
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        r_in = rows < n_tokens
        cols = tl.arange(0, E_P2)
        c_in = cols < EXPERTS
        l = tl.load(logits + rows[:, None] * l_s0 + cols[None, :] * l_s1, mask=r_in[:, None] & c_in[None, :],
                    other=0.0).to(tl.float32)
        l = tl.where(c_in[None, :], l, float("-inf"))
        top = tl.max(l, 1)
        total = tl.zeros([BLOCK_M], tl.float32)
        s = l
        for j in tl.static_range(TOP_K):
            best = tl.max(s, 1)
            total += tl.exp(best - top)
            pick = tl.min(tl.where(s == best[:, None], cols[None, :], E_P2), 1)
            s = tl.where(cols[None, :] == pick[:, None], float("-inf"), s)
        s = l
        for j in tl.static_range(TOP_K):
            best = tl.max(s, 1)
            pick = tl.min(tl.where(s == best[:, None], cols[None, :], E_P2), 1)
            s = tl.where(cols[None, :] == pick[:, None], float("-inf"), s)
            w = (tl.exp(best - top) / total).to(ELEM).to(tl.float32)
            tl.store(route_ids + rows * SLOTS + j, pick, mask=r_in)
            tl.store(route_w + rows * SLOTS + j, w, mask=r_in)
    elif PHASE == 1:
$align
    elif PHASE == 2:
        # GATE_UP: (up + 1) * gate * sigmoid(alpha * gate), clamped, for a block of one expert's rows.
        blk = tl.program_id(0)
        e = tl.load(block_expert + blk)
        if e >= 0:
            r = tl.arange(0, BLOCK_M)
            r_in = r < tl.load(block_rows + blk)
            pair = tl.load(sorted_slots + blk * BLOCK_M + r, mask=r_in, other=0)
            x_rows = x + (pair // SLOTS).to(tl.int64)[:, None] * x_s0
            n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            n_in = n < INTER
            gate_rows = e.to(tl.int64) * (2 * INTER) + 2 * n
            j = tl.arange(0, BLOCK_K // 2)
            acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for k0 in range(0, HIDDEN // 2, BLOCK_K // 2):
                kb = k0 + j
                kb_in = kb < HIDDEN // 2
                x_mask = r_in[:, None] & kb_in[None, :]
                x_even = tl.load(x_rows + (2 * kb)[None, :] * x_s1, mask=x_mask, other=0.0).to(DOT_DTYPE)
                x_odd = tl.load(x_rows + (2 * kb + 1)[None, :] * x_s1, mask=x_mask, other=0.0).to(DOT_DTYPE)
                g_lo, g_hi = _mxfp4_tile(gu_blocks, gu_scales, gate_rows, kb, n_in, kb_in, HIDDEN // 2)
                acc_g = tl.dot(x_even, tl.trans(g_lo), acc_g$precision)
                acc_g = tl.dot(x_odd, tl.trans(g_hi), acc_g$precision)
                u_lo, u_hi = _mxfp4_tile(gu_blocks, gu_scales, gate_rows + 1, kb, n_in, kb_in, HIDDEN // 2)
                acc_u = tl.dot(x_even, tl.trans(u_lo), acc_u$precision)
                acc_u = tl.dot(x_odd, tl.trans(u_hi), acc_u$precision)
            b_g = tl.load(gu_bias + gate_rows, mask=n_in, other=0.0).to(tl.float32)
            b_u = tl.load(gu_bias + gate_rows + 1, mask=n_in, other=0.0).to(tl.float32)
            g = (acc_g.to(ELEM).to(tl.float32) + b_g[None, :]).to(ELEM).to(tl.float32)
            u = (acc_u.to(ELEM).to(tl.float32) + b_u[None, :]).to(ELEM).to(tl.float32)
            g = tl.minimum(g, LIMIT)
            u = tl.minimum(tl.maximum(u, -LIMIT), LIMIT)
            sig = (1.0 / (1.0 + tl.exp(-(g * ALPHA).to(ELEM).to(tl.float32)))).to(ELEM).to(tl.float32)
            glu = (g * sig).to(ELEM).to(tl.float32)
            h = (u + 1.0).to(ELEM).to(tl.float32) * glu
            rows = (blk * BLOCK_M + r).to(tl.int64)
            tl.store(act + rows[:, None] * INTER + n[None, :], h.to(ELEM), mask=r_in[:, None] & n_in[None, :])
    elif PHASE == 3:
        # DOWN: act @ down.T + bias for a block of one expert's rows, times each pair's weight.
        blk = tl.program_id(0)
        e = tl.load(block_expert + blk)
        if e >= 0:
            r = tl.arange(0, BLOCK_M)
            r_in = r < tl.load(block_rows + blk)
            pair = tl.load(sorted_slots + blk * BLOCK_M + r, mask=r_in, other=0).to(tl.int64)
            a_rows = act + (blk * BLOCK_M + r).to(tl.int64)[:, None] * INTER
            n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            n_in = n < HIDDEN
            down_rows = e.to(tl.int64) * HIDDEN + n
            j = tl.arange(0, BLOCK_K // 2)
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for k0 in range(0, INTER // 2, BLOCK_K // 2):
                kb = k0 + j
                kb_in = kb < INTER // 2
                a_mask = r_in[:, None] & kb_in[None, :]
                a_even = tl.load(a_rows + (2 * kb)[None, :], mask=a_mask, other=0.0).to(DOT_DTYPE)
                a_odd = tl.load(a_rows + (2 * kb + 1)[None, :], mask=a_mask, other=0.0).to(DOT_DTYPE)
                lo, hi = _mxfp4_tile(dn_blocks, dn_scales, down_rows, kb, n_in, kb_in, INTER // 2)
                acc = tl.dot(a_even, tl.trans(lo), acc$precision)
                acc = tl.dot(a_odd, tl.trans(hi), acc$precision)
            bias = tl.load(dn_bias + down_rows, mask=n_in, other=0.0).to(tl.float32)
            out_rows = (acc.to(ELEM).to(tl.float32) + bias[None, :]).to(ELEM).to(tl.float32)
            w = tl.load(route_w + pair, mask=r_in, other=0.0)
            tl.store(y + pair[:, None] * HIDDEN + n[None, :], (out_rows * w[:, None]).to(ELEM),
                     mask=r_in[:, None] & n_in[None, :])
$combine
'''

_LAUNCHER = '''\
OUTPUT_DTYPES = ($dtype, )


def output_shapes(tensors):
    return [(tensors[0].shape[0], $hidden)]


def _check(tensors):
    tokens = tensors[0].shape[0]
    expected = ((tokens, $hidden), (tokens, $experts), ($experts, 2 * $inter, $hidden // 32, 16),
                ($experts, 2 * $inter, $hidden // 32), ($experts, 2 * $inter), ($experts, $hidden, $inter // 32, 16),
                ($experts, $hidden, $inter // 32), ($experts, $hidden))
    got = tuple(tuple(t.shape) for t in tensors)
    dtypes = tuple(t.dtype for t in tensors)
    packed = (dtypes[2], dtypes[3], dtypes[5], dtypes[6])
    if got != expected or {dtypes[0], dtypes[4], dtypes[7]} != {$dtype} or set(packed) != {torch.uint8}:
        raise ValueError(f"moe_mxfp4 kernel: operands are {got} in {[str(d) for d in dtypes]}, expected {expected}, "
                         "blocks and scales uint8, x and the biases $dtype")


def launch(kernel, tensors, scalars):
    _check(tensors)
    x, logits = tensors[:2]
    weights = [t.contiguous() for t in tensors[2:]]
    n_tokens = x.shape[0]
    out = torch.empty((n_tokens, $hidden), dtype=$dtype, device=x.device)
    if n_tokens == 0:
        return [out]
    plain = SPEC.blocks_of()
    first, second = gemm_blocks(plain, n_tokens)
    n_pairs = n_tokens * $slots
    max_blocks, sorted_slots, block_expert, block_rows, act, y = routed_buffers(x, n_pairs, first.block_m,
                                                                               $experts, $inter, $hidden)
    route_ids = torch.empty((n_tokens, $slots), dtype=torch.int32, device=x.device)
    route_w = torch.empty((n_tokens, $slots), dtype=torch.float32, device=x.device)
    args = (x, logits, *weights, out, route_ids, route_w, sorted_slots, block_expert, block_rows, act, y, n_tokens,
            max_blocks, *x.stride(), *logits.stride())
    route = route_block(plain)
    kernel[(cdiv(n_tokens, route),)](*args, PHASE=$ROUTE, BLOCK_M=route, BLOCK_N=16, BLOCK_K=32,
                                            num_warps=4, enable_fp_fusion=True)
    kernel[(1,)](*args, PHASE=$ALIGN, BLOCK_M=first.block_m, BLOCK_N=16, BLOCK_K=align_chunk(plain), num_warps=8,
                 enable_fp_fusion=True)
    for phase, blocks, columns in (($GATE_UP, first, $inter), ($DOWN, second, $hidden)):
        kernel[(max_blocks, cdiv(columns, blocks.block_n))](
            *args, PHASE=phase, BLOCK_M=blocks.block_m, BLOCK_N=blocks.block_n, BLOCK_K=blocks.block_k,
            num_warps=blocks.num_warps, num_stages=blocks.num_stages, enable_fp_fusion=True)
    combine = min(1024, next_power_of_2($hidden))
    kernel[(n_tokens, cdiv($hidden, combine))](*args, PHASE=$COMBINE, BLOCK_M=16, BLOCK_N=combine,
                                                     BLOCK_K=32, num_warps=4, enable_fp_fusion=True)
    return [out]
'''


def emit_moe_mxfp4_module(spec: MoeMxfp4Spec, name: str, header: str) -> str:
    """The whole kernel file: imports, the spec's constants, the `@triton.jit` kernel (and its two
    decoding helpers) and its launcher. `header` goes first."""
    fields = {
        "name": name,
        "align": ALIGN_PHASE.rstrip("\n"), "combine": WEIGHTED_COMBINE_PHASE.rstrip("\n"),
        "precision": ', input_precision="ieee"' if spec.dtype == torch.float32 else "",
        "dtype": str(spec.dtype),
        "hidden": spec.hidden,
        "inter": spec.intermediate,
        "experts": spec.experts,
        "slots": spec.top_k,
        "ROUTE": ROUTE, "ALIGN": ALIGN, "GATE_UP": GATE_UP, "DOWN": DOWN, "COMBINE": COMBINE,
    }
    p2 = next_power_of_2(spec.experts)
    constants = {
        "ELEM": TL_DTYPE[spec.dtype], "HIDDEN": spec.hidden, "INTER": spec.intermediate, "EXPERTS": spec.experts,
        "E_P2": p2, "ALL_EXPERTS": spec.experts, "ALL_P2": p2, "TOP_K": spec.top_k, "SLOTS": spec.top_k,
        "ALPHA": spec.alpha, "LIMIT": spec.limit,
    }
    lines = [dot_dtype_line(spec.dtype), *(f"{k} = tl.constexpr({v})" for k, v in constants.items()), f"SPEC = {spec!r}"]
    imports = {"ad_mlir.codegen.templates.moe_kernel": ["align_chunk", "gemm_blocks", "route_block", "routed_buffers"],
               "ad_mlir.codegen.templates.moe_mxfp4_kernel": ["MoeMxfp4Spec"]}
    return module_source(header, imports, lines, [Template(_KERNEL).substitute(fields),
                                                  Template(_LAUNCHER).substitute(fields)])


def moe_mxfp4_spec(op: ad.MoeMxfp4Op) -> MoeMxfp4Spec:
    experts, hidden, inter = op.sizes()
    return MoeMxfp4Spec(hidden=hidden, intermediate=inter, experts=experts, top_k=op.top_k.value.data,
                        dtype=torch_dtype(op.input.type), alpha=op.alpha.value.data, limit=op.limit.value.data)


EMITTER = KernelEmitter(lambda op, name, header: emit_moe_mxfp4_module(moe_mxfp4_spec(op), name, header),
                        check=spec_check(moe_mxfp4_spec))
