"""Multi-head latent attention over a latent cache, the cache written in place: a kernel template
(`ad.cached_mla_attention`).

`emit_mla_attention_module` writes a kernel module with the interface of the region kernels (a
`@triton.jit` function named as asked, `OUTPUT_DTYPES`, `output_shapes`, `launch`). The launch
takes, in the op's operand order, `q_nope [B, H, S, nope]`, `q_rope [B, H, S, rope]`, `latent
[B, 1, S, rank]`, `k_rope [B, 1, S, rope]` (any strides), `kv_b_weight [H * (nope + v_dim),
rank]`, `cache [slots, max_seq, rank + rope]`, `slots`, `starts [B]` (int64, on the device:
nothing is read on the host), writes each row's new latent ++ k_rope into rows `starts[b] ..` of
slot `slots[b]` and returns `out [B, H, S, v_dim]`, contiguous. Nothing copies the cache.

The up-projection is absorbed, as DeepSeek's inference does, in every phase (decode and prefill
alike): the launch multiplies each query head's nope part into the latent space (`q_lat = q_nope
W_uk[h]`, [B, H, S, rank] in fp32, a batched matmul), the kernel attends over the cached latents
as one K/V head shared by all query heads (scores `q_lat . c + q_rope . k_rope`; output `sum_j
p_j c_j` in the latent space) and the launch projects that output by `W_uv[h]` into the value
head dim. So the keys and values of the heads are never formed: a step reads rank + rope values
per cached token, once per block of query heads.

Grid (B, cdiv(S * H, BLOCK_M)): a program takes BLOCK_M (new token, head) pairs of one row (all
heads of a token side by side) and runs the online softmax (fp32, exp2) first over the slot's
cached positions [0, start) read from the cache, then over the new tokens [0, S) read from the
inputs, causally (new token j is seen by query token i when j <= i). The first program of each
row also writes the new tokens into the cache: no program reads cache rows >= start, so the write
races with no read. The dots take their operands in the input dtype (fp32 with ieee precision),
the scores and the accumulator stay fp32. Prefill is the same absorbed loop (compute-bound on a
GPU at long prompts; expanding K/V for prefill, as DeepSeek does, is not done here); decode has
no split over the cached positions, so one row's cache is read by cdiv(H, BLOCK_M) programs.

With DeepSeek sparse attention's selection (`sparse=True`: the op's `selected` [B, S, k], the
positions each new token attends to, -1 for none) the launch takes `selected` after `starts`
and writes the new latents into the cache (device indexing, no host sync), and the kernel
gathers each token's selected rows (from the cache before `starts[b]`, from `latent`/`k_rope`
after: rows sharing a slot each see their own) instead of walking every position: grid (B * S,
cdiv(H, BLOCK_M)), a program takes one new token and BLOCK_M of its heads and runs the same
online softmax over its k selected positions in blocks of BLOCK_N (a position past the token's
own, or -1, is masked), as FlashMLA's sparse decoding does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ad_mlir.codegen.emitters import KernelEmitter, operand_indices
from ad_mlir.codegen.templates.skeleton import TL_DTYPE, dot_dtype_line, module_source
from ad_mlir.dialects import ad
from ad_mlir.dialects.decompositions import NoKernelForm
from ad_mlir.dialects.kernel_forms import next_power_of_2
from ad_mlir.semantics.op_table import torch_dtype

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class MlaBlocks:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def mla_blocks(rank: int, rope: int) -> MlaBlocks:
    """Blocks by the latent's width: at DeepSeek's rank 512 + rope 64, 32 (token, head) rows
    and 32 keys over 8 warps (a [32, 512] fp32 accumulator is 64 registers a thread; sm_90 PTX:
    226 registers, no spills, 75 KiB shared memory, measured)."""
    width = next_power_of_2(rank) + next_power_of_2(rope)
    if width >= 512:
        return MlaBlocks(32, 32, 8, 2)
    return MlaBlocks(16, 16, 4, 2)


# The module's source: a kernel (dense or sparse), the block both share, the output shapes, its launch.
_DENSE = '''
@triton.jit(do_not_specialize=["seq_len", "heads"])
def {name}(q_lat, q_rope, latent, k_rope, cache, slots, starts, o_lat, seq_len, heads, scale_log2,
        qr_sb, qr_sh, qr_st, qr_sd, l_sb, l_st, l_sd, kr_sb, kr_st, kr_sd, c_ss, c_st, c_sd,
        RANK: tl.constexpr, ROPE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    pid_m = tl.program_id(1)
    ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = ms < seq_len * heads
    ts = ms // heads
    hs = ms % heads
    rs = tl.arange(0, BLOCK_R)
    ps = tl.arange(0, BLOCK_P)
    r_ok = rs < RANK
    p_ok = ps < ROPE
    slot = tl.load(slots + row)
    start = tl.load(starts + row)
    q_rows = (row * heads + hs) * seq_len + ts
    q_a = tl.load(q_lat + q_rows[:, None] * RANK + rs[None, :], mask=m_ok[:, None] & r_ok[None, :], other=0.0)
    q_a = q_a.to({elem}).to(DOT_DTYPE)
    q_b = tl.load(q_rope + row * qr_sb + hs[:, None] * qr_sh + ts[:, None] * qr_st + ps[None, :] * qr_sd,
                  mask=m_ok[:, None] & p_ok[None, :], other=0.0).to(DOT_DTYPE)
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_R], tl.float32)
    slot_rows = cache + slot * c_ss
    for j0 in range(0, start, BLOCK_N):
        ns = j0 + tl.arange(0, BLOCK_N)
        n_ok = ns < start
        k_a = tl.load(slot_rows + ns[:, None] * c_st + rs[None, :] * c_sd, mask=n_ok[:, None] & r_ok[None, :],
                      other=0.0)
        k_b = tl.load(slot_rows + ns[:, None] * c_st + (RANK + ps[None, :]) * c_sd,
                      mask=n_ok[:, None] & p_ok[None, :], other=0.0)
        m_i, l_i, acc = _mla_block(q_a, q_b, k_a, k_b, n_ok[None, :], m_i, l_i, acc, scale_log2)
    for j0 in range(0, seq_len, BLOCK_N):
        ns = j0 + tl.arange(0, BLOCK_N)
        n_ok = ns < seq_len
        k_a = tl.load(latent + row * l_sb + ns[:, None] * l_st + rs[None, :] * l_sd,
                      mask=n_ok[:, None] & r_ok[None, :], other=0.0)
        k_b = tl.load(k_rope + row * kr_sb + ns[:, None] * kr_st + ps[None, :] * kr_sd,
                      mask=n_ok[:, None] & p_ok[None, :], other=0.0)
        if pid_m == 0:
            written = slot_rows + (start + ns[:, None]) * c_st
            tl.store(written + rs[None, :] * c_sd, k_a, mask=n_ok[:, None] & r_ok[None, :])
            tl.store(written + (RANK + ps[None, :]) * c_sd, k_b, mask=n_ok[:, None] & p_ok[None, :])
        seen = n_ok[None, :] & (ns[None, :] <= ts[:, None])
        m_i, l_i, acc = _mla_block(q_a, q_b, k_a, k_b, seen, m_i, l_i, acc, scale_log2)
    out = acc / l_i[:, None]
    tl.store(o_lat + (row * seq_len * heads + ms[:, None]) * RANK + rs[None, :], out,
             mask=m_ok[:, None] & r_ok[None, :])


'''

_SPARSE = '''
@triton.jit(do_not_specialize=["seq_len", "heads", "topk"])
def {name}(q_lat, q_rope, latent, k_rope, cache, slots, starts, selected, o_lat, seq_len, heads, topk, scale_log2,
        qr_sb, qr_sh, qr_st, qr_sd, l_sb, l_st, l_sd, kr_sb, kr_st, kr_sd, c_ss, c_st, c_sd,
        RANK: tl.constexpr, ROPE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    row = token // seq_len
    t = token % seq_len
    hs = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    h_ok = hs < heads
    rs = tl.arange(0, BLOCK_R)
    ps = tl.arange(0, BLOCK_P)
    r_ok = rs < RANK
    p_ok = ps < ROPE
    slot = tl.load(slots + row)
    start = tl.load(starts + row)
    last = start + t
    q_a = tl.load(q_lat + ((row * heads + hs) * seq_len + t)[:, None] * RANK + rs[None, :],
                  mask=h_ok[:, None] & r_ok[None, :], other=0.0)
    q_a = q_a.to({elem}).to(DOT_DTYPE)
    q_b = tl.load(q_rope + row * qr_sb + hs[:, None] * qr_sh + t * qr_st + ps[None, :] * qr_sd,
                  mask=h_ok[:, None] & p_ok[None, :], other=0.0).to(DOT_DTYPE)
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_R], tl.float32)
    slot_rows = cache + slot * c_ss
    for j0 in range(0, topk, BLOCK_N):
        js = j0 + tl.arange(0, BLOCK_N)
        idx = tl.load(selected + token * topk + js, mask=js < topk, other=-1)
        n_ok = (idx >= 0) & (idx <= last)
        cached = n_ok & (idx < start)
        new = n_ok & (idx >= start)
        k_a = tl.load(slot_rows + idx[:, None] * c_st + rs[None, :] * c_sd, mask=cached[:, None] & r_ok[None, :],
                      other=0.0)
        k_a += tl.load(latent + row * l_sb + (idx - start)[:, None] * l_st + rs[None, :] * l_sd,
                       mask=new[:, None] & r_ok[None, :], other=0.0)
        k_b = tl.load(slot_rows + idx[:, None] * c_st + (RANK + ps[None, :]) * c_sd,
                      mask=cached[:, None] & p_ok[None, :], other=0.0)
        k_b += tl.load(k_rope + row * kr_sb + (idx - start)[:, None] * kr_st + ps[None, :] * kr_sd,
                       mask=new[:, None] & p_ok[None, :], other=0.0)
        m_i, l_i, acc = _mla_block(q_a, q_b, k_a, k_b, n_ok[None, :], m_i, l_i, acc, scale_log2)
    out = acc / l_i[:, None]
    tl.store(o_lat + (token * heads + hs[:, None]) * RANK + rs[None, :], out, mask=h_ok[:, None] & r_ok[None, :])


'''

MLA_BLOCK = '''@triton.jit
def _mla_block(q_a, q_b, k_a, k_b, seen, m_i, l_i, acc, scale_log2):
    """One tile of keys into the online softmax: scores against the latent and the rope part,
    the latent itself as the values."""
    k_a = k_a.to(DOT_DTYPE)
    qk = tl.dot(q_a, tl.trans(k_a){precision})
    qk = tl.dot(q_b, tl.trans(k_b.to(DOT_DTYPE)), qk{precision})
    s = tl.where(seen, qk * scale_log2, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = tl.dot(p.to({elem}).to(DOT_DTYPE), k_a, acc * alpha[:, None]{precision})
    return m_new, l_i, acc


'''

_SHAPES = '''OUTPUT_DTYPES = ({dtype},)


def output_shapes(tensors):
    q_nope, kv_b_weight = tensors[0], tensors[4]
    return [(*q_nope.shape[:3], kv_b_weight.shape[0] // q_nope.shape[1] - q_nope.shape[3])]


'''

_DENSE_LAUNCH = '''def launch(kernel, tensors, scalars):
    q_nope, q_rope, latent, k_rope, kv_b_weight, cache, slots, starts = tensors
    batch, heads, seq_len, nope = q_nope.shape
    rank, rope = latent.shape[3], k_rope.shape[3]
    if tuple(cache.shape[2:]) != (rank + rope,) or kv_b_weight.shape[1] != rank:
        raise ValueError(f"mla kernel: latent {{tuple(latent.shape)}}, k_rope {{tuple(k_rope.shape)}}, "
                         f"cache {{tuple(cache.shape)}}, kv_b_weight {{tuple(kv_b_weight.shape)}}")
    w = kv_b_weight.view(heads, -1, rank)
    if batch * seq_len == 0:
        return [torch.empty(output_shapes(tensors)[0], dtype={dtype}, device=q_nope.device)]
    q_lat = torch.matmul(q_nope.float(), w[:, :nope].float()).contiguous()
    o_lat = torch.empty((batch, seq_len, heads, rank), dtype=torch.float32, device=q_nope.device)
    blocks = mla_blocks(rank, rope)
    kernel[(batch, triton.cdiv(seq_len * heads, blocks.block_m))](
        q_lat, q_rope, latent, k_rope, cache, slots, starts, o_lat, seq_len, heads, SCALE * LOG2E,
        *q_rope.stride(), latent.stride(0), latent.stride(2), latent.stride(3), k_rope.stride(0),
        k_rope.stride(2), k_rope.stride(3), *cache.stride(), RANK=rank, ROPE=rope,
        BLOCK_R=max(16, triton.next_power_of_2(rank)), BLOCK_P=max(16, triton.next_power_of_2(rope)),
        BLOCK_M=blocks.block_m, BLOCK_N=blocks.block_n, num_warps=blocks.num_warps, num_stages=blocks.num_stages,
        enable_fp_fusion=True)
    out = torch.matmul(o_lat.transpose(1, 2), w[:, nope:].float().transpose(1, 2))
    return [out.to({dtype})]
'''

_SPARSE_LAUNCH = '''def launch(kernel, tensors, scalars):
    q_nope, q_rope, latent, k_rope, kv_b_weight, cache, slots, starts, selected = tensors
    batch, heads, seq_len, nope = q_nope.shape
    rank, rope = latent.shape[3], k_rope.shape[3]
    if tuple(cache.shape[2:]) != (rank + rope,) or kv_b_weight.shape[1] != rank \
            or tuple(selected.shape[:2]) != (batch, seq_len):
        raise ValueError(f"sparse mla kernel: latent {{tuple(latent.shape)}}, k_rope {{tuple(k_rope.shape)}}, "
                         f"cache {{tuple(cache.shape)}}, kv_b_weight {{tuple(kv_b_weight.shape)}}, "
                         f"selected {{tuple(selected.shape)}}")
    w = kv_b_weight.view(heads, -1, rank)
    if batch * seq_len == 0:
        return [torch.empty(output_shapes(tensors)[0], dtype={dtype}, device=q_nope.device)]
    positions = starts[:, None] + torch.arange(seq_len, device=starts.device)
    cache[slots[:, None], positions] = torch.cat([latent[:, 0], k_rope[:, 0]], dim=-1).to(cache.dtype)
    q_lat = torch.matmul(q_nope.float(), w[:, :nope].float()).contiguous()
    o_lat = torch.empty((batch, seq_len, heads, rank), dtype=torch.float32, device=q_nope.device)
    blocks = mla_blocks(rank, rope)
    topk = selected.shape[2]
    kernel[(batch * seq_len, triton.cdiv(heads, blocks.block_m))](
        q_lat, q_rope, latent, k_rope, cache, slots, starts, selected.contiguous(), o_lat, seq_len, heads, topk,
        SCALE * LOG2E, *q_rope.stride(), latent.stride(0), latent.stride(2), latent.stride(3), k_rope.stride(0),
        k_rope.stride(2), k_rope.stride(3), *cache.stride(), RANK=rank, ROPE=rope,
        BLOCK_R=max(16, triton.next_power_of_2(rank)), BLOCK_P=max(16, triton.next_power_of_2(rope)),
        BLOCK_M=blocks.block_m, BLOCK_N=blocks.block_n, num_warps=blocks.num_warps, num_stages=blocks.num_stages,
        enable_fp_fusion=True)
    out = torch.matmul(o_lat.transpose(1, 2), w[:, nope:].float().transpose(1, 2))
    return [out.to({dtype})]
'''


def emit_mla_attention_module(dtype: torch.dtype, scale: float, name: str, header: str, sparse: bool = False) -> str:
    """The kernel file for MLA with queries, latent and cache of `dtype` and scores scaled by
    `scale`; with `sparse`, over each token's selected positions (module docstring)."""
    parts = (_SPARSE, MLA_BLOCK, _SHAPES, _SPARSE_LAUNCH) if sparse else (_DENSE, MLA_BLOCK, _SHAPES, _DENSE_LAUNCH)
    kernel = "".join(parts).format(name=name, dtype=str(dtype), elem=TL_DTYPE[dtype],
                                   precision=', input_precision="ieee"' if dtype == torch.float32 else "")
    constants = [dot_dtype_line(dtype), f"SCALE = {float(scale)!r}", f"LOG2E = {LOG2E!r}"]
    return module_source(header, {"ad_mlir.codegen.templates.mla_attention_kernel": ["mla_blocks"]}, constants, [kernel])


def _emit(op: ad.CachedMlaAttentionOp, name: str, header: str) -> str:
    return emit_mla_attention_module(torch_dtype(op.q_nope.type), op.scale.value.data, name, header,
                                     sparse=op.selected is not None)


def _check(op: ad.CachedMlaAttentionOp) -> None:
    if op.sinks is not None:
        raise NoKernelForm("the MLA template has no sink logits")


EMITTER = KernelEmitter(_emit, written=lambda op: operand_indices(op, (op.cache,)), check=_check)
