"""DeepSeek sparse attention's lightning indexer over a cache of its keys, the cache written in
place: a kernel template (`ad.cached_index_topk`).

`emit_index_topk_module` writes a kernel module with the interface of the region kernels (a
`@triton.jit` function named as asked, `OUTPUT_DTYPES`, `output_shapes`, `launch`). The launch
takes, in the op's operand order, `query [B, S, H, D]`, `key [B, S, D]`, `weights [B, S, H]`
(any strides), `cache [slots, max_seq, D]`, `slots`, `starts [B]` (int64, on the device: nothing
is read on the host), writes each row's new keys into rows `starts[b] ..` of slot `slots[b]`
(device indexing) and returns the int64 positions [B, S, TOPK].

Grid (B * S, cdiv(max_seq, BLOCK_N)): a program scores BLOCK_N positions of the slot for one new
token (those before `starts[b]` read from the cache, the new ones from `key`: rows that share a
slot, as the verifier's prefills do, each see their own keys), all its heads at once: `sum_h w[h] relu(SCALE * q[h] . k_t)`, in fp32 as HF computes it (the
tiles loaded in their dtype and widened, the dot at ieee precision); positions past the token's
own are -inf, and a block wholly past it is only filled with -inf. The launch then takes
`torch.topk` of each token's row of max_seq scores on the device (the row is the whole slot, so
the step's shapes are static) and marks the -inf picks (fewer causal positions than TOPK) -1.
Where scores are equal at the k-th place (relu zeroing every head of several keys) the kernel
may keep another of them than the reference, which takes torch.topk of the causal positions
alone as HF does: either is a top-k (torch.topk leaves ties open, and its choice depends on the
row's length).
"""

from __future__ import annotations

from dataclasses import dataclass

from ad_mlir.codegen.emitters import KernelEmitter, operand_indices
from ad_mlir.codegen.templates.skeleton import module_source
from ad_mlir.dialects import ad


@dataclass(frozen=True)
class IndexBlocks:
    block_n: int
    num_warps: int


def index_blocks(heads: int, dim: int) -> IndexBlocks:
    """Positions per program by the query tile's size: at DeepSeek-V3.2's 64 heads x 128, 32
    positions over 4 warps (a [64, 128] fp32 query tile is 64 registers a thread); smaller
    indexers take 64."""
    return IndexBlocks(32 if heads * dim >= 64 * 128 else 64, 4)


_KERNEL = '''
@triton.jit(do_not_specialize=["seq_len"])
def {name}(query, key, weights, cache, slots, starts, scores, seq_len, max_seq, scale,
        q_sb, q_st, q_sh, q_sd, k_sb, k_st, k_sd, w_sb, w_st, w_sh, c_ss, c_st, c_sd,
        HEADS: tl.constexpr, DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
        BLOCK_N: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    row = token // seq_len
    t = token % seq_len
    ns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    start = tl.load(starts + row)
    last = start + t
    index = tl.full([BLOCK_N], float("-inf"), tl.float32)
    if tl.program_id(1) * BLOCK_N <= last:
        hs = tl.arange(0, BLOCK_M)
        ds = tl.arange(0, BLOCK_D)
        h_ok = hs < HEADS
        d_ok = ds < DIM
        seen = ns <= last
        slot = tl.load(slots + row)
        q = tl.load(query + row * q_sb + t * q_st + hs[:, None] * q_sh + ds[None, :] * q_sd,
                    mask=h_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        cached = seen & (ns < start)
        new = seen & (ns >= start)
        k = tl.load(cache + slot * c_ss + ns[:, None] * c_st + ds[None, :] * c_sd,
                    mask=cached[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        k += tl.load(key + row * k_sb + (ns - start)[:, None] * k_st + ds[None, :] * k_sd,
                     mask=new[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        w = tl.load(weights + row * w_sb + t * w_st + hs * w_sh, mask=h_ok, other=0.0).to(tl.float32)
        s = tl.maximum(tl.dot(q, tl.trans(k), input_precision="ieee") * scale, 0.0)
        index = tl.where(seen, tl.sum(w[:, None] * s, axis=0), float("-inf"))
    tl.store(scores + token * max_seq + ns, index, mask=ns < max_seq)


OUTPUT_DTYPES = (torch.int64,)


def output_shapes(tensors):
    query = tensors[0]
    return [(*query.shape[:2], TOPK)]


def launch(kernel, tensors, scalars):
    query, key, weights, cache, slots, starts = tensors
    batch, seq_len, heads, dim = query.shape
    max_seq = cache.shape[1]
    if tuple(key.shape) != (batch, seq_len, dim) or tuple(cache.shape[2:]) != (dim,) \\
            or tuple(weights.shape) != (batch, seq_len, heads):
        raise ValueError(f"index top-k kernel: query {{tuple(query.shape)}}, key {{tuple(key.shape)}}, weights "
                         f"{{tuple(weights.shape)}}, cache {{tuple(cache.shape)}}")
    chosen = torch.full((batch, seq_len, TOPK), -1, dtype=torch.int64, device=query.device)
    if batch * seq_len == 0:
        return [chosen]
    positions = starts[:, None] + torch.arange(seq_len, device=starts.device)
    cache[slots[:, None], positions] = key.to(cache.dtype)
    scores = torch.empty((batch, seq_len, max_seq), dtype=torch.float32, device=query.device)
    blocks = index_blocks(heads, dim)
    kernel[(batch * seq_len, cdiv(max_seq, blocks.block_n))](
        query, key, weights, cache, slots, starts, scores, seq_len, max_seq, SCALE, *query.stride(), *key.stride(),
        *weights.stride(), *cache.stride(), HEADS=heads, DIM=dim, BLOCK_M=max(16, next_power_of_2(heads)),
        BLOCK_D=max(16, next_power_of_2(dim)), BLOCK_N=blocks.block_n, num_warps=blocks.num_warps)
    best = scores.topk(min(TOPK, max_seq), dim=-1)
    chosen[..., :best.indices.shape[-1]] = best.indices.masked_fill(best.values == float("-inf"), -1)
    return [chosen]
'''


def emit_index_topk_module(scale: float, topk: int, name: str, header: str) -> str:
    """The kernel file for an indexer whose head scores are scaled by `scale` before the relu and
    that keeps `topk` positions."""
    constants = [f"SCALE = {float(scale)!r}", f"TOPK = {int(topk)}"]
    return module_source(header, {"ad_mlir.codegen.templates.index_topk_kernel": ["index_blocks"]}, constants,
                         [_KERNEL.format(name=name)])


def _emit(op: ad.CachedIndexTopkOp, name: str, header: str) -> str:
    return emit_index_topk_module(op.scale.value.data, op.topk.value.data, name, header)


EMITTER = KernelEmitter(_emit, written=lambda op: operand_indices(op, (op.cache,)))
