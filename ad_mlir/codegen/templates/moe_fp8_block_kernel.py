"""MoE experts on fine-grained FP8 weights (`ad.moe_fp8_block`): a kernel template of four
launches, emitted as Python source, in the shape of `moe_kernel.py`'s (whose ALIGN phase it
shares) with `linear_fp8_block_kernel.py`'s arithmetic in its GEMMs.

The launch takes, in the op's operand order, `x [T, H]` (through its strides), `topk_ids [T, k]`
(integers), `topk_weights [T, k]` (any float dtype), the gate/up experts `gate_up` f8e4m3
[E, 2I, H] with `gate_up_scale_inv` f32 [E, 2I / bn, H / bk] and the down experts `down` [E, H, I]
with `down_scale_inv` [E, H / bn, I / bk], and returns `out [T, H]`. The routing is the op's
input: no ROUTE phase. One `@triton.jit` function, four phases (a constexpr):

- ALIGN, grid (1,): `moe_kernel.ALIGN_PHASE` on `topk_ids`: the (token, slot) pairs sorted by
  expert into blocks of BLOCK_M rows, only experts that received pairs getting blocks.
- GATE_UP, grid (blocks, cdiv(I, BLOCK_N)): a block's rows gathered from x times its expert's
  gate rows (n) and up rows (I + n). The K loop steps one K block (bk) at a time: the x tile
  [BLOCK_M, bk] is quantized in registers (`s = max|x| / 448` per row, `x / max(s, 1e-12)` to
  e4m3: the activation's group is the K block), multiplied with each fp8 weight tile by an
  fp8 x fp8 `tl.dot`, the products times `s[:, None] * scale_inv[n / bn, kb][None, :]` added to
  fp32 accumulators (a decode step's tiles transposed: `Fp8Tiles.swap_ab`). The epilogue rounds gate and up to x's dtype (each GEMM's output),
  `silu(gate)` (rounded) `* up`, rounded, stored in `act` at the block's rows (sorted order).
- DOWN, grid (blocks, cdiv(H, BLOCK_N)): `act` rows quantized per group of bk the same way,
  times the expert's down tiles and scales; the result rounded, times the pair's weight
  (rounded to x's dtype), rounded, stored at the pair's row of `y` [T * k, H].
- COMBINE, grid (T, cdiv(H, BLOCK_N)): each token's k rows of `y` summed in fp32 in slot order,
  rounded once into `out`.

H and I are multiples of bk and of bn (the checkpoints': 128), so that no tile is ragged.
"""

from __future__ import annotations

from dataclasses import dataclass
from string import Template

import torch

from ad_mlir.codegen.emitters import KernelEmitter, spec_check
from ad_mlir.codegen.templates.moe_kernel import ALIGN_PHASE, WEIGHTED_COMBINE_PHASE, MoeSpec, gemm_blocks
from ad_mlir.codegen.templates.skeleton import TL_DTYPE, module_source
from ad_mlir.dialects import ad
from ad_mlir.dialects.kernel_forms import next_power_of_2
from ad_mlir.semantics.op_table import torch_dtype
from ad_mlir.zoo import fp8_blocks

ALIGN, GATE_UP, DOWN, COMBINE = range(1, 5)
"""`moe_kernel`'s phase numbers, its ROUTE (0) left out."""
MAX_BLOCK_K = 128
"""The widest K block a program's tiles hold (the activation's group is one tile)."""


@dataclass(frozen=True)
class MoeFp8BlockSpec:
    """What one FP8 MoE kernel is specialized for (everything but the token count)."""

    hidden: int
    intermediate: int
    experts: int
    top_k: int
    block_n: int
    block_k: int
    dtype: torch.dtype
    """Of x and the output (the routing weights: any float dtype, read through their pointer)."""

    def __post_init__(self) -> None:
        if self.dtype not in TL_DTYPE:
            raise ValueError(f"moe_fp8_block kernel: dtype {self.dtype} is not one of "
                             f"{', '.join(map(str, TL_DTYPE))}")
        if not 1 <= self.top_k <= self.experts:
            raise ValueError(f"moe_fp8_block kernel: top_k {self.top_k} is not in 1..{self.experts}")
        if not 16 <= self.block_k <= MAX_BLOCK_K:
            raise ValueError(f"moe_fp8_block kernel: K block {self.block_k} is not in 16..{MAX_BLOCK_K}")
        if any(size % side for size in (self.hidden, self.intermediate) for side in (self.block_n, self.block_k)):
            raise ValueError(f"moe_fp8_block kernel: hidden {self.hidden} and intermediate {self.intermediate} must "
                             f"be multiples of the blocks [{self.block_n}, {self.block_k}]")

    def plain(self) -> MoeSpec:
        """The plain MoE spec of these sizes, whose BLOCK_M choice (`moe_kernel.gemm_blocks`, by
        rows per expert) and ALIGN chunk (`align_chunk`) this kernel takes."""
        return MoeSpec(self.hidden, self.intermediate, self.experts, 0, self.top_k, self.dtype, False, True, False)


@dataclass(frozen=True)
class Fp8Tiles:
    block_m: int
    gate_up_n: int
    down_n: int
    swap_ab: bool
    """A decode step's 16-row blocks computed transposed, `w_tile @ q_tile.T`, so that the weight
    tile is the first operand of Hopper's fp8 MMA (wgmma takes 64 rows and more there; on a 16-row
    x tile Triton falls back to `mma.sync` on fp16 copies), as `linear_fp8_block_kernel`'s
    `TileBlocks.swap_ab`: the same products and scales, in the same order."""
    num_warps: int
    num_stages: int


def fp8_tiles(spec: MoeFp8BlockSpec, tokens: int) -> Fp8Tiles:
    """The GEMM tiles for `tokens` tokens: BLOCK_M as the plain MoE kernel picks it (16 for a
    decode step, up to 64 by rows per expert), BLOCK_K the weight's K block; GATE_UP's BLOCK_N up
    to 64 (two accumulators), DOWN's up to 128, each the largest power of two dividing its
    columns (no ragged tile); 8 warps for 64-row tiles, which hold the fp32 x tile, its
    fp8 copy and the accumulators (no spills at DeepSeek-V3's and Qwen3-30B-A3B's sizes,
    tests/unit/test_moe_fp8_block_kernel.py)."""
    block_m = gemm_blocks(spec.plain(), tokens)[0].block_m
    return Fp8Tiles(block_m, _dividing(spec.intermediate, 64), _dividing(spec.hidden, 128), block_m == 16,
                    8 if block_m >= 64 else 4, 3)


def _dividing(size: int, cap: int) -> int:
    """The largest power of two <= `cap` that divides `size` (a multiple of 16)."""
    return min(cap, size & -size)


_KERNEL = '''\
@triton.jit
def _quantized_groups(rows, r_in, kk, stride):
    # A [BLOCK_M, BK] tile of activations quantized as the format's dynamic scheme: per row
    # s = max|a| / 448, a / max(s, 1e-12) in e4m3. Returns (q, s).
    a = tl.load(rows + kk[None, :] * stride, mask=r_in[:, None], other=0.0).to(tl.float32)
    s = tl.max(tl.abs(a), 1) / FP8_MAX
    return (a / tl.maximum(s, MIN_SCALE)[:, None]).to(tl.float8e4nv), s


@triton.jit
def $name(x, route_ids, topk_w, gate_up, gu_scales, down, dn_scales, out, sorted_slots, block_expert, block_rows,
        act, y, n_tokens, max_blocks, x_s0, x_s1,
        PHASE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        SWAP_AB: tl.constexpr):
    if PHASE == 1:
$align
    elif PHASE == 2:
        # GATE_UP: silu(x @ gate.T) * (x @ up.T) for a block of one expert's rows, block-scaled fp8.
        blk = tl.program_id(0)
        e = tl.load(block_expert + blk)
        if e >= 0:
            r = tl.arange(0, BLOCK_M)
            r_in = r < tl.load(block_rows + blk)
            pair = tl.load(sorted_slots + blk * BLOCK_M + r, mask=r_in, other=0)
            x_rows = x + (pair // SLOTS).to(tl.int64)[:, None] * x_s0
            n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            gate_rows = gate_up + (e.to(tl.int64) * (2 * INTER) + n)[:, None] * HIDDEN
            up_rows = gate_rows + INTER * HIDDEN
            gate_s = gu_scales + (e.to(tl.int64) * (2 * INTER // BN) + n // BN) * (HIDDEN // BK)
            up_s = gate_s + (INTER // BN) * (HIDDEN // BK)
            k = tl.arange(0, BK)
            if SWAP_AB:
                acc_g = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
                acc_u = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
            else:
                acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
                acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for kb in range(HIDDEN // BK):
                kk = kb * BK + k
                q, s = _quantized_groups(x_rows, r_in, kk, x_s1)
                wg = tl.load(gate_rows + kk[None, :])
                wu = tl.load(up_rows + kk[None, :])
                if SWAP_AB:
                    acc_g += tl.dot(wg, tl.trans(q)) * tl.load(gate_s + kb)[:, None] * s[None, :]
                    acc_u += tl.dot(wu, tl.trans(q)) * tl.load(up_s + kb)[:, None] * s[None, :]
                else:
                    acc_g += tl.dot(q, tl.trans(wg)) * s[:, None] * tl.load(gate_s + kb)[None, :]
                    acc_u += tl.dot(q, tl.trans(wu)) * s[:, None] * tl.load(up_s + kb)[None, :]
            if SWAP_AB:
                gate, up = tl.trans(acc_g), tl.trans(acc_u)
            else:
                gate, up = acc_g, acc_u
            g = gate.to(ELEM).to(tl.float32)
            silu = (g / (1.0 + tl.exp(-g))).to(ELEM).to(tl.float32)
            h = silu * up.to(ELEM).to(tl.float32)
            rows = (blk * BLOCK_M + r).to(tl.int64)
            tl.store(act + rows[:, None] * INTER + n[None, :], h.to(ELEM), mask=r_in[:, None])
    elif PHASE == 3:
        # DOWN: act @ down.T for a block of one expert's rows, block-scaled fp8, times each pair's weight.
        blk = tl.program_id(0)
        e = tl.load(block_expert + blk)
        if e >= 0:
            r = tl.arange(0, BLOCK_M)
            r_in = r < tl.load(block_rows + blk)
            pair = tl.load(sorted_slots + blk * BLOCK_M + r, mask=r_in, other=0).to(tl.int64)
            a_rows = act + (blk * BLOCK_M + r).to(tl.int64)[:, None] * INTER
            n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            w_rows = down + (e.to(tl.int64) * HIDDEN + n)[:, None] * INTER
            w_s = dn_scales + (e.to(tl.int64) * (HIDDEN // BN) + n // BN) * (INTER // BK)
            k = tl.arange(0, BK)
            if SWAP_AB:
                acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
            else:
                acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for kb in range(INTER // BK):
                kk = kb * BK + k
                q, s = _quantized_groups(a_rows, r_in, kk, 1)
                wd = tl.load(w_rows + kk[None, :])
                if SWAP_AB:
                    acc += tl.dot(wd, tl.trans(q)) * tl.load(w_s + kb)[:, None] * s[None, :]
                else:
                    acc += tl.dot(q, tl.trans(wd)) * s[:, None] * tl.load(w_s + kb)[None, :]
            if SWAP_AB:
                y_rows = tl.trans(acc)
            else:
                y_rows = acc
            w = tl.load(topk_w + pair, mask=r_in, other=0.0).to(ELEM).to(tl.float32)
            weighted = (y_rows.to(ELEM).to(tl.float32) * w[:, None]).to(ELEM)
            tl.store(y + pair[:, None] * HIDDEN + n[None, :], weighted, mask=r_in[:, None])
$combine
'''

_LAUNCHER = '''\
OUTPUT_DTYPES = ($dtype, )


def output_shapes(tensors):
    return [(tensors[0].shape[0], $hidden)]


def _check(tensors):
    tokens = tensors[0].shape[0]
    expected = ((tokens, $hidden), (tokens, $slots), (tokens, $slots), ($experts, 2 * $inter, $hidden),
                ($experts, 2 * $inter // $bn, $hidden // $bk), ($experts, $hidden, $inter),
                ($experts, $hidden // $bn, $inter // $bk))
    got = tuple(tuple(t.shape) for t in tensors)
    dtypes = tuple(t.dtype for t in tensors)
    if got != expected or dtypes[0] != $dtype or dtypes[1].is_floating_point or not dtypes[2].is_floating_point \\
            or {dtypes[3], dtypes[5]} != {torch.float8_e4m3fn} or {dtypes[4], dtypes[6]} != {torch.float32}:
        raise ValueError(f"moe_fp8_block kernel: operands are {got} in {[str(d) for d in dtypes]}, expected {expected}, "
                         "x $dtype, integer ids, float weights, float8_e4m3fn experts and float32 scales")


def launch(kernel, tensors, scalars):
    _check(tensors)
    x = tensors[0]
    ids, weights, *experts = [t.contiguous() for t in tensors[1:]]
    n_tokens = x.shape[0]
    out = torch.empty((n_tokens, $hidden), dtype=$dtype, device=x.device)
    if n_tokens == 0:
        return [out]
    tiles = fp8_tiles(SPEC, n_tokens)
    n_pairs = n_tokens * $slots
    max_blocks, sorted_slots, block_expert, block_rows, act, y = routed_buffers(x, n_pairs, tiles.block_m,
                                                                               $experts, $inter, $hidden)
    args = (x, ids, weights, *experts, out, sorted_slots, block_expert, block_rows, act, y, n_tokens, max_blocks,
            *x.stride())
    kernel[(1,)](*args, PHASE=$ALIGN, BLOCK_M=tiles.block_m, BLOCK_N=16, BLOCK_K=align_chunk(SPEC.plain()),
                 SWAP_AB=False, num_warps=8, enable_fp_fusion=True)
    for phase, block_n, columns in (($GATE_UP, tiles.gate_up_n, $inter), ($DOWN, tiles.down_n, $hidden)):
        kernel[(max_blocks, cdiv(columns, block_n))](
            *args, PHASE=phase, BLOCK_M=tiles.block_m, BLOCK_N=block_n, BLOCK_K=$bk, SWAP_AB=tiles.swap_ab,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages, enable_fp_fusion=True)
    combine = min(1024, next_power_of_2($hidden))
    kernel[(n_tokens, cdiv($hidden, combine))](*args, PHASE=$COMBINE, BLOCK_M=16, BLOCK_N=combine,
                                                     BLOCK_K=16, SWAP_AB=False, num_warps=4, enable_fp_fusion=True)
    return [out]
'''


def emit_moe_fp8_block_module(spec: MoeFp8BlockSpec, name: str, header: str) -> str:
    """The whole kernel file: imports, the spec's constants, the `@triton.jit` kernel (and its
    quantization helper) and its launcher. `header` goes first."""
    fields = {
        "name": name,
        "align": ALIGN_PHASE.rstrip("\n"), "combine": WEIGHTED_COMBINE_PHASE.rstrip("\n"),
        "dtype": str(spec.dtype),
        "hidden": spec.hidden, "inter": spec.intermediate, "experts": spec.experts, "slots": spec.top_k,
        "bn": spec.block_n, "bk": spec.block_k,
        "ALIGN": ALIGN, "GATE_UP": GATE_UP, "DOWN": DOWN, "COMBINE": COMBINE,
    }
    constants = {
        "ELEM": TL_DTYPE[spec.dtype], "HIDDEN": spec.hidden, "INTER": spec.intermediate, "SLOTS": spec.top_k,
        "ALL_EXPERTS": spec.experts, "ALL_P2": next_power_of_2(spec.experts), "BN": spec.block_n,
        "BK": spec.block_k, "FP8_MAX": fp8_blocks.FP8_MAX, "MIN_SCALE": fp8_blocks.MIN_GROUP_SCALE,
    }
    lines = [*(f"{k} = tl.constexpr({v})" for k, v in constants.items()), f"SPEC = {spec!r}"]
    imports = {"ad_mlir.codegen.templates.moe_kernel": ["align_chunk", "routed_buffers"],
               "ad_mlir.codegen.templates.moe_fp8_block_kernel": ["MoeFp8BlockSpec", "fp8_tiles"]}
    return module_source(header, imports, lines, [Template(_KERNEL).substitute(fields),
                                                  Template(_LAUNCHER).substitute(fields)])


def moe_fp8_block_spec(op: ad.MoeFp8BlockOp) -> MoeFp8BlockSpec:
    experts, hidden, inter = op.sizes()
    bn, bk = op.blocks()
    return MoeFp8BlockSpec(hidden=hidden, intermediate=inter, experts=experts, top_k=op.topk_ids.type.get_shape()[1],
                           block_n=bn, block_k=bk, dtype=torch_dtype(op.input.type))


EMITTER = KernelEmitter(lambda op, name, header: emit_moe_fp8_block_module(moe_fp8_block_spec(op), name, header),
                        check=spec_check(moe_fp8_block_spec))
