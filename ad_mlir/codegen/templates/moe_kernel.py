"""Mixture of experts (`ad.moe`): a kernel template of five launches, emitted as Python source.

`emit_moe_module` writes a kernel module with the interface of the region kernels (a
`@triton.jit` function named as asked, `OUTPUT_DTYPES`, `output_shapes`, `launch`). The launch
takes, in the op's operand order, `x [T, H]`, `router_logits [T, E]`, `gate_up [E + S, 2I, H]`,
`down [E + S, H, I]` and, with a shared expert's gate, `shared_gate [T, 1]` (activations through
their strides: the logits may be a slice of a fused router GEMM) and returns `out [T, H]`.

Each token has SLOTS = top_k + S (token, slot) pairs: its top-k routed experts, then the S
shared (virtual) experts. One `@triton.jit` function, five phases (a constexpr), so that every
launch goes through the one kernel object the runtime hands the launcher:

- ROUTE, grid (cdiv(T, BLOCK_M),): BLOCK_M tokens a program. The softmax of the logits in fp32,
  the top k by k rounds of (max, lowest index holding it) as `torch.topk` picks them, divided by
  their sum (in pick order, as HF sums them) when normalizing, rounded to the input dtype when
  asked; the shared slots get `sigmoid(shared_gate)` (or 1). Writes `route_ids`, `route_w`
  [T, SLOTS] (int32, fp32).
- ALIGN, grid (1,): vLLM's `moe_align_block_size` in one program, deterministic. The pairs are
  counted per expert, each expert's rows padded to a multiple of BLOCK_M and laid out expert
  after expert; every GEMM block (BLOCK_M rows) gets its expert and its number of real rows
  (`block_expert`, `block_rows`; blocks past the end get expert -1), and each pair's slot index
  is written at its row (`sorted_slots`), pairs of one expert in slot order. Only experts that
  received pairs get blocks: a decode step of 1 token with top 2 computes 2 blocks, whatever
  the number of experts. The grid of the GEMMs is the static bound cdiv(T * SLOTS, BLOCK_M) +
  min(E + S, T * SLOTS) blocks (shapes depend on T only: a decode step stays CUDA-graph
  capturable), the blocks past the real count return at once. The counting costs
  O(T * SLOTS * (E + S)) comparisons in one program: nothing for decode, a few tens of
  microseconds for a long prefill.
- GATE_UP, grid (blocks, cdiv(I, BLOCK_N)): a block's rows gathered from x (token = slot //
  SLOTS) times its expert's gate and up rows, two accumulators in fp32; the epilogue rounds
  gate and up to the input dtype as HF's GEMMs do, computes `silu(gate)` (rounded) `* up`
  and stores the product, rounded, in `act` at the block's rows (sorted order).
- DOWN, grid (blocks, cdiv(H, BLOCK_N)): `act` rows (contiguous) times the expert's down
  weights, each row stored, rounded to the input dtype, at its (token, slot) row of `y`
  [T * SLOTS, H].
- COMBINE, grid (T, cdiv(H, BLOCK_N)): each token's SLOTS rows of `y` weighted and summed in
  fp32 in slot order (deterministic: no atomics), rounded once into `out`.

Dots take 16-bit operands on the tensor cores (fp32 operands without tf32, so that fp32 agrees
with torch), accumulating in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from string import Template

import torch

from ad_mlir.codegen.emitters import KernelEmitter
from ad_mlir.codegen.launch import cdiv
from ad_mlir.codegen.templates.skeleton import TL_DTYPE, dot_dtype_line, module_source
from ad_mlir.dialects import ad
from ad_mlir.dialects.kernel_forms import next_power_of_2
from ad_mlir.semantics.op_table import torch_dtype

ROUTE, ALIGN, GATE_UP, DOWN, COMBINE = range(5)


@dataclass(frozen=True)
class MoeSpec:
    """What one MoE kernel is specialized for (everything but the token count)."""

    hidden: int
    intermediate: int
    experts: int
    """Routed experts (the router's)."""
    shared_experts: int
    top_k: int
    dtype: torch.dtype
    """Of x, the expert weights and the output (router and gate logits: any float dtype, read
    through their pointers' type)."""
    shared_gate: bool
    """The shared experts' weight is the sigmoid of gate logits (an input), else 1."""
    normalize: bool
    round_weights: bool

    def __post_init__(self) -> None:
        if self.dtype not in TL_DTYPE:
            raise ValueError(f"moe kernel: dtype {self.dtype} is not one of {', '.join(map(str, TL_DTYPE))}")
        if not 1 <= self.top_k <= self.experts:
            raise ValueError(f"moe kernel: top_k {self.top_k} is not in 1..{self.experts}")
        if self.shared_gate and not self.shared_experts:
            raise ValueError("moe kernel: a shared gate without shared experts")

    @property
    def slots(self) -> int:
        return self.top_k + self.shared_experts


@dataclass(frozen=True)
class GemmBlocks:
    block_m: int
    """Rows (token, slot pairs of one expert) per block."""
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def gemm_blocks(spec: MoeSpec, tokens: int) -> tuple[GemmBlocks, GemmBlocks]:
    """The GATE_UP and DOWN launches' blocks for `tokens` tokens. BLOCK_M follows the routed
    experts' average rows (16, the smallest tl.dot, for decode: a block of 1 real row computes
    16); 16-bit dots run on the tensor cores with 64-wide tiles, fp32 dots on the FMA units,
    which hold their operands in registers: smaller tiles (no spills, measured for sm_90 at
    Mixtral and Qwen3-30B-A3B sizes by tests/unit/test_moe_kernel.py)."""
    wide = spec.dtype != torch.float32
    rows = -(-tokens * spec.top_k // spec.experts)
    block_m = max(16, min(64 if wide else 32, next_power_of_2(rows)))

    def tile(n: int, k: int, n_max: int) -> tuple[int, int]:
        k_max = 64 if wide else 32
        return max(16, min(n_max, next_power_of_2(n))), max(16, min(k_max, next_power_of_2(k)))

    n1, k1 = tile(spec.intermediate, spec.hidden, 64 if wide else 32)
    n2, k2 = tile(spec.hidden, spec.intermediate, 128 if wide else 32)
    stages = 3 if wide else 2
    return GemmBlocks(block_m, n1, k1, 4, stages), GemmBlocks(block_m, n2, k2, 4, stages)


def route_block(spec: MoeSpec) -> int:
    """Tokens per ROUTE program: a [tokens, experts] tile of 2048 elements at most (the top-k
    rounds keep a few such tiles live: 4096 spilled at 64 experts)."""
    return max(1, min(64, 2048 // next_power_of_2(spec.experts)))


def align_chunk(spec: MoeSpec) -> int:
    """Pairs per step of ALIGN: a [pairs, experts] compare tile of 4096 elements at most."""
    return max(16, 4096 // next_power_of_2(spec.experts + spec.shared_experts))


ALIGN_PHASE = '''\
        # ALIGN: one program; pairs counted per expert, blocks laid out, pairs placed.
        n_pairs = n_tokens * SLOTS
        experts = tl.arange(0, ALL_P2)
        counts = tl.zeros([ALL_P2], tl.int32)
        for c in range(0, n_pairs, BLOCK_K):
            pair = c + tl.arange(0, BLOCK_K)
            ids = tl.load(route_ids + pair, mask=pair < n_pairs, other=-1)
            counts += tl.sum((ids[:, None] == experts[None, :]).to(tl.int32), 0)
        padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
        ends = tl.cumsum(padded, 0)
        starts = ends - padded
        filled = starts + counts
        for b0 in range(0, max_blocks, BLOCK_K):
            blk = b0 + tl.arange(0, BLOCK_K)
            row0 = blk * BLOCK_M
            # The block's expert: the first whose padded rows end past the block's first row.
            e = tl.sum((ends[None, :] <= row0[:, None]).to(tl.int32), 1)
            used = e < ALL_EXPERTS
            end = tl.sum(tl.where(experts[None, :] == e[:, None], filled[None, :], 0), 1)
            b_in = blk < max_blocks
            tl.store(block_expert + blk, tl.where(used, e, -1), mask=b_in)
            tl.store(block_rows + blk, tl.where(used, tl.minimum(end - row0, BLOCK_M), 0), mask=b_in)
        next_row = starts
        for c in range(0, n_pairs, BLOCK_K):
            pair = c + tl.arange(0, BLOCK_K)
            p_in = pair < n_pairs
            ids = tl.load(route_ids + pair, mask=p_in, other=-1)
            hit = (ids[:, None] == experts[None, :]).to(tl.int32)
            before = tl.cumsum(hit, 0) - hit
            row = tl.sum(hit * (next_row[None, :] + before), 1)
            tl.store(sorted_slots + row, pair, mask=p_in)
            next_row += tl.sum(hit, 0)
'''
"""The ALIGN phase's body (vLLM's `moe_align_block_size`), which the FP8 and MXFP4 MoE kernels
share: it reads `route_ids` [T * SLOTS] and writes `block_expert`, `block_rows`, `sorted_slots`."""


WEIGHTED_COMBINE_PHASE = '''\
    else:
        # COMBINE: a token's weighted slots summed in fp32 in slot order.
        t = tl.program_id(0).to(tl.int64)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_in = n < HIDDEN
        acc = tl.zeros([BLOCK_N], tl.float32)
        for j in range(SLOTS):
            acc += tl.load(y + (t * SLOTS + j) * HIDDEN + n, mask=n_in, other=0.0).to(tl.float32)
        tl.store(out + t * HIDDEN + n, acc.to(ELEM), mask=n_in)
'''
"""The COMBINE phase of the quantized MoE kernels, whose DOWN phase already weighted each slot's
row (`y`): a token's rows summed (the plain kernel weights them here instead)."""


def routed_buffers(x: torch.Tensor, n_pairs: int, block_m: int, experts: int, inter: int,
                   hidden: int) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A launcher's scratch for `n_pairs` (token, slot) pairs in row blocks of `block_m`: the most
    blocks ALIGN can make (one partial block an expert at worst), then `sorted_slots`,
    `block_expert`, `block_rows` (int32), the activations between the GEMMs ([rows, inter]) and
    the slots' outputs `y` ([n_pairs, hidden]), both in `x`'s dtype."""
    max_blocks = cdiv(n_pairs, block_m) + min(experts, n_pairs)
    i32 = {"dtype": torch.int32, "device": x.device}
    return (max_blocks, torch.empty((max_blocks * block_m,), **i32), torch.empty((max_blocks,), **i32),
            torch.empty((max_blocks,), **i32), torch.empty((max_blocks * block_m, inter), dtype=x.dtype, device=x.device),
            torch.empty((n_pairs, hidden), dtype=x.dtype, device=x.device))


_KERNEL = '''\
@triton.jit
def $name(x, logits, gate_up, down, shared_gate, out, route_ids, route_w, sorted_slots, block_expert, block_rows,
        act, y, n_tokens, max_blocks, x_s0, x_s1, l_s0, l_s1, g_s0, gu_s0, gu_s1, gu_s2, dn_s0, dn_s1, dn_s2,
        PHASE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    if PHASE == 0:
        # ROUTE: BLOCK_M tokens; softmax, top k, normalization; the shared slots.
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        r_in = rows < n_tokens
        cols = tl.arange(0, E_P2)
        c_in = cols < EXPERTS
        l = tl.load(logits + rows[:, None] * l_s0 + cols[None, :] * l_s1, mask=r_in[:, None] & c_in[None, :],
                    other=0.0).to(tl.float32)
        l = tl.where(c_in[None, :], l, float("-inf"))
        p = tl.exp(l - tl.max(l, 1)[:, None])
        p = p / tl.sum(p, 1)[:, None]
        scores = tl.where(c_in[None, :], p, -1.0)
        total = tl.full([BLOCK_M], 1.0, tl.float32)
        if NORMALIZE:
            total = tl.zeros([BLOCK_M], tl.float32)
            s = scores
            for j in tl.static_range(TOP_K):
                best = tl.max(s, 1)
                total += best
                pick = tl.min(tl.where(s == best[:, None], cols[None, :], E_P2), 1)
                s = tl.where(cols[None, :] == pick[:, None], -1.0, s)
        s = scores
        for j in tl.static_range(TOP_K):
            best = tl.max(s, 1)
            pick = tl.min(tl.where(s == best[:, None], cols[None, :], E_P2), 1)
            s = tl.where(cols[None, :] == pick[:, None], -1.0, s)
            w = best / total
            if ROUND_WEIGHTS:
                w = w.to(ELEM).to(tl.float32)
            tl.store(route_ids + rows * SLOTS + j, pick, mask=r_in)
            tl.store(route_w + rows * SLOTS + j, w, mask=r_in)
        if SHARED > 0:
            shared = tl.arange(0, S_P2)
            sw = tl.full([BLOCK_M], 1.0, tl.float32)
            if HAS_GATE:
                g = tl.load(shared_gate + rows * g_s0, mask=r_in, other=0.0).to(tl.float32)
                sw = 1.0 / (1.0 + tl.exp(-g))
                if ROUND_WEIGHTS:
                    sw = sw.to(ELEM).to(tl.float32)
            m = r_in[:, None] & (shared < SHARED)[None, :]
            pairs = rows[:, None] * SLOTS + TOP_K + shared[None, :]
            tl.store(route_ids + pairs, shared[None, :] + rows[:, None] * 0 + EXPERTS, mask=m)
            tl.store(route_w + pairs, sw[:, None] + tl.zeros([BLOCK_M, S_P2], tl.float32), mask=m)
    elif PHASE == 1:
$align
    elif PHASE == 2:
        # GATE_UP: silu(x @ gate.T) * (x @ up.T) for a block of one expert's rows.
        blk = tl.program_id(0)
        e = tl.load(block_expert + blk)
        if e >= 0:
            r = tl.arange(0, BLOCK_M)
            r_in = r < tl.load(block_rows + blk)
            pair = tl.load(sorted_slots + blk * BLOCK_M + r, mask=r_in, other=0)
            x_rows = x + (pair // SLOTS).to(tl.int64)[:, None] * x_s0
            n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            n_in = n < INTER
            k = tl.arange(0, BLOCK_K)
            w = gate_up + e.to(tl.int64) * gu_s0
            acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for k0 in range(0, HIDDEN, BLOCK_K):
                kk = k0 + k
                k_in = kk < HIDDEN
                a = tl.load(x_rows + kk[None, :] * x_s1, mask=r_in[:, None] & k_in[None, :], other=0.0).to(DOT_DTYPE)
                w_mask = n_in[:, None] & k_in[None, :]
                wg = tl.load(w + n[:, None] * gu_s1 + kk[None, :] * gu_s2, mask=w_mask, other=0.0)
                wu = tl.load(w + (n + INTER)[:, None] * gu_s1 + kk[None, :] * gu_s2, mask=w_mask, other=0.0)
                acc_g = tl.dot(a, tl.trans(wg.to(DOT_DTYPE)), acc_g$precision)
                acc_u = tl.dot(a, tl.trans(wu.to(DOT_DTYPE)), acc_u$precision)
            g = acc_g.to(ELEM).to(tl.float32)
            silu = (g / (1.0 + tl.exp(-g))).to(ELEM).to(tl.float32)
            h = silu * acc_u.to(ELEM).to(tl.float32)
            rows = (blk * BLOCK_M + r).to(tl.int64)
            tl.store(act + rows[:, None] * INTER + n[None, :], h.to(ELEM), mask=r_in[:, None] & n_in[None, :])
    elif PHASE == 3:
        # DOWN: act @ down.T for a block of one expert's rows, stored at each pair's row of y.
        blk = tl.program_id(0)
        e = tl.load(block_expert + blk)
        if e >= 0:
            r = tl.arange(0, BLOCK_M)
            r_in = r < tl.load(block_rows + blk)
            pair = tl.load(sorted_slots + blk * BLOCK_M + r, mask=r_in, other=0).to(tl.int64)
            a_rows = act + (blk * BLOCK_M + r).to(tl.int64)[:, None] * INTER
            n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            n_in = n < HIDDEN
            k = tl.arange(0, BLOCK_K)
            w = down + e.to(tl.int64) * dn_s0
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for k0 in range(0, INTER, BLOCK_K):
                kk = k0 + k
                k_in = kk < INTER
                a = tl.load(a_rows + kk[None, :], mask=r_in[:, None] & k_in[None, :], other=0.0).to(DOT_DTYPE)
                wd = tl.load(w + n[:, None] * dn_s1 + kk[None, :] * dn_s2, mask=n_in[:, None] & k_in[None, :],
                             other=0.0)
                acc = tl.dot(a, tl.trans(wd.to(DOT_DTYPE)), acc$precision)
            tl.store(y + pair[:, None] * HIDDEN + n[None, :], acc.to(ELEM), mask=r_in[:, None] & n_in[None, :])
    else:
        # COMBINE: a token's slots, weighted, summed in fp32 in slot order.
        t = tl.program_id(0).to(tl.int64)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_in = n < HIDDEN
        acc = tl.zeros([BLOCK_N], tl.float32)
        for j in range(SLOTS):
            w = tl.load(route_w + t * SLOTS + j)
            acc += tl.load(y + (t * SLOTS + j) * HIDDEN + n, mask=n_in, other=0.0).to(tl.float32) * w
        tl.store(out + t * HIDDEN + n, acc.to(ELEM), mask=n_in)
'''

_LAUNCHER = '''\
OUTPUT_DTYPES = ($dtype, )


def output_shapes(tensors):
    return [(tensors[0].shape[0], $hidden)]


def _check(x, logits, gate_up, down):
    tokens = x.shape[0]
    expected = ((tokens, $hidden), (tokens, $experts), ($all_experts, 2 * $inter, $hidden),
                ($all_experts, $hidden, $inter))
    got = tuple(tuple(t.shape) for t in (x, logits, gate_up, down))
    if got != expected or not x.dtype == gate_up.dtype == down.dtype == $dtype:
        raise ValueError(f"moe kernel: x, router logits, gate_up, down are {got} in "
                         f"{[str(t.dtype) for t in (x, gate_up, down)]}, expected {expected} in $dtype")


def launch(kernel, tensors, scalars):
    $unpack
    _check(x, logits, gate_up, down)
    n_tokens = x.shape[0]
    out = torch.empty((n_tokens, $hidden), dtype=$dtype, device=x.device)
    if n_tokens == 0:
        return [out]
    first, second = gemm_blocks(SPEC, n_tokens)
    n_pairs = n_tokens * $slots
    max_blocks, sorted_slots, block_expert, block_rows, act, y = routed_buffers(x, n_pairs, first.block_m,
                                                                               $all_experts, $inter, $hidden)
    route_ids = torch.empty((n_tokens, $slots), dtype=torch.int32, device=x.device)
    route_w = torch.empty((n_tokens, $slots), dtype=torch.float32, device=x.device)
    args = (x, logits, gate_up, down, shared_gate, out, route_ids, route_w, sorted_slots, block_expert, block_rows,
            act, y, n_tokens, max_blocks, *x.stride(), *logits.stride(), shared_gate.stride(0), *gate_up.stride(),
            *down.stride())
    route = route_block(SPEC)
    kernel[(cdiv(n_tokens, route),)](*args, PHASE=$ROUTE, BLOCK_M=route, BLOCK_N=16, BLOCK_K=16,
                                            num_warps=4, enable_fp_fusion=True)
    kernel[(1,)](*args, PHASE=$ALIGN, BLOCK_M=first.block_m, BLOCK_N=16, BLOCK_K=align_chunk(SPEC), num_warps=8,
                 enable_fp_fusion=True)
    for phase, blocks, columns in (($GATE_UP, first, $inter), ($DOWN, second, $hidden)):
        kernel[(max_blocks, cdiv(columns, blocks.block_n))](
            *args, PHASE=phase, BLOCK_M=blocks.block_m, BLOCK_N=blocks.block_n, BLOCK_K=blocks.block_k,
            num_warps=blocks.num_warps, num_stages=blocks.num_stages, enable_fp_fusion=True)
    combine = min(1024, next_power_of_2($hidden))
    kernel[(n_tokens, cdiv($hidden, combine))](*args, PHASE=$COMBINE, BLOCK_M=16, BLOCK_N=combine,
                                                     BLOCK_K=16, num_warps=4, enable_fp_fusion=True)
    return [out]
'''


def emit_moe_module(spec: MoeSpec, name: str, header: str) -> str:
    """The whole kernel file: imports, the spec's constants, the `@triton.jit` kernel and its
    launcher. `header` goes first (the cache's key and provenance comment)."""
    fields = {
        "name": name,
        "align": ALIGN_PHASE.rstrip("\n"),
        "precision": ', input_precision="ieee"' if spec.dtype == torch.float32 else "",
        "dtype": str(spec.dtype),
        "hidden": spec.hidden,
        "inter": spec.intermediate,
        "experts": spec.experts,
        "all_experts": spec.experts + spec.shared_experts,
        "slots": spec.slots,
        # Without a shared gate the kernel takes none: x stands in for it (never read).
        "unpack": "x, logits, gate_up, down, shared_gate = tensors" if spec.shared_gate
                  else "x, logits, gate_up, down = tensors\n    shared_gate = x",
        "ROUTE": ROUTE, "ALIGN": ALIGN, "GATE_UP": GATE_UP, "DOWN": DOWN, "COMBINE": COMBINE,
    }
    constants = {
        "ELEM": TL_DTYPE[spec.dtype], "HIDDEN": spec.hidden, "INTER": spec.intermediate, "EXPERTS": spec.experts,
        "E_P2": next_power_of_2(spec.experts), "SHARED": spec.shared_experts,
        "S_P2": next_power_of_2(max(spec.shared_experts, 1)), "ALL_EXPERTS": spec.experts + spec.shared_experts,
        "ALL_P2": next_power_of_2(spec.experts + spec.shared_experts), "TOP_K": spec.top_k, "SLOTS": spec.slots,
        "NORMALIZE": spec.normalize, "ROUND_WEIGHTS": spec.round_weights, "HAS_GATE": spec.shared_gate,
    }
    lines = [dot_dtype_line(spec.dtype), *(f"{k} = tl.constexpr({v})" for k, v in constants.items()), f"SPEC = {spec!r}"]
    return module_source(header, {"ad_mlir.codegen.templates.moe_kernel": ["MoeSpec", "align_chunk", "gemm_blocks", "route_block",
                                                                    "routed_buffers"]},
                         lines, [Template(_KERNEL).substitute(fields), Template(_LAUNCHER).substitute(fields)])


def moe_spec(op: ad.MoeOp) -> MoeSpec:
    _, inter, hidden = op.gate_up.type.get_shape()
    return MoeSpec(
        hidden=hidden,
        intermediate=inter // 2,
        experts=op.router_logits.type.get_shape()[1],
        shared_experts=op.num_shared,
        top_k=op.top_k.value.data,
        dtype=torch_dtype(op.input.type),
        shared_gate=op.shared_gate is not None,
        normalize=op.normalize is not None,
        round_weights=op.round_weights is not None,
    )


EMITTER = KernelEmitter(lambda op, name, header: emit_moe_module(moe_spec(op), name, header))
