"""Multi-head latent attention of one flattened batch over a pool of latent pages, the pages
written in place: a kernel template (`ad.paged_mla_attention`).

`emit_paged_mla_attention_module` writes a kernel module with the interface of the region
kernels (a `@triton.jit` function named as asked, `OUTPUT_DTYPES`, `output_shapes`, `launch`).
The launch takes, in the op's operand order, `q_nope [1, H, T, nope]`, `q_rope [1, H, T, rope]`,
`latent [1, 1, T, rank]`, `k_rope [1, 1, T, rope]` (the new tokens of every sequence, flattened;
any strides), `kv_b_weight [H * (nope + v_dim), rank]`, `pages [num_pages, PAGE, rank + rope]`,
`query_starts [seqs + 1]`, `cache_starts [seqs]`, `block_tables [seqs, max_pages]` (int64, on
the device: nothing is read on the host), writes each sequence's new latent ++ k_rope into its
pages at positions `cache_starts[s] ..` and returns `out [1, H, T, v_dim]`, contiguous. Position
p of sequence s is row p % PAGE of page `block_tables[s, p / PAGE]` (PAGE a power of two, a
constexpr: the division is a shift).

It is the MLA template (`mla_attention_kernel`: the up-projection absorbed, the cached latents
one K/V head shared by the query heads, its blocks and online softmax) with the paged template's
row lookup (`cached_attention_kernel`): grid (seqs, cdiv(T * H, BLOCK_M)) (cdiv(H, BLOCK_M) when
T == seqs, a decode-only step: one token each). A program takes BLOCK_M (new token, head) pairs
of one sequence (programs past its tokens x heads do nothing: the grid bounds every sequence by
T, with no host sync) and runs the online softmax first over the sequence's cached positions
[0, start) read from its pages, then over its new tokens causally. Then it writes into the
pages the new tokens whose head 0 is among its pairs, one row at a time (so every new token is
written once): no program reads a position >= its sequence's start, and a page written belongs
to one sequence, so the writes race with no read. sm_90 PTX at DeepSeek-V3's sizes (bf16, pages
of 64): 252 registers, no spills, 75 KiB shared memory (measured).
"""

from __future__ import annotations

import torch

from ad_mlir.codegen.emitters import KernelEmitter, operand_indices
from ad_mlir.codegen.templates.cached_attention_kernel import PAGE_ROWS
from ad_mlir.codegen.templates.mla_attention_kernel import LOG2E, MLA_BLOCK
from ad_mlir.codegen.templates.skeleton import TL_DTYPE, dot_dtype_line, module_source
from ad_mlir.dialects import ad
from ad_mlir.semantics.op_table import torch_dtype

_KERNEL = '''
@triton.jit(do_not_specialize=["n_tokens", "heads"])
def {name}(q_lat, q_rope, latent, k_rope, pages, query_starts, cache_starts, block_tables, o_lat, n_tokens, heads,
        scale_log2, qr_sh, qr_st, qr_sd, l_st, l_sd, kr_st, kr_sd, p_s0, p_s1, p_s2, bt_s0, bt_s1,
        RANK: tl.constexpr, ROPE: tl.constexpr, PAGE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    s = tl.program_id(0).to(tl.int64)
    pid_m = tl.program_id(1)
    first = tl.load(query_starts + s)
    n_new = tl.load(query_starts + s + 1) - first
    if pid_m * BLOCK_M < n_new * heads:
        ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        m_ok = ms < n_new * heads
        ts = ms // heads
        hs = ms % heads
        toks = first + ts  # the queries' rows among the step's tokens
        rs = tl.arange(0, BLOCK_R)
        ps = tl.arange(0, BLOCK_P)
        r_ok = rs < RANK
        p_ok = ps < ROPE
        start = tl.load(cache_starts + s)
        table = block_tables + s * bt_s0
        q_a = tl.load(q_lat + (hs[:, None] * n_tokens + toks[:, None]) * RANK + rs[None, :],
                      mask=m_ok[:, None] & r_ok[None, :], other=0.0)
        q_a = q_a.to({elem}).to(DOT_DTYPE)
        q_b = tl.load(q_rope + hs[:, None] * qr_sh + toks[:, None] * qr_st + ps[None, :] * qr_sd,
                      mask=m_ok[:, None] & p_ok[None, :], other=0.0).to(DOT_DTYPE)
        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_R], tl.float32)
        for j0 in range(0, start, BLOCK_N):
            ns = j0 + tl.arange(0, BLOCK_N)
            n_ok = ns < start
            rows = pages + _page_rows(table, ns, n_ok, bt_s1, p_s0, p_s1, PAGE)
            k_a = tl.load(rows[:, None] + rs[None, :] * p_s2, mask=n_ok[:, None] & r_ok[None, :], other=0.0)
            k_b = tl.load(rows[:, None] + (RANK + ps[None, :]) * p_s2, mask=n_ok[:, None] & p_ok[None, :], other=0.0)
            m_i, l_i, acc = _mla_block(q_a, q_b, k_a, k_b, n_ok[None, :], m_i, l_i, acc, scale_log2)
        for j0 in range(0, n_new, BLOCK_N):
            ns = j0 + tl.arange(0, BLOCK_N)
            n_ok = ns < n_new
            k_a = tl.load(latent + (first + ns[:, None]) * l_st + rs[None, :] * l_sd,
                          mask=n_ok[:, None] & r_ok[None, :], other=0.0)
            k_b = tl.load(k_rope + (first + ns[:, None]) * kr_st + ps[None, :] * kr_sd,
                          mask=n_ok[:, None] & p_ok[None, :], other=0.0)
            seen = n_ok[None, :] & (ns[None, :] <= ts[:, None])
            m_i, l_i, acc = _mla_block(q_a, q_b, k_a, k_b, seen, m_i, l_i, acc, scale_log2)
        out = acc / l_i[:, None]
        tl.store(o_lat + (toks[:, None] * heads + hs[:, None]) * RANK + rs[None, :], out,
                 mask=m_ok[:, None] & r_ok[None, :])
        # The tokens whose head 0 is in this block, written one row at a time: a [BLOCK_N, rank]
        # tile of page-row pointers (64 bits each) beside the attention's spilled at DeepSeek-V3's
        # sizes (sm_90 PTX: 255 registers, 120 bytes).
        for t in range(tl.cdiv(pid_m * BLOCK_M, heads), tl.minimum(tl.cdiv((pid_m + 1) * BLOCK_M, heads), n_new)):
            written = pages + _page_row(table, start + t, bt_s1, p_s0, p_s1, PAGE)
            tl.store(written + rs * p_s2, tl.load(latent + (first + t) * l_st + rs * l_sd, mask=r_ok), mask=r_ok)
            tl.store(written + (RANK + ps) * p_s2, tl.load(k_rope + (first + t) * kr_st + ps * kr_sd, mask=p_ok),
                     mask=p_ok)


@triton.jit
def _page_row(table, pos, bt_s1, p_s0, p_s1, PAGE: tl.constexpr):
    """`_page_rows` (cached_attention_kernel.PAGE_ROWS) of one position."""
    return tl.load(table + (pos // PAGE) * bt_s1) * p_s0 + (pos % PAGE) * p_s1


OUTPUT_DTYPES = ({dtype},)


def output_shapes(tensors):
    q_nope, kv_b_weight = tensors[0], tensors[4]
    return [(*q_nope.shape[:3], kv_b_weight.shape[0] // q_nope.shape[1] - q_nope.shape[3])]


def _check(q_nope, latent, k_rope, kv_b_weight, pages, query_starts, cache_starts, block_tables):
    rank, rope = latent.shape[3], k_rope.shape[3]
    if q_nope.shape[0] != 1 or tuple(pages.shape[1:]) != ({page}, rank + rope) or kv_b_weight.shape[1] != rank \\
            or pages.dtype != latent.dtype:
        raise ValueError(f"paged mla kernel for pages of {page} tokens: q_nope {{tuple(q_nope.shape)}}, latent "
                         f"{{tuple(latent.shape)}}, k_rope {{tuple(k_rope.shape)}}, pages {{pages.dtype}} "
                         f"{{tuple(pages.shape)}}, kv_b_weight {{tuple(kv_b_weight.shape)}} do not fit (one flattened "
                         "batch; pages [num_pages, {page}, rank + rope] of the latent's dtype)")
    seqs = cache_starts.shape[0]
    if tuple(query_starts.shape) != (seqs + 1,) or block_tables.dim() != 2 or block_tables.shape[0] != seqs:
        raise ValueError(f"paged mla kernel: query_starts {{tuple(query_starts.shape)}}, cache_starts "
                         f"{{tuple(cache_starts.shape)}} and block_tables {{tuple(block_tables.shape)}} must be "
                         f"[{{seqs}} + 1], [{{seqs}}] and [{{seqs}}, max_pages]")


def launch(kernel, tensors, scalars):
    q_nope, q_rope, latent, k_rope, kv_b_weight, pages, query_starts, cache_starts, block_tables = tensors
    _check(q_nope, latent, k_rope, kv_b_weight, pages, query_starts, cache_starts, block_tables)
    _, heads, n_tokens, nope = q_nope.shape
    rank, rope = latent.shape[3], k_rope.shape[3]
    seqs = cache_starts.shape[0]
    if n_tokens == 0 or seqs == 0:
        return [torch.empty(output_shapes(tensors)[0], dtype={dtype}, device=q_nope.device)]
    w = kv_b_weight.view(heads, -1, rank)
    q_lat = torch.matmul(q_nope.float(), w[:, :nope].float()).contiguous()
    o_lat = torch.empty((n_tokens, heads, rank), dtype=torch.float32, device=q_nope.device)
    blocks = mla_blocks(rank, rope)
    most = 1 if n_tokens == seqs else n_tokens  # a decode-only step: one token each
    kernel[(seqs, triton.cdiv(most * heads, blocks.block_m))](
        q_lat, q_rope, latent, k_rope, pages, query_starts, cache_starts, block_tables, o_lat, n_tokens, heads,
        SCALE * LOG2E, q_rope.stride(1), q_rope.stride(2), q_rope.stride(3), latent.stride(2), latent.stride(3),
        k_rope.stride(2), k_rope.stride(3), *pages.stride(), *block_tables.stride(), RANK=rank, ROPE=rope,
        PAGE={page}, BLOCK_R=max(16, triton.next_power_of_2(rank)), BLOCK_P=max(16, triton.next_power_of_2(rope)),
        BLOCK_M=blocks.block_m, BLOCK_N=blocks.block_n, num_warps=blocks.num_warps, num_stages=blocks.num_stages,
        enable_fp_fusion=True)
    out = torch.matmul(o_lat.transpose(0, 1), w[:, nope:].float().transpose(1, 2))
    return [out[None].to({dtype})]
'''


def emit_paged_mla_attention_module(dtype: torch.dtype, scale: float, page_size: int, name: str, header: str) -> str:
    """The kernel file for paged MLA with queries, latent and pages of `dtype`, scores scaled by
    `scale`, pages of `page_size` tokens (a power of two)."""
    if page_size < 1 or page_size & (page_size - 1):
        raise ValueError(f"paged mla kernel: page_size {page_size} must be a power of two")
    kernel = (_KERNEL + PAGE_ROWS + MLA_BLOCK).format(name=name, dtype=str(dtype), elem=TL_DTYPE[dtype], page=page_size,
                            precision=', input_precision="ieee"' if dtype == torch.float32 else "")
    constants = [dot_dtype_line(dtype), f"SCALE = {float(scale)!r}", f"LOG2E = {LOG2E!r}"]
    return module_source(header, {"ad_mlir.codegen.templates.mla_attention_kernel": ["mla_blocks"]}, constants, [kernel])


def _emit(op: ad.PagedMlaAttentionOp, name: str, header: str) -> str:
    return emit_paged_mla_attention_module(torch_dtype(op.q_nope.type), op.scale.value.data, op.page_size(), name,
                                           header)


EMITTER = KernelEmitter(_emit, written=lambda op: operand_indices(op, (op.pages,)))
