"""Attention of one flattened batch over K/V pages, the pages written in place: a kernel
template (`ad.paged_attention`).

`emit_paged_attention_module` writes a kernel module with the interface of the region kernels
(a `@triton.jit` function named as asked, `OUTPUT_DTYPES`, `output_shapes`, `launch`). The
launch takes, in the op's operand order, `q [1, Hq, T, D]`, `k [1, Hkv, T, D]`, `v [1, Hkv, T,
Dv]` (the new tokens of every sequence, flattened; any strides), with RoPE `cos`, `sin [1, T,
rotary_dim]`, with QK-norm `q_norm`, `k_norm [D]`, then `k_pages [pages, PAGE, Hkv, D]`,
`v_pages [pages, PAGE, Hkv, Dv]`, `query_starts [seqs + 1]`, `cache_starts [seqs]`,
`block_tables [seqs, max_pages]` (int64, on the device: nothing is read on the host), with
sinks `sinks [Hq]`, with ALiBi `alibi [Hq]`, with a distance bias `distance_bias [1, Hq, T,
extent]` (any strides); writes each sequence's new keys (after QK-norm and
RoPE) and values into its pages at positions `cache_starts[s] ..` and returns `out [1, Hq, T,
Dv]`, contiguous. Position p of sequence s is row p % PAGE of page `block_tables[s, p / PAGE]`
(PAGE a power of two, a constexpr: the division is a shift).

The phases are the cached-attention template's (`cached_attention_kernel`: its helpers, scores,
online softmax, sinks, ALiBi, distance bias, soft cap, window and head pieces), with the cache rows of a
position looked up through the block table:

- PREFILL (some sequence brings more than one token; variable length): grid (seqs * Hq,
  cdiv(T, BLOCK_M)). A program takes BLOCK_M new queries of one head of one sequence (programs
  past the sequence's new tokens do nothing: the grid bounds every sequence by T, with no host
  sync) and runs the online softmax over the sequence's cached positions [0, start) read from
  its pages, then over its new keys causally. The programs of a K/V head's first query head
  write their block's new keys and values into the pages: no program reads a position >= its
  sequence's start, and a page written belongs to one sequence, so the writes race with no read.
- DECODE (T == seqs: one new token each): split-K flash decoding as the cached template's, grid
  (seqs * Hkv, splits), the splits over the block table's positions (max_pages * PAGE: static
  for a fixed table width); split 0 writes the new key and value. REDUCE merges the splits.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from string import Template

import torch

from ad_mlir.codegen.emitters import KernelEmitter, operand_indices, spec_check
from ad_mlir.codegen.templates.attention_kernel import (
    _ROPE_HELPER,
    _SOFTCAP_HELPER,
    AttentionBlocks,
    qk_norm_helper,
)
from ad_mlir.codegen.templates.cached_attention_kernel import (
    _HELPERS,
    DECODE,
    PREFILL,
    REDUCE,
    CachedAttentionSpec,
    decode_block_n,
    decode_warps,
    prefill_blocks,
    spec_fields,
)
from ad_mlir.codegen.templates.skeleton import TL_DTYPE, dot_dtype_line, module_source
from ad_mlir.dialects import ad
from ad_mlir.dialects.kernel_forms import padded_width


@dataclass(frozen=True)
class PagedAttentionSpec(CachedAttentionSpec):
    """What one paged-attention kernel is specialized for: the cached kernel's and the page size."""

    page_size: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.page_size < 1 or self.page_size & (self.page_size - 1):
            raise ValueError(f"paged attention kernel: page_size {self.page_size} must be a power of two")


def paged_prefill_blocks(width: int, dtype: torch.dtype, tokens: int, qk_norm: bool = False,
                         distance_bias: bool = False) -> AttentionBlocks:
    """The cached template's prefill blocks (`prefill_blocks`), on twice the warps in fp32: the
    page lookups' 64-bit offsets on top of its tiles spilled fp32 heads of 128 at 4 warps."""
    blocks = prefill_blocks(width, dtype, tokens, qk_norm, distance_bias)
    if dtype != torch.float32:
        return blocks
    return dataclasses.replace(blocks, num_warps=blocks.num_warps * 2)


PAGE_ROWS = '''\
@triton.jit
def _page_rows(table, pos, row_mask, bt_s1, p_s0, p_s1, PAGE: tl.constexpr):
    """Offsets of positions `pos` of one sequence in a pool [pages, PAGE, ...] (strides p_s0,
    p_s1), through the sequence's block table row."""
    page = tl.load(table + (pos // PAGE) * bt_s1, mask=row_mask, other=0)
    return page * p_s0 + (pos % PAGE) * p_s1


'''
"""The block-table lookup every paged kernel uses (no template fields: it joins any template)."""

_KERNEL = PAGE_ROWS + '''\
@triton.jit
def $name(q, k, v, cos, sin, q_norm, k_norm, sinks, alibi, dist_bias, k_pages, v_pages, query_starts, cache_starts,
        block_tables, out, part_o, part_ml, n_tokens, n_heads, kv_group, n_splits, split_size,
        q_sh, q_ss, q_sd, k_sh, k_ss, k_sd, v_sh, v_ss, v_sd, cos_ss, cos_sd, sin_ss, sin_sd, qn_sd, kn_sd,
        kp_s0, kp_s1, kp_s2, kp_s3, vp_s0, vp_s1, vp_s2, vp_s3, bt_s0, bt_s1, db_sh, db_ss, db_sd,
        PHASE: tl.constexpr, PAGE: tl.constexpr, V_DIM: tl.constexpr, V_P: tl.constexpr, HALF: tl.constexpr,
        HALF_P: tl.constexpr, REST: tl.constexpr, REST_P: tl.constexpr, TAIL: tl.constexpr, TAIL_P: tl.constexpr,
        ROPE: tl.constexpr,
        INTERLEAVED: tl.constexpr, NORM: tl.constexpr, SCALE: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
        SINKS: tl.constexpr, ALIBI: tl.constexpr, EXTENT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr):
    dims = tl.arange(0, V_P)  # of a value / output row (Q and K are held as pieces)
    d_in = dims < V_DIM
    keys = tl.arange(0, BLOCK_N)
    if PHASE == 2:
        # REDUCE: one (sequence, head); its splits' partials, merged into the sequence's token row.
        sh = tl.program_id(0).to(tl.int64)
        t = tl.load(query_starts + sh // n_heads)
        sp = tl.arange(0, SPLITS)
        s_in = sp < n_splits
        part = sh * n_splits + sp
        m = tl.load(part_ml + part * 2, mask=s_in, other=float("-inf"))
        l = tl.load(part_ml + part * 2 + 1, mask=s_in, other=0.0)
        # Position `start` is in every sequence's range: some split is not empty, m_max is finite.
        m_max = tl.max(m, 0)
        if SINKS:
            sink = tl.load(sinks + sh % n_heads).to(tl.float32) * LOG2E
            m_max = tl.maximum(m_max, sink)
        w = tl.exp2(m - m_max)
        o = tl.load(part_o + part[:, None] * V_DIM + dims[None, :], mask=s_in[:, None] & d_in[None, :], other=0.0)
        denominator = tl.sum(l * w, 0)
        if SINKS:
            denominator += tl.exp2(sink - m_max)
        result = tl.sum(o * w[:, None], 0) / denominator
        tl.store(out + ((sh % n_heads) * n_tokens + t) * V_DIM + dims, result.to($elem), mask=d_in)
    elif PHASE == 1:
        # DECODE: every query head of one K/V head of one sequence, one split of the positions [0, start].
        n_kv = n_heads // kv_group
        s = (tl.program_id(0) // n_kv).to(tl.int64)
        kvh = (tl.program_id(0) % n_kv).to(tl.int64)
        split = tl.program_id(1)
        t = tl.load(query_starts + s)
        start = tl.load(cache_starts + s)
        table = block_tables + s * bt_s0
        rows = tl.arange(0, BLOCK_M)
        r_in = rows < kv_group
        heads = kvh * kv_group + rows
        at_token = rows * 0  # every row reads the new token's cos/sin row
        slope = tl.load(alibi + heads, mask=r_in, other=0.0).to(tl.float32) if ALIBI else 0.0
        bias_rows = dist_bias + heads * db_sh + t * db_ss  # the new token's vector of each head
        q_a, q_b, q_p, q_t = _new_rows(q + t * q_ss, heads * q_sh, q_sd, q_norm, qn_sd, cos + t * cos_ss, at_token,
                                       cos_sd, sin + t * sin_ss, at_token, sin_sd, r_in,
                                       HALF, HALF_P, REST, REST_P, TAIL, TAIL_P, ROPE, INTERLEAVED, NORM)
        q_a, q_b, q_p, q_t = _scaled(q_a, SCALE), _scaled(q_b, SCALE), _scaled(q_p, SCALE), _scaled(q_t, SCALE)
        one = tl.arange(0, 1)
        new_k_a, new_k_b, new_k_p, new_k_t = _new_rows(k + t * k_ss + kvh * k_sh, one, k_sd, k_norm, kn_sd,
                                                       cos + t * cos_ss, one, cos_sd, sin + t * sin_ss, one, sin_sd,
                                                       one == 0, HALF, HALF_P, REST, REST_P, TAIL, TAIL_P, ROPE,
                                                       INTERLEAVED, NORM)
        new_v = tl.load(v + t * v_ss + kvh * v_sh + dims[None, :] * v_sd, mask=d_in[None, :], other=0)
        kp_head = k_pages + kvh * kp_s2
        vp_head = v_pages + kvh * vp_s2
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, V_P], tl.float32)
        lo = split * split_size
        hi = tl.minimum(lo + split_size, start + 1)
        if WINDOW > 0:
            lo = tl.maximum(lo, start - WINDOW + 1)
        for n0 in range(lo, hi, BLOCK_N):
            n_pos = n0 + keys
            n_in = n_pos < hi
            cached = n_in & (n_pos < start)
            k_rows = _page_rows(table, n_pos, cached, bt_s1, kp_s0, kp_s1, PAGE)
            k_a, k_b, k_p, k_t = _new_rows(kp_head, k_rows, kp_s3, kp_head, 0, kp_head, n_pos, 0,
                                           kp_head, n_pos, 0, cached, HALF, HALF_P, REST, REST_P, TAIL, TAIL_P,
                                           False, INTERLEAVED, False)
            v_rows = _page_rows(table, n_pos, cached, bt_s1, vp_s0, vp_s1, PAGE)
            v_tile = tl.load(vp_head + v_rows[:, None] + dims[None, :] * vp_s3,
                             mask=cached[:, None] & d_in[None, :], other=0)
            is_new = (n_pos == start)[:, None]
            k_a = tl.where(is_new, new_k_a, k_a)
            k_b = tl.where(is_new, new_k_b, k_b)
            k_p = tl.where(is_new, new_k_p, k_p)
            k_t = tl.where(is_new, new_k_t, k_t)
            v_tile = tl.where(is_new, new_v, v_tile)
            qk = _scores(q_a, q_b, q_p, q_t, k_a, k_b, k_p, k_t, n_in[None, :], slope, n_pos[None, :] - start,
                         bias_rows, r_in, db_sd, SOFTCAP, ALIBI, EXTENT, REST, TAIL)
            m_i, l_i, acc = _softmax_step(qk, v_tile, m_i, l_i, acc)
        part = (s * n_heads + heads) * n_splits + split
        tl.store(part_o + part[:, None] * V_DIM + dims[None, :], acc, mask=r_in[:, None] & d_in[None, :])
        tl.store(part_ml + part * 2, m_i, mask=r_in)
        tl.store(part_ml + part * 2 + 1, l_i, mask=r_in)
        if split == 0:
            at = start + one
            _store_pieces(kp_head, _page_rows(table, at, one == 0, bt_s1, kp_s0, kp_s1, PAGE), kp_s3,
                          new_k_a, new_k_b, new_k_p, new_k_t, one == 0,
                          HALF, HALF_P, REST, REST_P, TAIL, TAIL_P, INTERLEAVED)
            v_at = _page_rows(table, at, one == 0, bt_s1, vp_s0, vp_s1, PAGE)
            tl.store(vp_head + v_at[:, None] + dims[None, :] * vp_s3, new_v, mask=d_in[None, :])
    else:
        # PREFILL: BLOCK_M new queries of one head of one sequence; its cached keys, then its new ones.
        sh = tl.program_id(0)
        s = (sh // n_heads).to(tl.int64)
        h = (sh % n_heads).to(tl.int64)
        kvh = h // kv_group
        first = tl.load(query_starts + s)
        n_new = tl.load(query_starts + s + 1) - first
        start_m = tl.program_id(1) * BLOCK_M
        if start_m < n_new:
            start = tl.load(cache_starts + s)
            table = block_tables + s * bt_s0
            rows = tl.arange(0, BLOCK_M)
            m_pos = start_m + rows
            m_in = m_pos < n_new
            m_tok = first + m_pos  # the queries' rows among the step's tokens
            slope = tl.zeros([BLOCK_M], tl.float32) + tl.load(alibi + h).to(tl.float32) if ALIBI else 0.0
            bias_rows = dist_bias + h * db_sh + m_tok * db_ss
            q_a, q_b, q_p, q_t = _new_rows(q + h * q_sh, m_tok * q_ss, q_sd, q_norm, qn_sd, cos, m_tok * cos_ss,
                                           cos_sd, sin, m_tok * sin_ss, sin_sd, m_in,
                                           HALF, HALF_P, REST, REST_P, TAIL, TAIL_P, ROPE, INTERLEAVED, NORM)
            q_a, q_b, q_p, q_t = _scaled(q_a, SCALE), _scaled(q_b, SCALE), _scaled(q_p, SCALE), _scaled(q_t, SCALE)
            kp_head = k_pages + kvh * kp_s2
            vp_head = v_pages + kvh * vp_s2
            k_new = k + kvh * k_sh
            v_new = v + kvh * v_sh
            if SINKS:
                # The online softmax starts from the sink's term: max = sink, sum = exp(sink - max) = 1.
                m_i = tl.zeros([BLOCK_M], tl.float32) + tl.load(sinks + h).to(tl.float32) * LOG2E
                l_i = tl.full([BLOCK_M], 1.0, tl.float32)
            else:
                m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
                l_i = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([BLOCK_M, V_P], tl.float32)
            lo = 0
            if WINDOW > 0:
                lo = tl.maximum(lo, start + start_m - WINDOW + 1)
            for n0 in range(lo, start, BLOCK_N):
                n_pos = n0 + keys
                n_in = n_pos < start
                page = tl.load(table + (n_pos // PAGE) * bt_s1, mask=n_in, other=0)
                in_page = n_pos % PAGE
                k_a, k_b, k_p, k_t = _new_rows(kp_head, page * kp_s0 + in_page * kp_s1, kp_s3, kp_head, 0, kp_head,
                                               n_pos, 0, kp_head, n_pos, 0, n_in, HALF, HALF_P, REST, REST_P, TAIL,
                                               TAIL_P, False, INTERLEAVED, False)
                visible = n_in[None, :]
                if WINDOW > 0:
                    visible = visible & (n_pos[None, :] > start + m_pos[:, None] - WINDOW)
                qk = _scores(q_a, q_b, q_p, q_t, k_a, k_b, k_p, k_t, visible, slope,
                             n_pos[None, :] - (start + m_pos[:, None]), bias_rows, m_in, db_sd, SOFTCAP, ALIBI, EXTENT,
                             REST, TAIL)
                # the tile's page ids, looked up once for K and V; V loaded once the K pieces are dead
                v_tile = tl.load(vp_head + (page * vp_s0 + in_page * vp_s1)[:, None] + dims[None, :] * vp_s3,
                                 mask=n_in[:, None] & d_in[None, :], other=0)
                m_i, l_i, acc = _softmax_step(qk, v_tile, m_i, l_i, acc)
            lo = 0
            if WINDOW > 0:
                lo = tl.maximum(lo, start_m - WINDOW + 1)
            # New keys past this block's last query are masked for every row: not visited.
            for n0 in range(lo, tl.minimum(n_new, start_m + BLOCK_M), BLOCK_N):
                n_pos = n0 + keys
                n_in = n_pos < n_new
                n_tok = first + n_pos
                k_a, k_b, k_p, k_t = _new_rows(k_new, n_tok * k_ss, k_sd, k_norm, kn_sd, cos, n_tok * cos_ss, cos_sd,
                                               sin, n_tok * sin_ss, sin_sd, n_in,
                                               HALF, HALF_P, REST, REST_P, TAIL, TAIL_P, ROPE, INTERLEAVED, NORM)
                v_tile = tl.load(v_new + n_tok[:, None] * v_ss + dims[None, :] * v_sd,
                                 mask=n_in[:, None] & d_in[None, :], other=0)
                visible = n_in[None, :] & (n_pos[None, :] <= m_pos[:, None])
                if WINDOW > 0:
                    visible = visible & (n_pos[None, :] > m_pos[:, None] - WINDOW)
                qk = _scores(q_a, q_b, q_p, q_t, k_a, k_b, k_p, k_t, visible, slope, n_pos[None, :] - m_pos[:, None],
                             bias_rows, m_in, db_sd, SOFTCAP, ALIBI, EXTENT, REST, TAIL)
                m_i, l_i, acc = _softmax_step(qk, v_tile, m_i, l_i, acc)
            # Every query sees its own key: l_i > 0 on every row in range.
            out_tile = acc / tl.where(m_in, l_i, 1.0)[:, None]
            out_rows = (h * n_tokens + m_tok) * V_DIM
            tl.store(out + out_rows[:, None] + dims[None, :], out_tile.to($elem), mask=m_in[:, None] & d_in[None, :])
            if h % kv_group == 0:
                k_a, k_b, k_p, k_t = _new_rows(k_new, m_tok * k_ss, k_sd, k_norm, kn_sd, cos, m_tok * cos_ss, cos_sd,
                                               sin, m_tok * sin_ss, sin_sd, m_in,
                                               HALF, HALF_P, REST, REST_P, TAIL, TAIL_P, ROPE, INTERLEAVED, NORM)
                _store_pieces(kp_head, _page_rows(table, start + m_pos, m_in, bt_s1, kp_s0, kp_s1, PAGE), kp_s3,
                              k_a, k_b, k_p, k_t, m_in, HALF, HALF_P, REST, REST_P, TAIL, TAIL_P, INTERLEAVED)
                v_rows = tl.load(v_new + m_tok[:, None] * v_ss + dims[None, :] * v_sd,
                                 mask=m_in[:, None] & d_in[None, :], other=0)
                v_at = _page_rows(table, start + m_pos, m_in, bt_s1, vp_s0, vp_s1, PAGE)
                tl.store(vp_head + v_at[:, None] + dims[None, :] * vp_s3, v_rows, mask=m_in[:, None] & d_in[None, :])
'''

_LAUNCHER = '''\
OUTPUT_DTYPES = ($dtype, )
SPEC = dict(PAGE=$page, V_DIM=$v_dim, V_P=$v_p, $pieces, ROPE=$rope, INTERLEAVED=$interleaved, NORM=$norm,
            SCALE=$scale, WINDOW=$window, SOFTCAP=$softcap, SINKS=$sinks, ALIBI=$alibi, EXTENT=$extent)


def output_shapes(tensors):
    return [(*tensors[0].shape[:3], $v_dim)]


def _check(q, k, v, k_pages, v_pages, query_starts, cache_starts, block_tables):
    _, n_heads, _, head_dim = q.shape
    if q.shape[0] != 1 or head_dim != $head_dim or v.shape[3] != $v_dim or n_heads % k.shape[1] != 0:
        raise ValueError(f"paged attention kernel for head_dim $head_dim, value head_dim $v_dim: q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)} and v {tuple(v.shape)} do not fit (one flattened batch; the q heads "
                         "a multiple of the kv heads)")
    for name, pages, dim in (("k_pages", k_pages, $head_dim), ("v_pages", v_pages, $v_dim)):
        expected = ($page, k.shape[1], dim)
        if pages.dtype != $dtype or pages.dim() != 4 or tuple(pages.shape[1:]) != expected:
            raise ValueError(f"paged attention: {name} is {pages.dtype} {tuple(pages.shape)}, expected $dtype "
                             f"[pages, {expected[0]}, {expected[1]}, {expected[2]}]")
    seqs = cache_starts.shape[0]
    if tuple(query_starts.shape) != (seqs + 1,) or block_tables.dim() != 2 or block_tables.shape[0] != seqs:
        raise ValueError(f"paged attention: query_starts {tuple(query_starts.shape)}, cache_starts "
                         f"{tuple(cache_starts.shape)} and block_tables {tuple(block_tables.shape)} must be "
                         f"[{seqs} + 1], [{seqs}] and [{seqs}, max_pages]")


def launch(kernel, tensors, scalars):
    $unpack
    _check(q, k, v, k_pages, v_pages, query_starts, cache_starts, block_tables)
    _, n_heads, n_tokens, _ = q.shape
    seqs = cache_starts.shape[0]
    kv_group = n_heads // k.shape[1]
    out = torch.empty((1, n_heads, n_tokens, $v_dim), dtype=$dtype, device=q.device)
    if out.numel() == 0 or seqs == 0:
        return [out]
    strides = [t.stride(d) for t, dims in ((q, (1, 2, 3)), (k, (1, 2, 3)), (v, (1, 2, 3)), (cos, (1, 2)),
                                           (sin, (1, 2)), (q_norm, (0,)), (k_norm, (0,)), (k_pages, (0, 1, 2, 3)),
                                           (v_pages, (0, 1, 2, 3)), (block_tables, (0, 1)),
                                           (distance_bias, (1, 2, 3))) for d in dims]
    common = (q, k, v, cos, sin, q_norm, k_norm, sinks, alibi, distance_bias, k_pages, v_pages, query_starts, cache_starts,
              block_tables, out)
    if n_tokens != seqs:  # some sequence brings more than one token
        blocks = paged_prefill_blocks($width, $dtype, n_tokens, $norm, $extent > 0)
        kernel[(seqs * n_heads, triton.cdiv(n_tokens, blocks.block_m))](
            *common, out, out, n_tokens, n_heads, kv_group, 1, 1, *strides, PHASE=$PREFILL, **SPEC,
            BLOCK_M=blocks.block_m, BLOCK_N=blocks.block_n, SPLITS=1, num_warps=blocks.num_warps,
            num_stages=blocks.num_stages, enable_fp_fusion=True)
        return [out]
    n_splits, split_size = decode_splits(block_tables.shape[1] * $page)
    part_o = torch.empty((seqs, n_heads, n_splits, $v_dim), dtype=torch.float32, device=q.device)
    part_ml = torch.empty((seqs, n_heads, n_splits, 2), dtype=torch.float32, device=q.device)
    sizes = (n_tokens, n_heads, kv_group, n_splits, split_size)
    kernel[(seqs * k.shape[1], n_splits)](
        *common, part_o, part_ml, *sizes, *strides, PHASE=$DECODE, **SPEC,
        BLOCK_M=max(16, triton.next_power_of_2(kv_group)), BLOCK_N=$block_n, SPLITS=1, num_warps=$decode_warps,
        num_stages=2, enable_fp_fusion=True)
    kernel[(seqs * n_heads,)](
        *common, part_o, part_ml, *sizes, *strides, PHASE=$REDUCE, **SPEC, BLOCK_M=16, BLOCK_N=16,
        SPLITS=triton.next_power_of_2(n_splits), num_warps=4, num_stages=1, enable_fp_fusion=True)
    return [out]
'''


def _unpack(spec: PagedAttentionSpec) -> str:
    """The launcher's unpacking of its tensors: the op's operands. Without RoPE the kernel takes
    no tables, without QK-norm no weights, without sinks, ALiBi or a distance bias no values of
    those: q stands in for them (never read)."""
    given = {"cos": spec.rope, "sin": spec.rope, "q_norm": spec.qk_norm is not None,
             "k_norm": spec.qk_norm is not None, "sinks": spec.sinks, "alibi": spec.alibi,
             "distance_bias": spec.distance_extent is not None}
    order = ["q", "k", "v", "cos", "sin", "q_norm", "k_norm", "k_pages", "v_pages", "query_starts", "cache_starts",
             "block_tables", "sinks", "alibi", "distance_bias"]
    present = [name for name in order if given.get(name, True)]
    absent = [name for name in order if not given.get(name, True)]
    return ", ".join(present) + " = tensors" + "".join(f"\n    {name} = q" for name in absent)


def emit_paged_attention_module(spec: PagedAttentionSpec, name: str, header: str) -> str:
    """The whole kernel file: imports, the helpers, the `@triton.jit` kernel and its launcher.
    `header` goes first (the cache's key and provenance comment)."""
    pieces = spec.pieces
    width = max(pieces.width, padded_width(spec.value_dim))
    fields = {
        "name": name,
        "elem": TL_DTYPE[spec.dtype],
        "precision": ', input_precision="ieee"' if spec.dtype == torch.float32 else "",
        "dtype": str(spec.dtype),
        "head_dim": spec.head_dim,
        "v_dim": spec.value_dim,
        "v_p": padded_width(spec.value_dim),
        "page": spec.page_size,
        "pieces": ", ".join(f"{k}={v}" for k, v in pieces.constexprs.items()),
        "width": width,
        "rope": spec.rope,
        "interleaved": spec.interleaved,
        "scale": repr(spec.scale),
        "window": spec.window or 0,
        "softcap": repr(float(spec.softcap or 0.0)),
        "block_n": decode_block_n(width, spec.dtype),
        "decode_warps": decode_warps(width, spec.dtype),
        "norm": spec.qk_norm is not None,
        "sinks": spec.sinks,
        "alibi": spec.alibi,
        "extent": spec.distance_extent or 0,
        "unpack": _unpack(spec),
        "PREFILL": PREFILL, "DECODE": DECODE, "REDUCE": REDUCE,
    }
    constants = [dot_dtype_line(spec.dtype), f"LOG2E = tl.constexpr({1 / math.log(2)!r})"]
    body = [_ROPE_HELPER, _SOFTCAP_HELPER, *([qk_norm_helper(spec.qk_norm, spec.dtype)] if spec.qk_norm else []),
            Template(_HELPERS).substitute(fields), Template(_KERNEL).substitute(fields),
            Template(_LAUNCHER).substitute(fields)]
    return module_source(header, {"ad_mlir.codegen.templates.cached_attention_kernel": ["decode_splits"],
                                  "ad_mlir.codegen.templates.paged_attention_kernel": ["paged_prefill_blocks"]},
                         constants, body)


def paged_attention_spec(op: ad.PagedAttentionOp) -> PagedAttentionSpec:
    return PagedAttentionSpec(page_size=op.page_size(), **spec_fields(op))


EMITTER = KernelEmitter(
    lambda op, name, header: emit_paged_attention_module(paged_attention_spec(op), name, header),
    written=lambda op: operand_indices(op, (op.k_pages, op.v_pages)),
    check=spec_check(paged_attention_spec),
)
