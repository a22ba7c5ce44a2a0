"""Multi-head latent attention over pages of latents, the pages written in place: a kernel
template (`ad.cached_mla_attention`, both its layouts: the slot form's batch rows over one page
each, the paged form's flattened batch over pages through a block table).

`emit_mla_attention_module` writes a kernel module with the interface of the region kernels (a
`@triton.jit` function named as asked, `OUTPUT_DTYPES`, `output_shapes`, `launch`). The launch
takes, in the op's operand order, `q_nope [B, H, S, nope]`, `q_rope [B, H, S, rope]`, `latent
[B, 1, S, rank]`, `k_rope [B, 1, S, rope]` (the new tokens; any strides; batch row s is sequence
s, or, flattened, B = 1 and S = T the step's tokens of every sequence), `kv_b_weight [H * (nope
+ v_dim), rank]`, `cache [pages, PAGE, rank + rope]`, `block_tables [seqs, max_pages]`,
`cache_starts [seqs]`, flattened `query_starts [seqs + 1]` (int64, on the device: nothing is read
on the host), writes each sequence's new latent ++ k_rope into its pages at positions
`cache_starts[s] ..` and returns `out [B, H, S, v_dim]`, contiguous. Position p of sequence s is
row p % PAGE of page `block_tables[s, p / PAGE]` (PAGE, the pool's page size, a constexpr of the
launch: a power of two divides by a shift); a table one page wide (the slot form: a slot is a
page of max_seq tokens) is read once per program (`ONE_PAGE`). Nothing copies the cache.

The up-projection is absorbed, as DeepSeek's inference does, in every phase (decode and prefill
alike): the launch multiplies each query head's nope part into the latent space (`q_lat = q_nope
W_uk[h]`, [B, H, S, rank] in fp32, a batched matmul), the kernel attends over the cached latents
as one K/V head shared by all query heads (scores `q_lat . c + q_rope . k_rope`; output `sum_j
p_j c_j` in the latent space) and the launch projects that output by `W_uv[h]` into the value
head dim. So the keys and values of the heads are never formed: a step reads rank + rope values
per cached token, once per block of query heads.

Grid (seqs, cdiv(S * H, BLOCK_M)) (flattened: cdiv(T * H, BLOCK_M), or cdiv(H, BLOCK_M) when T
== seqs, a decode-only step: one token each). A program takes BLOCK_M (new token, head) pairs of
one sequence (all heads of a token side by side; programs past its tokens x heads do nothing: the
grid bounds every sequence by S or T, with no host sync) and runs the online softmax (fp32, exp2)
first over the sequence's cached positions [0, start) read from its pages, then over its new
tokens read from the inputs, causally (new token j is seen by query token i when j <= i). Then it
writes into the pages the new tokens whose head 0 is among its pairs, one row at a time (so every
new token is written once): no program reads a position >= its sequence's start, and a page
written belongs to one sequence, so the writes race with no read. The dots take their operands
in the input dtype (fp32 with ieee precision), the scores and the accumulator stay fp32. Prefill
is the same absorbed loop (compute-bound on a GPU at long prompts; expanding K/V for prefill, as
DeepSeek does, is not done here); decode has no split over the cached positions, so one
sequence's pages are read by cdiv(H, BLOCK_M) programs.

With DeepSeek sparse attention's selection (`sparse=True`: the op's `selected` [B, S, k], the
positions each new token attends to, -1 for none; batch rows only) the launch takes `selected`
after `cache_starts` and writes the new latents into the pages (device indexing, no host sync),
and the kernel gathers each token's selected rows (from the pages before `cache_starts[b]`, from
`latent`/`k_rope` after: rows sharing a page each see their own) instead of walking every
position: grid (B * S, cdiv(H, BLOCK_M)), a program takes one new token and BLOCK_M of its heads
and runs the same online softmax over its k selected positions in blocks of BLOCK_N (a position
past the token's own, or -1, is masked), as FlashMLA's sparse decoding does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ad_mlir.codegen.emitters import KernelEmitter, operand_indices
from ad_mlir.codegen.templates.cached_attention_kernel import PAGE_ROWS
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
    and 32 keys over 8 warps (a [32, 512] fp32 accumulator is 64 registers a thread; sm_90 PTX,
    bf16: 233 registers in the slot form, 252 over pages of 64, no spills, 75 KiB shared memory,
    measured)."""
    width = next_power_of_2(rank) + next_power_of_2(rope)
    if width >= 512:
        return MlaBlocks(32, 32, 8, 2)
    return MlaBlocks(16, 16, 4, 2)


# The module's source: a kernel (dense or sparse), the helpers both share, the output shapes, its launch.
_DENSE = '''
@triton.jit(do_not_specialize=["n_tokens", "heads"])
def {name}(q_lat, q_rope, latent, k_rope, cache, block_tables, cache_starts, query_starts, o_lat, n_tokens, heads,
        scale_log2, qr_sb, qr_sh, qr_st, qr_sd, l_sb, l_st, l_sd, kr_sb, kr_st, kr_sd, c_s0, c_s1, c_s2, bt_s0, bt_s1,
        RANK: tl.constexpr, ROPE: tl.constexpr, PAGE: tl.constexpr, ONE_PAGE: tl.constexpr, VARLEN: tl.constexpr,
        BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    s = tl.program_id(0).to(tl.int64)
    pid_m = tl.program_id(1)
    if VARLEN:
        b = 0
        first = tl.load(query_starts + s)
        n_new = tl.load(query_starts + s + 1) - first
    else:
        b = s
        first = 0
        n_new = n_tokens
    if pid_m * BLOCK_M < n_new * heads:
        ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        m_ok = ms < n_new * heads
        ts = ms // heads
        hs = ms % heads
        toks = first + ts  # the queries' rows among the sequence's (flattened: the step's) tokens
        rs = tl.arange(0, BLOCK_R)
        ps = tl.arange(0, BLOCK_P)
        r_ok = rs < RANK
        p_ok = ps < ROPE
        start = tl.load(cache_starts + s)
        table = block_tables + s * bt_s0
        base = _pages_base(cache, table, c_s0, ONE_PAGE)
        q_a = tl.load(q_lat + ((b * heads + hs[:, None]) * n_tokens + toks[:, None]) * RANK + rs[None, :],
                      mask=m_ok[:, None] & r_ok[None, :], other=0.0)
        q_a = q_a.to({elem}).to(DOT_DTYPE)
        q_b = tl.load(q_rope + b * qr_sb + hs[:, None] * qr_sh + toks[:, None] * qr_st + ps[None, :] * qr_sd,
                      mask=m_ok[:, None] & p_ok[None, :], other=0.0).to(DOT_DTYPE)
        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_R], tl.float32)
        for j0 in range(0, start, BLOCK_N):
            ns = j0 + tl.arange(0, BLOCK_N)
            n_ok = ns < start
            rows = base + _rows(table, ns, n_ok, bt_s1, c_s0, c_s1, PAGE, ONE_PAGE)
            k_a = tl.load(rows[:, None] + rs[None, :] * c_s2, mask=n_ok[:, None] & r_ok[None, :], other=0.0)
            k_b = tl.load(rows[:, None] + (RANK + ps[None, :]) * c_s2, mask=n_ok[:, None] & p_ok[None, :], other=0.0)
            m_i, l_i, acc = _mla_block(q_a, q_b, k_a, k_b, n_ok[None, :], m_i, l_i, acc, scale_log2)
        for j0 in range(0, n_new, BLOCK_N):
            ns = j0 + tl.arange(0, BLOCK_N)
            n_ok = ns < n_new
            k_a = tl.load(latent + b * l_sb + (first + ns[:, None]) * l_st + rs[None, :] * l_sd,
                          mask=n_ok[:, None] & r_ok[None, :], other=0.0)
            k_b = tl.load(k_rope + b * kr_sb + (first + ns[:, None]) * kr_st + ps[None, :] * kr_sd,
                          mask=n_ok[:, None] & p_ok[None, :], other=0.0)
            seen = n_ok[None, :] & (ns[None, :] <= ts[:, None])
            m_i, l_i, acc = _mla_block(q_a, q_b, k_a, k_b, seen, m_i, l_i, acc, scale_log2)
        out = acc / l_i[:, None]
        tl.store(o_lat + ((b * n_tokens + toks[:, None]) * heads + hs[:, None]) * RANK + rs[None, :], out,
                 mask=m_ok[:, None] & r_ok[None, :])
        # The tokens whose head 0 is in this block, written one row at a time: a [BLOCK_N, rank]
        # tile of page-row pointers (64 bits each) beside the attention's spilled at DeepSeek-V3's
        # sizes (sm_90 PTX: 255 registers, 120 bytes).
        for t in range(tl.cdiv(pid_m * BLOCK_M, heads), tl.minimum(tl.cdiv((pid_m + 1) * BLOCK_M, heads), n_new)):
            written = base + _row(table, start + t, bt_s1, c_s0, c_s1, PAGE, ONE_PAGE)
            tl.store(written + rs * c_s2, tl.load(latent + b * l_sb + (first + t) * l_st + rs * l_sd, mask=r_ok),
                     mask=r_ok)
            tl.store(written + (RANK + ps) * c_s2,
                     tl.load(k_rope + b * kr_sb + (first + t) * kr_st + ps * kr_sd, mask=p_ok), mask=p_ok)


'''

_SPARSE = '''
@triton.jit(do_not_specialize=["seq_len", "heads", "topk"])
def {name}(q_lat, q_rope, latent, k_rope, cache, block_tables, cache_starts, selected, o_lat, seq_len, heads, topk,
        scale_log2, qr_sb, qr_sh, qr_st, qr_sd, l_sb, l_st, l_sd, kr_sb, kr_st, kr_sd, c_s0, c_s1, c_s2, bt_s0, bt_s1,
        RANK: tl.constexpr, ROPE: tl.constexpr, PAGE: tl.constexpr, ONE_PAGE: tl.constexpr, BLOCK_R: tl.constexpr,
        BLOCK_P: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    row = token // seq_len
    t = token % seq_len
    hs = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    h_ok = hs < heads
    rs = tl.arange(0, BLOCK_R)
    ps = tl.arange(0, BLOCK_P)
    r_ok = rs < RANK
    p_ok = ps < ROPE
    start = tl.load(cache_starts + row)
    table = block_tables + row * bt_s0
    base = _pages_base(cache, table, c_s0, ONE_PAGE)
    last = start + t
    q_a = tl.load(q_lat + ((row * heads + hs) * seq_len + t)[:, None] * RANK + rs[None, :],
                  mask=h_ok[:, None] & r_ok[None, :], other=0.0)
    q_a = q_a.to({elem}).to(DOT_DTYPE)
    q_b = tl.load(q_rope + row * qr_sb + hs[:, None] * qr_sh + t * qr_st + ps[None, :] * qr_sd,
                  mask=h_ok[:, None] & p_ok[None, :], other=0.0).to(DOT_DTYPE)
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_R], tl.float32)
    for j0 in range(0, topk, BLOCK_N):
        js = j0 + tl.arange(0, BLOCK_N)
        idx = tl.load(selected + token * topk + js, mask=js < topk, other=-1)
        n_ok = (idx >= 0) & (idx <= last)
        cached = n_ok & (idx < start)
        new = n_ok & (idx >= start)
        rows = base + _rows(table, idx, cached, bt_s1, c_s0, c_s1, PAGE, ONE_PAGE)
        k_a = tl.load(rows[:, None] + rs[None, :] * c_s2, mask=cached[:, None] & r_ok[None, :], other=0.0)
        k_a += tl.load(latent + row * l_sb + (idx - start)[:, None] * l_st + rs[None, :] * l_sd,
                       mask=new[:, None] & r_ok[None, :], other=0.0)
        k_b = tl.load(rows[:, None] + (RANK + ps[None, :]) * c_s2, mask=cached[:, None] & p_ok[None, :], other=0.0)
        k_b += tl.load(k_rope + row * kr_sb + (idx - start)[:, None] * kr_st + ps[None, :] * kr_sd,
                       mask=new[:, None] & p_ok[None, :], other=0.0)
        m_i, l_i, acc = _mla_block(q_a, q_b, k_a, k_b, n_ok[None, :], m_i, l_i, acc, scale_log2)
    out = acc / l_i[:, None]
    tl.store(o_lat + (token * heads + hs[:, None]) * RANK + rs[None, :], out, mask=h_ok[:, None] & r_ok[None, :])


'''

_HELPERS = PAGE_ROWS + '''@triton.jit
def _pages_base(pool, table, p_s0, ONE_PAGE: tl.constexpr):
    """A sequence's pages in `pool`: with ONE_PAGE (a table one page wide: the slot form) its one
    page, the table read once."""
    if ONE_PAGE:
        return pool + tl.load(table) * p_s0
    return pool


@triton.jit
def _rows(table, pos, row_mask, bt_s1, p_s0, p_s1, PAGE: tl.constexpr, ONE_PAGE: tl.constexpr):
    """Offsets of positions `pos` of one sequence from `_pages_base`: through its block table
    row, or with ONE_PAGE in its one page."""
    if ONE_PAGE:
        return pos * p_s1
    return _page_rows(table, pos, row_mask, bt_s1, p_s0, p_s1, PAGE)


@triton.jit
def _row(table, pos, bt_s1, p_s0, p_s1, PAGE: tl.constexpr, ONE_PAGE: tl.constexpr):
    """`_rows` of one position."""
    if ONE_PAGE:
        return pos * p_s1
    return tl.load(table + (pos // PAGE) * bt_s1) * p_s0 + (pos % PAGE) * p_s1


@triton.jit
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


def _check(q_nope, latent, k_rope, kv_b_weight, cache, block_tables, cache_starts, query_starts):
    batch, rank, rope = q_nope.shape[0], latent.shape[3], k_rope.shape[3]
    if cache.dim() != 3 or cache.shape[2] != rank + rope or kv_b_weight.shape[1] != rank or cache.dtype != latent.dtype:
        raise ValueError(f"mla kernel: latent {{tuple(latent.shape)}}, k_rope {{tuple(k_rope.shape)}}, cache "
                         f"{{cache.dtype}} {{tuple(cache.shape)}}, kv_b_weight {{tuple(kv_b_weight.shape)}} do not fit "
                         "(cache [pages, page_size, rank + rope] of the latent's dtype)")
    seqs = cache_starts.shape[0]
    if block_tables.dim() != 2 or block_tables.shape[0] != seqs or cache_starts.dim() != 1:
        raise ValueError(f"mla kernel: cache_starts {{tuple(cache_starts.shape)}} and block_tables "
                         f"{{tuple(block_tables.shape)}} must be [seqs] and [seqs, max_pages]")
    if query_starts is None and seqs != batch:
        raise ValueError(f"mla kernel: cache_starts {{tuple(cache_starts.shape)}} must be [{{batch}}], one per batch row")
    if query_starts is not None and (batch != 1 or tuple(query_starts.shape) != (seqs + 1,)):
        raise ValueError(f"mla kernel: with query_starts {{tuple(query_starts.shape)}}, q_nope "
                         f"{{tuple(q_nope.shape)}} must be one flattened batch and query_starts [{{seqs}} + 1]")


def _strides(q_rope, latent, k_rope, cache, block_tables):
    return (*q_rope.stride(), latent.stride(0), latent.stride(2), latent.stride(3), k_rope.stride(0), k_rope.stride(2),
            k_rope.stride(3), *cache.stride(), *block_tables.stride())


def _blocks(rank, rope, cache, block_tables):
    blocks = mla_blocks(rank, rope)
    # the page size is the pool's; the slot form's table, one page wide, is read once per program
    return dict(RANK=rank, ROPE=rope, PAGE=cache.shape[1], ONE_PAGE=block_tables.shape[1] == 1,
                BLOCK_R=max(16, next_power_of_2(rank)), BLOCK_P=max(16, next_power_of_2(rope)),
                BLOCK_M=blocks.block_m, BLOCK_N=blocks.block_n, num_warps=blocks.num_warps,
                num_stages=blocks.num_stages, enable_fp_fusion=True)


'''

_DENSE_LAUNCH = '''def launch(kernel, tensors, scalars):
    q_nope, q_rope, latent, k_rope, kv_b_weight, cache, block_tables, cache_starts, *flattened = tensors
    query_starts = flattened[0] if flattened else None
    _check(q_nope, latent, k_rope, kv_b_weight, cache, block_tables, cache_starts, query_starts)
    batch, heads, n_tokens, nope = q_nope.shape
    rank, rope = latent.shape[3], k_rope.shape[3]
    seqs = cache_starts.shape[0]
    if batch * n_tokens == 0 or seqs == 0:
        return [torch.empty(output_shapes(tensors)[0], dtype={dtype}, device=q_nope.device)]
    w = kv_b_weight.view(heads, -1, rank)
    q_lat = torch.matmul(q_nope.float(), w[:, :nope].float()).contiguous()
    o_lat = torch.empty((batch, n_tokens, heads, rank), dtype=torch.float32, device=q_nope.device)
    varlen = query_starts is not None
    most = (1 if n_tokens == seqs else n_tokens) if varlen else n_tokens  # a decode-only step: one token each
    blocks = _blocks(rank, rope, cache, block_tables)
    kernel[(seqs, cdiv(most * heads, blocks["BLOCK_M"]))](
        q_lat, q_rope, latent, k_rope, cache, block_tables, cache_starts, query_starts if varlen else cache_starts,
        o_lat, n_tokens, heads, SCALE * LOG2E, *_strides(q_rope, latent, k_rope, cache, block_tables), VARLEN=varlen,
        **blocks)
    out = torch.matmul(o_lat.transpose(1, 2), w[:, nope:].float().transpose(1, 2))
    return [out.to({dtype})]
'''

_SPARSE_LAUNCH = '''def launch(kernel, tensors, scalars):
    q_nope, q_rope, latent, k_rope, kv_b_weight, cache, block_tables, cache_starts, selected = tensors
    _check(q_nope, latent, k_rope, kv_b_weight, cache, block_tables, cache_starts, None)
    batch, heads, seq_len, nope = q_nope.shape
    rank, rope = latent.shape[3], k_rope.shape[3]
    if tuple(selected.shape[:2]) != (batch, seq_len):
        raise ValueError(f"sparse mla kernel: selected {{tuple(selected.shape)}} must be [{{batch}}, {{seq_len}}, k]")
    w = kv_b_weight.view(heads, -1, rank)
    if batch * seq_len == 0:
        return [torch.empty(output_shapes(tensors)[0], dtype={dtype}, device=q_nope.device)]
    page = cache.shape[1]
    positions = cache_starts[:, None] + torch.arange(seq_len, device=cache_starts.device)
    cache[block_tables.gather(1, positions // page), positions % page] = \\
        torch.cat([latent[:, 0], k_rope[:, 0]], dim=-1).to(cache.dtype)
    q_lat = torch.matmul(q_nope.float(), w[:, :nope].float()).contiguous()
    o_lat = torch.empty((batch, seq_len, heads, rank), dtype=torch.float32, device=q_nope.device)
    blocks = _blocks(rank, rope, cache, block_tables)
    topk = selected.shape[2]
    kernel[(batch * seq_len, cdiv(heads, blocks["BLOCK_M"]))](
        q_lat, q_rope, latent, k_rope, cache, block_tables, cache_starts, selected.contiguous(), o_lat, seq_len, heads,
        topk, SCALE * LOG2E, *_strides(q_rope, latent, k_rope, cache, block_tables), **blocks)
    out = torch.matmul(o_lat.transpose(1, 2), w[:, nope:].float().transpose(1, 2))
    return [out.to({dtype})]
'''


def emit_mla_attention_module(dtype: torch.dtype, scale: float, name: str, header: str, sparse: bool = False) -> str:
    """The kernel file for MLA with queries, latent and pages of `dtype` and scores scaled by
    `scale`; with `sparse`, over each token's selected positions (module docstring)."""
    parts = (_SPARSE, _HELPERS, _SHAPES, _SPARSE_LAUNCH) if sparse else (_DENSE, _HELPERS, _SHAPES, _DENSE_LAUNCH)
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
