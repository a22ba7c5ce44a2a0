"""Attention over K/V pages, the pages written in place: a kernel template (`ad.cached_attention`,
both its layouts: the slot form's batch rows over one page each, the paged form's flattened
batch over pages through a block table).

`emit_cached_attention_module` writes a kernel module with the interface of the region kernels
(a `@triton.jit` function named as asked, `OUTPUT_DTYPES`, `output_shapes`, `launch`). The
launch takes, in the op's operand order, `q [B, Hq, S, D]`, `k [B, Hkv, S, D]`, `v [B, Hkv, S,
Dv]` (the new tokens; any strides; Dv = D but for DeepSeek's heads; batch row s is sequence s,
or, flattened, B = 1 and S = T the step's tokens of every sequence), with RoPE `cos`, `sin [B or
1, S, rotary_dim]`, with QK-norm `q_norm`, `k_norm [D]` (Qwen3, Gemma3: each new query and key
head RMS-normalized before RoPE, as the attention template does), then `k_cache [pages, PAGE,
Hkv, D]`, `v_cache [pages, PAGE, Hkv, Dv]`, `block_tables [seqs, max_pages]`, `cache_starts
[seqs]`, flattened `query_starts [seqs + 1]` (int64, on the device: nothing is read on the
host), with sinks `sinks [Hq]` (or per token `[B, Hq, S]`), with ALiBi `alibi [Hq]` slopes
(both contiguous), with a distance bias `distance_bias [B, Hq, S, extent]` (any strides); writes
each sequence's new keys (after QK-norm and RoPE) and values into its pages at positions
`cache_starts[s] ..` and returns `out [B, Hq, S, Dv]`, contiguous. Position p of sequence s is
row p % PAGE of page `block_tables[s, p / PAGE]` (PAGE, the pools' page size, a constexpr of
the launch: a power of two divides by a shift); a table one page wide (the
slot form: a slot is a page of max_seq tokens) is read once per program (`ONE_PAGE`). Nothing
copies a cache.

One `@triton.jit` function, three phases (a constexpr), so that every launch goes through the
one kernel object the runtime hands the launcher (wrapped for torch.compile on CUDA, the
interpreter's on CPU, a recorder for the PTX report):

- PREFILL (some sequence brings more than one token; also chunked prefill, start > 0; variable
  length when flattened): grid (seqs * Hq, cdiv(S, BLOCK_M)). A program takes BLOCK_M new
  queries of one head of one sequence (programs past the sequence's new tokens do nothing: the
  grid bounds every sequence by S, with no host sync), rotated in fp32 (RoPE at their
  positions), and runs the online softmax first over the sequence's cached positions [0, start)
  read from its pages (already rotated when they were written), then over its new keys causally
  (new key j is seen by new query i when j <= i), each K tile rotated after its load. The
  programs of a K/V head's first query head also write their block's new keys and values into
  the pages: no program reads a position >= its sequence's start, and a page written belongs to
  one sequence, so the writes race with no read.
- DECODE (every sequence brings one token): split-K flash decoding. Grid (seqs * Hkv, splits):
  one program takes every query head of one K/V head (GQA: the group's rows padded to 16, the
  smallest tl.dot) and one split of `split_size` positions of [0, start]; position `start` is
  the new token, taken from the new key/value (rotated) rather than from the pages, which split
  0 writes. Each split stores its running max, sum and unnormalized output in fp32; a split past
  the sequence stores an empty (-inf, 0, 0) partial. The number of splits comes from the block
  table's positions (max_pages * PAGE: static for a fixed table width, so that a decode step
  keeps its shapes for a CUDA graph).
- REDUCE: grid (seqs * Hq,): the splits' partials of one head merged (log-sum-exp weights).

Scores are q.k * scale, soft-capped (`softcap * tanh(s / softcap)`, Gemma2) when asked, masked
(cached length, causal offset, sliding `window`: key position > query position - window), then
the online softmax runs in fp32 with exp2. ALiBi adds slope * (key - query position) to the
scores after the soft cap (in fp32, from the absolute positions); a distance bias adds each
query's entry at the key's backward distance (query - key position) where it is below the
extent, read per score tile (Inkling's relative logits). A head's sink logit (gpt-oss) is one more term of
the softmax with no value: prefill starts each row's online softmax from it (max = sink, sum =
1), decode adds it once when the splits merge. Q, K and P are rounded to the input dtype for the dots
(as FlashAttention does); RoPE, scores and softmax stay in fp32; the pages hold the rotated key
rounded once to its dtype, in the head's own dim order. The head dim is held as the attention
template's pieces (`kernel_forms.HeadPieces`: the rotated pairs, rotate_half or interleaved,
and the dims past a partial rotary dim, each padded to a power of two and masked), so any head_dim
and rotary_dim work: QK^T is one dot per piece; V and the output are padded, masked tiles.

With scales (`CachedAttentionSpec.kv_scales`, vLLM's fp8 KV cache) the pools are float8_e4m3fn:
a row is written as e4m3(clamp(x / scale, +-448)) (`_to_pool`: `cvt.rn.satfinite` on sm_90) and
each tile loaded from the pages is converted in registers (`_from_pool`: e4m3 * scale, rounded
to the element dtype) before its dot; the new tokens' own keys and values, taken from registers
rather than the pages, go through both, so that every key a query sees is the one the pages
hold. The scales are constexprs (1.0 folds away).
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
    RotaryHead,
    attention_blocks,
    qk_norm_helper,
    rotary_dim_of,
)
from ad_mlir.codegen.templates.skeleton import TL_DTYPE, dot_dtype_line, module_source
from ad_mlir.dialects import ad
from ad_mlir.dialects.ad import QkNorm
from ad_mlir.dialects.decompositions import NoKernelForm
from ad_mlir.dialects.kernel_forms import MAX_HEAD_DIM, check_rope_dims, next_power_of_2, padded_width
from ad_mlir.semantics.op_table import torch_dtype

PREFILL, DECODE, REDUCE = 0, 1, 2

MAX_SPLITS = 32
"""Decode splits a sequence into at most this many parts (more only for caches over 2048 x 32)."""
MIN_SPLIT = 64
"""Positions of a decode split at least (a few BLOCK_N tiles: a split's fixed cost amortized)."""


@dataclass(frozen=True)
class CachedAttentionSpec(RotaryHead):
    """What one cached-attention kernel is specialized for (everything but the runtime sizes)."""

    head_dim: int
    dtype: torch.dtype
    """Of q, k, v, the caches and the output."""
    scale: float
    rope: bool
    cos_dtype: torch.dtype | None = None
    window: int | None = None
    """Key positions within `window` of the query (inclusive of itself) only, when set."""
    softcap: float | None = None
    rotary_dim: int | None = None
    """With `rope`: the first dims of each head that rotate (partial rotary); None: all."""
    interleaved: bool = False
    """With `rope`: pairs (2i, 2i + 1) rotate (GPT-J, GLM), not rotate_half's (i, i + R/2)."""
    qk_norm: QkNorm | None = None
    """q_norm and k_norm weights [D] are inputs (after the tables): the new query and key rows
    are RMS-normalized per head before RoPE (the cache holds the normalized keys)."""
    sinks: bool = False
    """A sink logit per query head [Hq], or per token and head [B, Hq, S] (Inkling2), is an input
    (after `starts`): it joins each row's softmax."""
    alibi: bool = False
    """ALiBi slopes per query head [Hq] are an input (after the sinks): scores get slope * (key -
    query position)."""
    v_head_dim: int | None = None
    """The value's (and the output's) head dim where it differs from the query's and key's
    (DeepSeek's MLA heads: q/k 192, v 128); None: the same."""
    distance_extent: int | None = None
    """A bias per query token and head over this many backward distances, [B, Hq, S, extent]
    contiguous, is an input (after the ALiBi slopes): the score of the key at distance d from
    the query gets entry d when d < extent (Inkling's relative logits)."""
    flattened: bool = False
    """`query_starts` is an input (after `cache_starts`): one flattened batch of variable-length
    sequences, not one sequence per batch row."""
    kv_scales: tuple[float, float] | None = None
    """The pools are float8_e4m3fn with these (key, value) scales; None: of `dtype`."""

    @property
    def pool_dtype(self) -> torch.dtype:
        return torch.float8_e4m3fn if self.kv_scales is not None else self.dtype

    @property
    def value_dim(self) -> int:
        return self.v_head_dim if self.v_head_dim is not None else self.head_dim

    def __post_init__(self) -> None:
        check_rope_dims("cached attention kernel", self.head_dim, self.rotary if self.rope else None,
                        self.interleaved)
        if self.dtype not in TL_DTYPE or (self.rope and self.cos_dtype not in TL_DTYPE):
            raise ValueError(f"cached attention kernel: dtypes {self.dtype}, {self.cos_dtype} are not all of "
                             f"{', '.join(map(str, TL_DTYPE))}")
        if not math.isfinite(self.scale) or (self.softcap is not None and not self.softcap > 0):
            raise ValueError(f"cached attention kernel: scale {self.scale} / softcap {self.softcap} out of range")
        if self.qk_norm is not None and not self.rope:
            raise ValueError("cached attention kernel: qk_norm needs rope=True (QK-norm comes with RoPE from "
                             "ad.rope_attention)")
        if self.distance_extent is not None and self.distance_extent < 1:
            raise ValueError(f"cached attention kernel: distance_extent {self.distance_extent} must be positive")
        if self.window is not None and self.window < 1:
            raise ValueError(f"cached attention kernel: window {self.window} must be positive")
        if self.kv_scales is not None and not all(0 < x < math.inf for x in self.kv_scales):
            raise ValueError(f"cached attention kernel: kv_scales {self.kv_scales} must be positive and finite")
        if not 0 < self.value_dim <= MAX_HEAD_DIM:
            raise ValueError(f"cached attention kernel: value head_dim {self.value_dim} must be in 1..{MAX_HEAD_DIM}")



def decode_splits(max_seq: int) -> tuple[int, int]:
    """(splits, positions per split) of a decode step over a cache of `max_seq` positions."""
    split = max(MIN_SPLIT, next_power_of_2(-(-max_seq // MAX_SPLITS)))
    return -(-max_seq // split), split


def decode_block_n(width: int, dtype: torch.dtype) -> int:
    """Keys per decode loop step for heads held `width` wide (`HeadPieces.width`): 64 x 64 K/V
    tiles in 16-bit fit 4 warps' registers with the group's [16, width] accumulator, fp32 tiles
    (dots on the FMA units, operands in registers, see attention_kernel._BLOCKS) a quarter of
    that: measured for sm_90 without spills by tests/unit/test_cached_attention_kernel.py."""
    elements = 4096 if dtype != torch.float32 else 1024
    return max(16, elements // width)


def decode_warps(width: int, dtype: torch.dtype) -> int:
    """Warps of a decode program: 4, or 8 for fp32 heads held 256 wide (DeepSeek's 192 = 128 +
    64), whose pieces, tiles and accumulator spill 4 warps' registers at the smallest BLOCK_N."""
    return 8 if dtype == torch.float32 and width > 128 else 4


def prefill_blocks(width: int, dtype: torch.dtype, seq_len: int, qk_norm: bool = False,
                   distance_bias: bool = False, page_lookups: bool = False) -> AttentionBlocks:
    """The attention template's blocks (`attention_blocks`), with half the keys per step in
    fp32: this kernel also holds the cache's K pieces, and fp32 at head_dim 64 spilled. A
    distance bias gathers a [BLOCK_M, BLOCK_N] tile by 64-bit addresses on top: with it, half
    the keys per step in 16-bit too and twice the warps in fp32 (measured for Inkling's heads of
    128 on sm_90: 224 bytes spilled in the paged bf16 prefill, 16 in the slot form's fp32 one).
    Page lookups through a table wider than one page (`page_lookups`) add their 64-bit offsets:
    twice the warps in fp32 (fp32 heads of 128 spilled at 4 warps)."""
    blocks = attention_blocks(width, dtype, seq_len, qk_norm)
    if dtype != torch.float32:
        return dataclasses.replace(blocks, block_n=max(16, blocks.block_n // 2)) if distance_bias else blocks
    return dataclasses.replace(blocks, block_n=max(16, blocks.block_n // 2),
                               num_warps=blocks.num_warps * (2 if distance_bias else 1) * (2 if page_lookups else 1))


_HELPERS = '''\
@triton.jit
def _new_rows(x, x_rows, x_sd, w, w_sd, cos, cos_rows, cos_sd, sin, sin_rows, sin_sd, row_mask,
              HALF: tl.constexpr, HALF_P: tl.constexpr, REST: tl.constexpr, REST_P: tl.constexpr,
              TAIL: tl.constexpr, TAIL_P: tl.constexpr, ROPE: tl.constexpr, INTERLEAVED: tl.constexpr,
              NORM: tl.constexpr):
    """Pieces of rows of a query or key as the cache holds them: RMS-normalized with the QK-norm
    weight w when NORM, rotated (in fp32) when ROPE, rounded to the element dtype."""
    if NORM:
        a, b, p, t = _load_normed_pieces(x, x_rows, x_sd, w, w_sd, cos, cos_rows, cos_sd, sin, sin_rows, sin_sd,
                                         row_mask, HALF, HALF_P, REST, REST_P, TAIL, TAIL_P, ROPE, INTERLEAVED)
    else:
        a, b, p, t = _load_pieces(x, x_rows, x_sd, cos, cos_rows, cos_sd, sin, sin_rows, sin_sd, row_mask,
                                  HALF, HALF_P, REST, REST_P, TAIL, TAIL_P, ROPE, INTERLEAVED)
    return a.to($elem), b.to($elem), p.to($elem), t.to($elem)


@triton.jit
def _store_passed(x, x_rows, x_sd, piece, row_mask, START: tl.constexpr, WIDTH: tl.constexpr,
                  WIDTH_P: tl.constexpr):
    j = tl.arange(0, WIDTH_P)[None, :]
    tl.store(x + x_rows[:, None] + (START + j) * x_sd, piece, mask=row_mask[:, None] & (j < WIDTH))


@triton.jit
def _store_pieces(x, x_rows, x_sd, a, b, p, t, row_mask, HALF: tl.constexpr, HALF_P: tl.constexpr,
                  REST: tl.constexpr, REST_P: tl.constexpr, TAIL: tl.constexpr, TAIL_P: tl.constexpr,
                  INTERLEAVED: tl.constexpr):
    """Pieces (as _load_pieces holds them) stored into their dims of rows of [rows, head_dim]."""
    _store_pair_pieces(x, x_rows, x_sd, a, b, row_mask, HALF, HALF_P, INTERLEAVED)
    if REST > 0:
        _store_passed(x, x_rows, x_sd, p, row_mask, 2 * HALF, REST, REST_P)
    if TAIL > 0:
        _store_passed(x, x_rows, x_sd, t, row_mask, 2 * HALF + REST, TAIL, TAIL_P)


@triton.jit
def _to_pool(x, SCALE: tl.constexpr, FP8: tl.constexpr):
    """Rows as the pools hold them: with FP8, x / SCALE (fp32) saturated to +-448, rounded to e4m3."""
    if FP8:  # one return: the two branches' types differ
        x = tl.minimum(tl.maximum(x.to(tl.float32) / SCALE, -448.0), 448.0).to(tl.float8e4nv)
    return x


@triton.jit
def _from_pool(x, SCALE: tl.constexpr, FP8: tl.constexpr):
    """Rows of the pools as attention reads them: with FP8, x * SCALE (fp32) rounded to the element dtype."""
    if FP8:
        x = (x.to(tl.float32) * SCALE).to($elem)
    return x


@triton.jit
def _pieces_from_pool(a, b, p, t, SCALE: tl.constexpr, FP8: tl.constexpr):
    return _from_pool(a, SCALE, FP8), _from_pool(b, SCALE, FP8), _from_pool(p, SCALE, FP8), _from_pool(t, SCALE, FP8)


@triton.jit
def _pieces_to_pool(a, b, p, t, SCALE: tl.constexpr, FP8: tl.constexpr):
    return _to_pool(a, SCALE, FP8), _to_pool(b, SCALE, FP8), _to_pool(p, SCALE, FP8), _to_pool(t, SCALE, FP8)


@triton.jit
def _scaled(x, SCALE: tl.constexpr):
    """A query piece times the softmax scale, rounded to the element dtype, as a dot operand."""
    return (x.to(tl.float32) * SCALE).to($elem).to(DOT_DTYPE)


@triton.jit
def _scores(q_a, q_b, q_p, q_t, k_a, k_b, k_p, k_t, visible, slope, distance, bias_rows, row_mask, bias_sd,
            SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, EXTENT: tl.constexpr, REST: tl.constexpr,
            TAIL: tl.constexpr):
    """(q . k) (q already scaled), one dot per piece, soft-capped when SOFTCAP > 0, plus ALiBi's
    slope (one per row) times the key's distance from the query (key - query position) when
    ALIBI, plus, when EXTENT > 0, each row's distance bias (its vector at `bias_rows`, entries
    `bias_sd` apart) at the key's backward distance where that is below EXTENT, in log2 units;
    -inf where not visible."""
    qk = tl.dot(q_a, tl.trans(k_a.to(DOT_DTYPE))$precision)
    qk = tl.dot(q_b, tl.trans(k_b.to(DOT_DTYPE)), qk$precision)
    if REST > 0:
        qk = tl.dot(q_p, tl.trans(k_p.to(DOT_DTYPE)), qk$precision)
    if TAIL > 0:
        qk = tl.dot(q_t, tl.trans(k_t.to(DOT_DTYPE)), qk$precision)
    if SOFTCAP > 0:
        qk = _soft_capped(qk, SOFTCAP)
    if ALIBI:
        qk += slope[:, None] * distance.to(tl.float32)
    if EXTENT > 0:
        back = -distance
        near = row_mask[:, None] & (back >= 0) & (back < EXTENT)
        qk += tl.load(bias_rows[:, None] + back * bias_sd, mask=near, other=0.0).to(tl.float32)
    return tl.where(visible, qk * LOG2E, float("-inf"))


@triton.jit
def _softmax_step(qk, v_tile, m_i, l_i, acc):
    """One step of the online softmax over a tile of scores and its values."""
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    # A row with no key seen yet has m_new = -inf: subtracting 0 keeps exp2(-inf - -inf) = NaN out.
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(qk - m_ref[:, None])
    alpha = tl.exp2(m_i - m_ref)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to($elem).to(DOT_DTYPE), v_tile.to(DOT_DTYPE), acc * alpha[:, None]$precision)
    return m_new, l_i, acc
'''

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
def _rows(table, pos, row_mask, bt_s1, p_s0, p_s1, PAGE: tl.constexpr, ONE_PAGE: tl.constexpr):
    """Offsets of positions `pos` of one sequence from its pages' base (`_pages_base`): through
    its block table row, or with ONE_PAGE (a table one page wide: the slot form) in that page."""
    if ONE_PAGE:
        return pos * p_s1
    return _page_rows(table, pos, row_mask, bt_s1, p_s0, p_s1, PAGE)


@triton.jit
def _kv_rows(table, pos, row_mask, bt_s1, kc_s0, kc_s1, vc_s0, vc_s1, PAGE: tl.constexpr, ONE_PAGE: tl.constexpr):
    """`_rows` of positions `pos` in the K and the V pool, the block table read once for both."""
    if ONE_PAGE:
        return pos * kc_s1, pos * vc_s1
    page = tl.load(table + (pos // PAGE) * bt_s1, mask=row_mask, other=0)
    in_page = pos % PAGE
    return page * kc_s0 + in_page * kc_s1, page * vc_s0 + in_page * vc_s1


@triton.jit
def _pages_base(pool, table, head_offset, p_s0, ONE_PAGE: tl.constexpr):
    """One kv head of a sequence's pages in `pool`: with ONE_PAGE its one page, read once."""
    if ONE_PAGE:
        return pool + tl.load(table) * p_s0 + head_offset
    return pool + head_offset


@triton.jit
def $name(q, k, v, cos, sin, q_norm, k_norm, sinks, alibi, dist_bias, k_cache, v_cache, query_starts, cache_starts,
        block_tables, out, part_o, part_ml, seq_len, n_heads, kv_group, n_splits, split_size,
        q_sb, q_sh, q_ss, q_sd, k_sb, k_sh, k_ss, k_sd, v_sb, v_sh, v_ss, v_sd,
        cos_sb, cos_ss, cos_sd, sin_sb, sin_ss, sin_sd, qn_sd, kn_sd,
        kc_s0, kc_s1, kc_s2, kc_s3, vc_s0, vc_s1, vc_s2, vc_s3, bt_s0, bt_s1,
        db_sb, db_sh, db_ss, db_sd, sk_sb, sk_sh, sk_ss, o_sb,
        PHASE: tl.constexpr, PAGE: tl.constexpr, ONE_PAGE: tl.constexpr, VARLEN: tl.constexpr, V_DIM: tl.constexpr,
        V_P: tl.constexpr, HALF: tl.constexpr, HALF_P: tl.constexpr, REST: tl.constexpr, REST_P: tl.constexpr,
        TAIL: tl.constexpr, TAIL_P: tl.constexpr, ROPE: tl.constexpr, INTERLEAVED: tl.constexpr, NORM: tl.constexpr,
        SCALE: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, SINKS: tl.constexpr, ALIBI: tl.constexpr,
        EXTENT: tl.constexpr, FP8: tl.constexpr, K_SCALE: tl.constexpr, V_SCALE: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, SPLITS: tl.constexpr):
    dims = tl.arange(0, V_P)  # of a value / output row (Q and K are held as pieces)
    d_in = dims < V_DIM
    keys = tl.arange(0, BLOCK_N)
    if PHASE == 2:
        # REDUCE: one (sequence, head); its splits' partials, merged into the sequence's token row.
        sh = tl.program_id(0).to(tl.int64)
        s = sh // n_heads
        h = sh % n_heads
        t = tl.load(query_starts + s) if VARLEN else 0
        sp = tl.arange(0, SPLITS)
        s_in = sp < n_splits
        part = sh * n_splits + sp
        m = tl.load(part_ml + part * 2, mask=s_in, other=float("-inf"))
        l = tl.load(part_ml + part * 2 + 1, mask=s_in, other=0.0)
        # Position `start` is in every sequence's range: some split is not empty, m_max is finite.
        m_max = tl.max(m, 0)
        if SINKS:
            # The head's sink is one more softmax term (weight exp(sink), no value): merged once, here.
            sink = tl.load(sinks + s * sk_sb + h * sk_sh + t * sk_ss).to(tl.float32) * LOG2E
            m_max = tl.maximum(m_max, sink)
        w = tl.exp2(m - m_max)
        o = tl.load(part_o + part[:, None] * V_DIM + dims[None, :], mask=s_in[:, None] & d_in[None, :], other=0.0)
        denominator = tl.sum(l * w, 0)
        if SINKS:
            denominator += tl.exp2(sink - m_max)
        result = tl.sum(o * w[:, None], 0) / denominator
        tl.store(out + s * o_sb + (h * seq_len + t) * V_DIM + dims, result.to($elem), mask=d_in)
    elif PHASE == 1:
        # DECODE: every query head of one K/V head of one sequence, one split of the positions [0, start].
        n_kv = n_heads // kv_group
        s = (tl.program_id(0) // n_kv).to(tl.int64)
        kvh = (tl.program_id(0) % n_kv).to(tl.int64)
        split = tl.program_id(1)
        t = tl.load(query_starts + s) if VARLEN else 0
        start = tl.load(cache_starts + s)
        table = block_tables + s * bt_s0
        rows = tl.arange(0, BLOCK_M)
        r_in = rows < kv_group
        heads = kvh * kv_group + rows
        at_token = rows * 0  # every row reads the new token's cos/sin row
        slope = tl.load(alibi + heads, mask=r_in, other=0.0).to(tl.float32) if ALIBI else 0.0
        bias_rows = dist_bias + s * db_sb + heads * db_sh + t * db_ss  # the new token's vector of each head
        cos_t = cos + s * cos_sb + t * cos_ss
        sin_t = sin + s * sin_sb + t * sin_ss
        q_a, q_b, q_p, q_t = _new_rows(q + s * q_sb + t * q_ss, heads * q_sh, q_sd, q_norm, qn_sd, cos_t, at_token,
                                       cos_sd, sin_t, at_token, sin_sd, r_in,
                                       HALF, HALF_P, REST, REST_P, TAIL, TAIL_P, ROPE, INTERLEAVED, NORM)
        q_a, q_b, q_p, q_t = _scaled(q_a, SCALE), _scaled(q_b, SCALE), _scaled(q_p, SCALE), _scaled(q_t, SCALE)
        one = tl.arange(0, 1)
        new_k_a, new_k_b, new_k_p, new_k_t = _new_rows(k + s * k_sb + t * k_ss + kvh * k_sh, one, k_sd, k_norm,
                                                       kn_sd, cos_t, one, cos_sd, sin_t, one, sin_sd,
                                                       one == 0, HALF, HALF_P, REST, REST_P, TAIL, TAIL_P, ROPE,
                                                       INTERLEAVED, NORM)
        new_v = tl.load(v + s * v_sb + t * v_ss + kvh * v_sh + dims[None, :] * v_sd, mask=d_in[None, :], other=0)
        # the new token's rows as the pages will hold them (stored by split 0), and as read back
        pool_k_a, pool_k_b, pool_k_p, pool_k_t = _pieces_to_pool(new_k_a, new_k_b, new_k_p, new_k_t, K_SCALE, FP8)
        pool_v = _to_pool(new_v, V_SCALE, FP8)
        new_k_a, new_k_b, new_k_p, new_k_t = _pieces_from_pool(pool_k_a, pool_k_b, pool_k_p, pool_k_t, K_SCALE, FP8)
        new_v = _from_pool(pool_v, V_SCALE, FP8)
        kc_head = _pages_base(k_cache, table, kvh * kc_s2, kc_s0, ONE_PAGE)
        vc_head = _pages_base(v_cache, table, kvh * vc_s2, vc_s0, ONE_PAGE)
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
            k_rows = _rows(table, n_pos, cached, bt_s1, kc_s0, kc_s1, PAGE, ONE_PAGE)
            k_a, k_b, k_p, k_t = _new_rows(kc_head, k_rows, kc_s3, kc_head, 0, kc_head, n_pos, 0,
                                           kc_head, n_pos, 0, cached, HALF, HALF_P, REST, REST_P, TAIL, TAIL_P,
                                           False, INTERLEAVED, False)
            k_a, k_b, k_p, k_t = _pieces_from_pool(k_a, k_b, k_p, k_t, K_SCALE, FP8)
            v_rows = _rows(table, n_pos, cached, bt_s1, vc_s0, vc_s1, PAGE, ONE_PAGE)
            v_tile = _from_pool(tl.load(vc_head + v_rows[:, None] + dims[None, :] * vc_s3,
                                        mask=cached[:, None] & d_in[None, :], other=0.0), V_SCALE, FP8)
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
            _store_pieces(kc_head, _rows(table, at, one == 0, bt_s1, kc_s0, kc_s1, PAGE, ONE_PAGE), kc_s3,
                          pool_k_a, pool_k_b, pool_k_p, pool_k_t, one == 0,
                          HALF, HALF_P, REST, REST_P, TAIL, TAIL_P, INTERLEAVED)
            v_at = _rows(table, at, one == 0, bt_s1, vc_s0, vc_s1, PAGE, ONE_PAGE)
            tl.store(vc_head + v_at[:, None] + dims[None, :] * vc_s3, pool_v, mask=d_in[None, :])
    else:
        # PREFILL: BLOCK_M new queries of one head of one sequence; its cached keys, then its new ones.
        sh = tl.program_id(0)
        s = (sh // n_heads).to(tl.int64)
        h = (sh % n_heads).to(tl.int64)
        kvh = h // kv_group
        if VARLEN:
            first = tl.load(query_starts + s)
            n_new = tl.load(query_starts + s + 1) - first
        else:
            first = 0
            n_new = seq_len
        # The last query blocks see the most keys: they start first, the short ones fill the tail.
        start_m = (tl.num_programs(1) - 1 - tl.program_id(1)) * BLOCK_M
        if start_m < n_new:
            start = tl.load(cache_starts + s)
            table = block_tables + s * bt_s0
            rows = tl.arange(0, BLOCK_M)
            m_pos = start_m + rows
            m_in = m_pos < n_new
            m_tok = first + m_pos  # the queries' rows among the sequence's (flattened: the step's) tokens
            slope = tl.zeros([BLOCK_M], tl.float32) + tl.load(alibi + h).to(tl.float32) if ALIBI else 0.0
            bias_rows = dist_bias + s * db_sb + h * db_sh + m_tok * db_ss
            cos_s = cos + s * cos_sb
            sin_s = sin + s * sin_sb
            q_a, q_b, q_p, q_t = _new_rows(q + s * q_sb + h * q_sh, m_tok * q_ss, q_sd, q_norm, qn_sd, cos_s,
                                           m_tok * cos_ss, cos_sd, sin_s, m_tok * sin_ss, sin_sd, m_in,
                                           HALF, HALF_P, REST, REST_P, TAIL, TAIL_P, ROPE, INTERLEAVED, NORM)
            q_a, q_b, q_p, q_t = _scaled(q_a, SCALE), _scaled(q_b, SCALE), _scaled(q_p, SCALE), _scaled(q_t, SCALE)
            kc_head = _pages_base(k_cache, table, kvh * kc_s2, kc_s0, ONE_PAGE)
            vc_head = _pages_base(v_cache, table, kvh * vc_s2, vc_s0, ONE_PAGE)
            k_new = k + s * k_sb + kvh * k_sh
            v_new = v + s * v_sb + kvh * v_sh
            if SINKS:
                # The online softmax starts from the sink's term: max = sink, sum = exp(sink - max) = 1.
                sink_rows = sinks + s * sk_sb + h * sk_sh + m_tok * sk_ss  # one head's, or each token's
                m_i = tl.load(sink_rows, mask=m_in, other=0.0).to(tl.float32) * LOG2E
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
                # the tile's rows in both pools, its pages looked up once for K and V
                k_rows, v_rows = _kv_rows(table, n_pos, n_in, bt_s1, kc_s0, kc_s1, vc_s0, vc_s1, PAGE, ONE_PAGE)
                k_a, k_b, k_p, k_t = _new_rows(kc_head, k_rows, kc_s3, kc_head, 0, kc_head,
                                               n_pos, 0, kc_head, n_pos, 0, n_in, HALF, HALF_P, REST, REST_P, TAIL,
                                               TAIL_P, False, INTERLEAVED, False)
                k_a, k_b, k_p, k_t = _pieces_from_pool(k_a, k_b, k_p, k_t, K_SCALE, FP8)
                visible = n_in[None, :]
                if WINDOW > 0:
                    visible = visible & (n_pos[None, :] > start + m_pos[:, None] - WINDOW)
                qk = _scores(q_a, q_b, q_p, q_t, k_a, k_b, k_p, k_t, visible, slope,
                             n_pos[None, :] - (start + m_pos[:, None]), bias_rows, m_in, db_sd, SOFTCAP, ALIBI, EXTENT,
                             REST, TAIL)
                # V loaded once the K pieces are dead
                v_tile = _from_pool(tl.load(vc_head + v_rows[:, None] + dims[None, :] * vc_s3,
                                            mask=n_in[:, None] & d_in[None, :], other=0.0), V_SCALE, FP8)
                m_i, l_i, acc = _softmax_step(qk, v_tile, m_i, l_i, acc)
            lo = 0
            if WINDOW > 0:
                lo = tl.maximum(lo, start_m - WINDOW + 1)
            # New keys past this block's last query are masked for every row: not visited.
            for n0 in range(lo, tl.minimum(n_new, start_m + BLOCK_M), BLOCK_N):
                n_pos = n0 + keys
                n_in = n_pos < n_new
                n_tok = first + n_pos
                k_a, k_b, k_p, k_t = _new_rows(k_new, n_tok * k_ss, k_sd, k_norm, kn_sd, cos_s, n_tok * cos_ss, cos_sd,
                                               sin_s, n_tok * sin_ss, sin_sd, n_in,
                                               HALF, HALF_P, REST, REST_P, TAIL, TAIL_P, ROPE, INTERLEAVED, NORM)
                v_tile = tl.load(v_new + n_tok[:, None] * v_ss + dims[None, :] * v_sd,
                                 mask=n_in[:, None] & d_in[None, :], other=0)
                # the new keys and values as the pages hold them
                k_a, k_b, k_p, k_t = _pieces_to_pool(k_a, k_b, k_p, k_t, K_SCALE, FP8)
                k_a, k_b, k_p, k_t = _pieces_from_pool(k_a, k_b, k_p, k_t, K_SCALE, FP8)
                v_tile = _from_pool(_to_pool(v_tile, V_SCALE, FP8), V_SCALE, FP8)
                visible = n_in[None, :] & (n_pos[None, :] <= m_pos[:, None])
                if WINDOW > 0:
                    visible = visible & (n_pos[None, :] > m_pos[:, None] - WINDOW)
                qk = _scores(q_a, q_b, q_p, q_t, k_a, k_b, k_p, k_t, visible, slope, n_pos[None, :] - m_pos[:, None],
                             bias_rows, m_in, db_sd, SOFTCAP, ALIBI, EXTENT, REST, TAIL)
                m_i, l_i, acc = _softmax_step(qk, v_tile, m_i, l_i, acc)
            # Every query sees its own key: l_i > 0 on every row in range.
            out_tile = acc / tl.where(m_in, l_i, 1.0)[:, None]
            out_rows = s * o_sb + (h * seq_len + m_tok) * V_DIM
            tl.store(out + out_rows[:, None] + dims[None, :], out_tile.to($elem), mask=m_in[:, None] & d_in[None, :])
            if h % kv_group == 0:
                k_a, k_b, k_p, k_t = _new_rows(k_new, m_tok * k_ss, k_sd, k_norm, kn_sd, cos_s, m_tok * cos_ss, cos_sd,
                                               sin_s, m_tok * sin_ss, sin_sd, m_in,
                                               HALF, HALF_P, REST, REST_P, TAIL, TAIL_P, ROPE, INTERLEAVED, NORM)
                k_a, k_b, k_p, k_t = _pieces_to_pool(k_a, k_b, k_p, k_t, K_SCALE, FP8)
                _store_pieces(kc_head, _rows(table, start + m_pos, m_in, bt_s1, kc_s0, kc_s1, PAGE, ONE_PAGE), kc_s3,
                              k_a, k_b, k_p, k_t, m_in, HALF, HALF_P, REST, REST_P, TAIL, TAIL_P, INTERLEAVED)
                v_rows = _to_pool(tl.load(v_new + m_tok[:, None] * v_ss + dims[None, :] * v_sd,
                                          mask=m_in[:, None] & d_in[None, :], other=0), V_SCALE, FP8)
                v_at = _rows(table, start + m_pos, m_in, bt_s1, vc_s0, vc_s1, PAGE, ONE_PAGE)
                tl.store(vc_head + v_at[:, None] + dims[None, :] * vc_s3, v_rows, mask=m_in[:, None] & d_in[None, :])
'''

_LAUNCHER = '''\
OUTPUT_DTYPES = ($dtype, )
SPEC = dict(V_DIM=$v_dim, V_P=$v_p, $pieces, ROPE=$rope, INTERLEAVED=$interleaved, NORM=$norm,
            SCALE=$scale, WINDOW=$window, SOFTCAP=$softcap, SINKS=$sinks, ALIBI=$alibi, EXTENT=$extent,
            FP8=$fp8, K_SCALE=$k_scale, V_SCALE=$v_scale)


def output_shapes(tensors):
    return [(*tensors[0].shape[:3], $v_dim)]


def _stride(t, dim):
    """A size-1 dim is read with stride 0: it broadcasts (cos/sin of batch 1, a flattened batch)."""
    return 0 if t.shape[dim] == 1 else t.stride(dim)


def _check(q, k, v, k_cache, v_cache, block_tables, cache_starts, query_starts):
    batch, n_heads, _, head_dim = q.shape
    if head_dim != $head_dim or v.shape[3] != $v_dim or n_heads % k.shape[1] != 0:
        raise ValueError(f"cached attention kernel for head_dim $head_dim, value head_dim $v_dim: q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)} and v {tuple(v.shape)} do not fit (the q heads must be a multiple of the "
                         "kv heads)")
    for name, pool, dim in (("k_cache", k_cache, $head_dim), ("v_cache", v_cache, $v_dim)):
        expected = (k.shape[1], dim)
        if pool.dtype != $pool_dtype or pool.dim() != 4 or tuple(pool.shape[2:]) != expected \
                or pool.shape[:2] != k_cache.shape[:2]:
            raise ValueError(f"cached attention: {name} is {pool.dtype} {tuple(pool.shape)}, expected $pool_dtype "
                             f"[pages, page_size, {expected[0]}, {expected[1]}] (the key pool's pages)")
    seqs = cache_starts.shape[0]
    if block_tables.dim() != 2 or block_tables.shape[0] != seqs or cache_starts.dim() != 1:
        raise ValueError(f"cached attention: cache_starts {tuple(cache_starts.shape)} and block_tables "
                         f"{tuple(block_tables.shape)} must be [seqs] and [seqs, max_pages]")
    if query_starts is None and seqs != batch:
        raise ValueError(f"cached attention: cache_starts {tuple(cache_starts.shape)} must be [{batch}], one per batch "
                         "row")
    if query_starts is not None and (batch != 1 or tuple(query_starts.shape) != (seqs + 1,)):
        raise ValueError(f"cached attention: with query_starts {tuple(query_starts.shape)}, q {tuple(q.shape)} must "
                         f"be one flattened batch and query_starts [{seqs} + 1]")


def launch(kernel, tensors, scalars):
    $unpack
    _check(q, k, v, k_cache, v_cache, block_tables, cache_starts, query_starts)
    batch, n_heads, seq_len, _ = q.shape
    seqs = cache_starts.shape[0]
    kv_group = n_heads // k.shape[1]
    out = torch.empty((batch, n_heads, seq_len, $v_dim), dtype=$dtype, device=q.device)
    if out.numel() == 0 or seqs == 0:
        return [out]
    strides = [_stride(t, d) for t, n in ((q, 4), (k, 4), (v, 4), (cos, 3), (sin, 3)) for d in range(n)]
    strides += [q_norm.stride(0), k_norm.stride(0), *k_cache.stride(), *v_cache.stride(), *block_tables.stride()]
    strides += [_stride(distance_bias, d) for d in range(4)]
    # sinks [Hq] read as [B, Hq, S] with strides 0 but the head's; per token [B, Hq, S] as they are
    strides += [0, sinks.stride(0), 0] if sinks.dim() == 1 else [_stride(sinks, d) for d in range(3)]
    strides.append(_stride(out, 0))
    varlen = query_starts is not None
    # the page size is the pools'; the slot form's table, one page wide, is read once per program
    layout = dict(PAGE=k_cache.shape[1], ONE_PAGE=block_tables.shape[1] == 1, VARLEN=varlen)
    common = (q, k, v, cos, sin, q_norm, k_norm, sinks, alibi, distance_bias, k_cache, v_cache,
              query_starts if varlen else cache_starts, cache_starts, block_tables, out)
    if (seq_len > 1) if not varlen else (seq_len != seqs):  # some sequence brings more than one token
        blocks = prefill_blocks($width, $dtype, seq_len, $norm, $extent > 0, not layout["ONE_PAGE"])
        kernel[(seqs * n_heads, cdiv(seq_len, blocks.block_m))](
            *common, out, out, seq_len, n_heads, kv_group, 1, 1, *strides, PHASE=$PREFILL, **SPEC, **layout,
            BLOCK_M=blocks.block_m, BLOCK_N=blocks.block_n, SPLITS=1, num_warps=blocks.num_warps,
            num_stages=blocks.num_stages, enable_fp_fusion=True)
        return [out]
    n_splits, split_size = decode_splits(block_tables.shape[1] * k_cache.shape[1])
    part_o = torch.empty((seqs, n_heads, n_splits, $v_dim), dtype=torch.float32, device=q.device)
    part_ml = torch.empty((seqs, n_heads, n_splits, 2), dtype=torch.float32, device=q.device)
    sizes = (seq_len, n_heads, kv_group, n_splits, split_size)
    kernel[(seqs * k.shape[1], n_splits)](
        *common, part_o, part_ml, *sizes, *strides, PHASE=$DECODE, **SPEC, **layout,
        BLOCK_M=max(16, next_power_of_2(kv_group)), BLOCK_N=$block_n, SPLITS=1, num_warps=$decode_warps,
        num_stages=2, enable_fp_fusion=True)
    kernel[(seqs * n_heads,)](
        *common, part_o, part_ml, *sizes, *strides, PHASE=$REDUCE, **SPEC, **layout, BLOCK_M=16, BLOCK_N=16,
        SPLITS=next_power_of_2(n_splits), num_warps=4, num_stages=1, enable_fp_fusion=True)
    return [out]
'''


def _unpack(spec: CachedAttentionSpec) -> str:
    """The launcher's unpacking of its tensors: the op's operands. Without RoPE the kernel takes
    no tables, without QK-norm no weights, without sinks, ALiBi or a distance bias no values of
    those: q stands in for them (never read); without query_starts (batched), None."""
    given = {"cos": spec.rope, "sin": spec.rope, "q_norm": spec.qk_norm is not None,
             "k_norm": spec.qk_norm is not None, "query_starts": spec.flattened, "sinks": spec.sinks,
             "alibi": spec.alibi, "distance_bias": spec.distance_extent is not None}
    order = ["q", "k", "v", "cos", "sin", "q_norm", "k_norm", "k_cache", "v_cache", "block_tables", "cache_starts",
             "query_starts", "sinks", "alibi", "distance_bias"]
    present = [name for name in order if given.get(name, True)]
    absent = [name for name in order if not given.get(name, True)]
    return ", ".join(present) + " = tensors" + "".join(
        f"\n    {name} = {'None' if name == 'query_starts' else 'q'}" for name in absent)


def emit_cached_attention_module(spec: CachedAttentionSpec, name: str, header: str) -> str:
    """The whole kernel file: imports, the helpers, the `@triton.jit` kernel and its launcher.
    `header` goes first (the cache's key and provenance comment)."""
    pieces = spec.pieces
    width = max(pieces.width, padded_width(spec.value_dim))
    fields = {
        "name": name,
        "elem": TL_DTYPE[spec.dtype],
        "precision": ', input_precision="ieee"' if spec.dtype == torch.float32 else "",
        "dtype": str(spec.dtype),
        "pool_dtype": str(spec.pool_dtype),
        "fp8": spec.kv_scales is not None,
        "k_scale": repr(float(spec.kv_scales[0] if spec.kv_scales else 1.0)),
        "v_scale": repr(float(spec.kv_scales[1] if spec.kv_scales else 1.0)),
        "head_dim": spec.head_dim,
        "v_dim": spec.value_dim,
        "v_p": padded_width(spec.value_dim),
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
    return module_source(header, {"ad_mlir.codegen.templates.cached_attention_kernel": ["decode_splits", "prefill_blocks"]},
                         constants, body)


def cached_attention_spec(op: ad.CachedAttentionOp) -> CachedAttentionSpec:
    """The spec of a cached attention's kernel, in either layout (batched or flattened)."""
    return CachedAttentionSpec(
        head_dim=op.query.type.get_shape()[3],
        dtype=torch_dtype(op.query.type),
        scale=op.scale.value.data,
        rope=op.cos is not None,
        cos_dtype=torch_dtype(op.cos.type) if op.cos is not None else None,
        window=op.window.value.data if op.window is not None else None,
        softcap=op.softcap.value.data if op.softcap is not None else None,
        qk_norm=QkNorm.of_op(op),
        rotary_dim=rotary_dim_of(op) if op.cos is not None else None,
        interleaved=op.interleaved is not None,
        sinks=op.sinks is not None,
        alibi=op.alibi_slopes is not None,
        distance_extent=op.distance_bias.type.get_shape()[3] if op.distance_bias is not None else None,
        v_head_dim=v_dim if (v_dim := op.value.type.get_shape()[3]) != op.query.type.get_shape()[3] else None,
        flattened=op.query_starts is not None,
        kv_scales=(op.k_scale.value.data, op.v_scale.value.data) if op.k_scale is not None and op.v_scale is not None
        else None,
    )


_spec_builds = spec_check(cached_attention_spec)


def _check(op: ad.CachedAttentionOp) -> None:
    _spec_builds(op)
    if op.compressed is not None:
        raise NoKernelForm("the cached attention template has no compressed entries (DeepSeek-V4's CSA and HCA)")


EMITTER = KernelEmitter(
    lambda op, name, header: emit_cached_attention_module(cached_attention_spec(op), name, header),
    written=lambda op: operand_indices(op, (op.k_cache, op.v_cache, op.compressed_cache)),
    check=_check,
)
