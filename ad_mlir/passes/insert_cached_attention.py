"""`insert-cached-attention`: every causal attention becomes `ad.cached_attention` over K/V
caches, every short causal convolution `ad.cached_causal_conv1d` over a state, every recurrent
scan `ad.cached_ssm_scan` / `ad.cached_gated_delta_rule` over a state, and the history that
padded convolutions and shifts by tokens read an `ad.cached_token_window` over a state, each
cache a new argument of the function (AutoDeploy's cache-initialization stage); a graph left
with any other op that mixes token positions is refused.

For each `ad.rope_attention` (and plain `ad.attention`), in program order (what the fused op
does besides attention, its window, soft cap and QK-norm, the cached op does too):

- two arguments `k_cache_<i>` / `v_cache_<i>` of type [max-batch, max-seq-len, kv_heads,
  head_dim] in the key's dtype (the value cache of the value's head_dim where it differs:
  DeepSeek's MLA heads, whose full per-head K and V are cached, not the compressed latent), marked `ad.cache = "<layer> key|value"` (the layer is the
  attention's HF module path);
- once per function, `cache_slots` and `cache_starts` (tensor<?xi64>: each batch row's cache
  slot and the tokens that slot already holds), marked `ad.cache_slots` / `ad.cache_starts`;
  with `logits-indices=true` (as `ad_mlir.LLM` compiles) also `logits_indices` (tensor<?xi64>,
  marked `ad.logits_indices`): the step's token indices whose logits are computed, in every row
  (a prefill wants its last token's only), gathered before the LM head as in the paged form.

The RoPE of an `ad.rope_attention` (or `ad.rope`) carries over whole: its tables (whose width is
the rotary dim: partial rotary) and `interleaved`; the cache holds the keys rotated.

Gemma2's attention is no attention op but HF's eager form (matmul, scale, soft cap, + mask,
softmax, matmul: `attention_patterns.match_eager_attention`), which is matched whole and becomes
`ad.cached_attention` with `softcap` = the cap (q and k possibly the two results of one
`ad.rope`, which the cached op then applies itself). gpt-oss's eager form concatenates each
head's learned sink logit to the masked scores as one more softmax column and drops it after:
the sinks [heads] become the cached op's `sinks` operand. ALiBi (BLOOM, MPT): a bias added to
the scaled scores (MPT's eager form, whose mask is a boolean `masked_fill` that is True where it
masks; BLOOM's `baddbmm(bias, q, k^T)` over [batch * heads] rows, viewed as heads, with a bmm of
the values) is evaluated at max-seq-len tokens as the mask is: it must be `slope[h] * key
position` plus a constant per query, and its computation must hold the slopes ([heads], or MPT's
[1, heads, 1, 1], then viewed as [heads]), which become the op's `alibi_slopes`; anything else is
an error naming the layer. Inkling's relative bias (`patterns/distance_bias.py`: per-token
logits [batch, heads, seq, extent] gathered by the query-key distance and zeroed outside 0 ..
extent - 1, added to the scores or, through SDPA, the float mask `where(mask, bias, lowest)`)
becomes the op's `distance_bias`: the gather's index and zeroed positions are run at
max-seq-len tokens and must be exactly those (else an error naming the layer); per-query casts
and factors on the bias (Inkling's log scaling) apply to the logits. Inkling2's sink logit per
token ([batch, heads, seq, 1] concatenated to the scores) becomes `sinks` [batch, heads, seq]
(the paged form refuses it by name, as `PerSequenceState`). The pass runs before `decompose` (as
`ad_mlir.LLM`'s pipeline places it). The scores and probabilities must have no other user (with
a cache they would cover the new tokens only); a softmax that feeds a matmul but does not match
exactly is left alone, and the refusal below says why it is no attention form (OpenAI-GPT's
mask multiplied in from its triangular buffer in another form). XLM's scores, masked by an in-place
`masked_fill_` (True where masked) of a mask `expand_as` the scores, are matched as MPT's
`masked_fill` without a bias; so are CPM-Ant's, masked by `masked_fill` with a
`torch.scalar_tensor` fill and zeroed again after the softmax by `masked_fill(p, mask, 0)`, whose
mask must evaluate to the scores' one (it then zeroes only what the softmax made 0: a causal row
always attends to its own key). GPT-Neo's `where(mask, scores, fill)`
under HF's mask is matched: both masks are evaluated (the window is the narrower), the fill must be very
negative; the mask and fill read the model's buffer and a lifted constant, whose values the
compiler puts in scope (`attention_masks.constants_known`). OpenAI-GPT's
`scores * mask + (1 - mask) * fill` is matched the same way: its mask (a slice of its triangular
buffer) must hold only 0 and 1 and be causal where it is 1, and its fill at most
`MULTIPLIED_FILL_MAX`; its key, which it permutes straight to k^T, is permuted to heads first
for the cache. Doge's dynamic mask, a bias per key and kv head (computed from each key's own
value) put under HF's mask with `masked_fill` and repeated over the query heads
(`attention_patterns.match_key_bias`), is cached as one more head dim: the query gets a 1 and the
key the bias / scale (so the scaled scores gain the bias, and the cache keeps each key's bias with
it), the key and value lose their repeat_kv, and HF's mask is evaluated as a masked_fill mask. Its
bias's computation stays in the graph, where a token-mixing op would be refused below.

HF's short causal convolution (LFM2: a depthwise `conv1d` padded by kernel - 1 and cut back to
the sequence, `conv_patterns.match_short_conv`) becomes `ad.cached_causal_conv1d` over an
argument `conv_state_<i>` [max-batch, channels, kernel - 1] in the input's dtype, marked
`ad.cache = "<layer> conv_state"`: the inputs of the kernel - 1 tokens before a step.

Ops that read at most W tokens back from a sequence after W rows that hold no token
(`patterns/token_window.py`) get a cached token window: a left pad of W zero tokens read by
stacked valid convolutions whose spans, dilation x (kernel - 1) each, add up to W (ZAYA's CCA
q/k: a pad of (2 - 1) + (2 - 1) before convolutions of kernels 2 and 2), or by an
`unfold(-1, W + 1, 1)` after a cut to the pad's last seq + W rows, all of them (Inkling2's dynamic
short convolution: `F.pad(x, (k - 1, 0))[..., -(seq + k - 1):].unfold(-1, k, 1)`, the cut going
with the pad), and a shift by W tokens,
`cat([start, x])[:-W]` along a token axis whose W start rows are computed from no token (ZAYA's
delayed values, W = 1, start `v_proj_delayed(zeros)`). The pad, or the cat, becomes
`ad.cached_token_window` over an argument `token_window_<i>` (the input's shape with max-batch
slots and W tokens) in the input's dtype, marked `ad.cache = "<layer> token_window"`: the W rows
before a step, which the op puts in front of the step's tokens (at a sequence's start zeros, or
the shift's start rows), as HF's cache does. The convolutions run unchanged on those W + seq
rows, and each of their outputs is its own token's; the shift becomes the window's first seq
rows. A pad whose convolutions look back less or more than W, or a shift whose start rows read a
token, is left as it is and refused below.

HF's chunked scans, as the export patches route them (`frontends/export_patches.py`: one
opaque op over the whole sequence, `scan_patterns`), become their cached ops over an fp32 state
argument marked `ad.cache = "<layer> ssm_state|recurrent_state"`: Mamba2's
`ad_mlir.mamba2_chunk_scan` `ad.cached_ssm_scan` over `ssm_state_<i>` [max-batch, heads,
head_dim, state_size] (its D, dt_bias, softplus and time-step limits carried), the gated delta
rule's `ad_mlir.chunk_gated_delta_rule` `ad.cached_gated_delta_rule` over `recurrent_state_<i>`
[max-batch, value heads, key dim, value dim] (its q/k L2 norm carried), Mamba1's
`ad_mlir.selective_scan` `ad.cached_selective_scan` over `ssm_state_<i>` [max-batch, channels,
state_size] (its D, gate z, dt bias and softplus carried). HF keeps these states in fp32 too.

Multi-head latent attention (DeepSeek-V2/V3: `mla_patterns.match_mla`, an attention whose keys
and values HF expands from a normalized latent by `kv_b_proj`, the rotated key part shared by the
heads) becomes `ad.cached_mla_attention` over one argument `latent_cache_<i>` [max-batch,
max-seq-len, kv_lora_rank + qk_rope_head_dim] in the latent's dtype, marked `ad.cache = "<layer>
latent"`: the latent ++ rotated key part of each token, not the heads' K and V (at DeepSeek-V3's
sizes 576 values per token and layer instead of 128 heads x (192 + 128)). The expansion is erased;
the cached op absorbs `kv_b_proj` into the query and the output. An MLA that does not match
exactly is cached as plain attention over its expanded K and V (the log says why). An MLA with
sink logits (HY-V4's eager form) carries them over (`sinks`).

DeepSeek sparse attention (DeepSeek-V3.2, GLM-5, A.X K2, HY-V4, dots.3 note:
`sparse_attention.match_sparse_mask`, an MLA whose mask is the causal mask restricted to the
top-k keys of a lightning indexer) caches the indexer too: its `aten.topk` becomes
`ad.cached_index_topk` over an argument `index_key_cache_<i>` [max-batch, max-seq-len, index
head dim] in the key's dtype, marked `ad.cache = "<layer> index_key"` (each token's one index
key), and the cached MLA takes its result as `selected`; a layer whose mask reuses another's
topk (GLM-5's "shared" layers) gets the same selection. The indexer's own mask must be causal. A
sparse attention that is not MLA is refused by name, and the paged form refuses a sparse MLA or
one with sinks as `PerSequenceState` (`paged_where_possible` falls back to the slot form).

DeepSeek-V4's attention (`compressed_attention.match_compressed_keys`) concatenates its
compressor's entries to its one K = V head and the compressor's block bias to HF's mask: at
compress rate 1 (one entry per token) the entries become the cached op's `compressed` over an
argument `c_cache_<i>` [max-batch, max-seq-len, 1, head_dim] in the key's dtype, marked
`ad.cache = "<layer> compressed"`, attended causally without the window (HCA's bias's mask is
evaluated and must be causal). CSA's indexer (its mask evaluated, causal) becomes
`ad.cached_index_topk` over `index_key_cache_<j>`, its result the cached op's `selected`; each
previous-token shift of its entries' and index keys' computations (`cat([fill, x], 1)[:, :-1]`,
kv filled with 0, gates with -inf) is a shift by one token, a cached token window (above) with
the fill as its initial row. The concatenations and the block bias are erased. Other compress rates are
refused naming the layer, the kind and the rate; the paged form refuses the entries as
`PerSequenceState`.

After that, any op that still mixes token positions (`position_mixing.position_mixers`: another
convolution or scan over the sequence, an opaque state-space scan, a reduction or contraction
over a token axis, a shift, an attention softmax not matched, positions counted inside the graph)
is an error naming each op and its layer: a decode step would run it on its new tokens alone.
The pass is never skipped on error (`skippable_on_error`), so that error is what `LLM` raises.

The causal mask HF builds is dropped, with every op of its computation that nothing else
uses: the op masks causally with the cached offset. The pass evaluates the mask's computation
(it may read only the user inputs' shapes and position ids) at max-seq-len new tokens: a causal
mask is dropped, a sliding-window one becomes the op's `window`, anything else is an error
naming the layer. An additive (float) mask, as the eager form adds, must hold 0 where it attends
and a very negative number (at most half the dtype's lowest, or -inf) where it masks. RoPE
positions must come from a `position_ids` input (export the model with it, as
`ad_mlir.generate` does): with a cache the new tokens' positions are start + 0..seq-1.

A decoder whose forward takes no `position_ids` counts its positions itself: BART's, mBART's,
TrOCR's and BlenderBot's learned positional embedding, Pegasus' and Marian's sinusoidal table,
indexed by `arange(seq)` (plus BART's offset of 2); Inkling's log scaling of its full layers'
queries by `tau(arange(seq) + 1)`. Such a range
(`step_positions.match_step_positions`: from 0 by 1 over `input_ids`' sequence axis, int64, each
of its uses turned into positions by an embedding's indices, cos/sin or a cast to a float through
per-position ops only) gets the step's real positions, once the attentions are cached. In the slot form they are
each row's cache start + the range (`cache_starts[:, None] + arange(seq)`), flattened to [batch *
seq] so that the ops between the range and the table keep their types; where the looked-up rows
(one per position, no batch axis) meet the [batch, seq, ...] rows (the add to the token
embeddings, TrOCR's expand over the batch, Inkling's [1, 1, seq, 1] factor on the [batch, heads,
seq, head_dim] query), they are viewed as [batch, seq, ...] ([batch, 1, seq, 1]). In the paged
form they are the `position_ids` input [1, T], viewed as [T] (an argument added after the others
where the model has none). Whatever the model adds to the range (BART's 2) stays and applies to
the real positions. A range used in any other way (compared with each row's length, indexing
rows) is left alone and refused below, naming its layer.

With `paged=true` (vLLM's paged K/V, one flattened batch per step) each attention becomes
`ad.paged_attention` instead, over pools `k_pages_<i>` / `v_pages_<i>` [num-pages, page-size,
kv_heads, head_dim] (marked `ad.cache` as above), and the function gets, in this order, the
arguments `query_starts` [seqs + 1], `cache_starts` [seqs], `block_tables` [seqs,
max_pages_per_seq] and `logits_indices` [n] (all int64, marked `ad.query_starts`,
`ad.cache_starts`, `ad.block_tables`, `ad.logits_indices`; then `position_ids` [1, T] where the
pass gives a range the real positions and the model has none). The model must be exported with
batch 1 (`input_ids` and `position_ids` [1, T]: the step's tokens of every sequence, flattened).
The LM head runs only on the flattened tokens `logits_indices` (AutoDeploy's
`gather_logits_before_lm_head`): its input is gathered along the token axis, so the logits are
[1, n, vocab]; the LM head is the `ad.linear` that the logits come from, through
elementwise ops only (a cast, Gemma2's soft cap); without one the logits themselves are
gathered (their next-to-last axis must be the tokens', else the pass refuses). An MLA (matched
as above) becomes `ad.paged_mla_attention` with the same metadata over one pool
`latent_pages_<i>` [num-pages, page-size, kv_lora_rank + qk_rope_head_dim] in the latent's dtype,
marked `ad.cache = "<layer> latent"`: its pages hold the latent ++ rotated key part, not the
heads' K and V. States that are per
sequence (short convolutions, scans) are not paged but kept in pools of `max-batch` state slots
([max-batch, ...] as in the slot form), one slot per running sequence: the function gets one
more argument, `state_slots` [seqs] (int64, marked `ad.state_slots`, after `logits_indices`),
and each such op takes `query_starts` besides, so that it runs sequence by sequence over the
flattened tokens, sequence s from slot `state_slots[s]`, from a zero state where its
`cache_starts[s]` is 0 (`ad.cached_causal_conv1d`'s docstring); their kernels run every
sequence in one launch, reading `query_starts` on the device (`codegen/templates/state_rows.py`).
A model with such states and no attention has nothing to page and is refused (`PerSequenceState`),
as is a cached token window (its state is not paged yet: compile such a model in the slot form).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar, TypeVar

import torch
from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    ArrayAttr,
    DenseArrayBase,
    DictionaryAttr,
    Float32Type,
    Float64Type,
    FloatAttr,
    FunctionType,
    IndexType,
    IntegerAttr,
    ModuleOp,
    NameLoc,
    StringAttr,
    TensorType,
    UnitAttr,
    i64,
)
from xdsl.ir import Attribute, BlockArgument, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.transforms.dead_code_elimination import region_dce
from xdsl.utils.exceptions import PassFailedException

from ad_mlir.dialects import ad
from ad_mlir.passes.patterns.attention_masks import (
    MaskError,
    NotCausalWindow,
    alibi_slopes,
    backward_slice,
    causal_window,
    erase_computation,
    evaluate,
    input_name,
)
from ad_mlir.passes.patterns.attention_patterns import (
    Attention,
    match_eager_attention,
    match_key_bias,
    match_repeat_kv,
)
from ad_mlir.passes.patterns.compressed_attention import (
    CompressedKeys,
    Selection,
    UncachedCompression,
    match_compressed_keys,
)
from ad_mlir.passes.patterns.conv_patterns import ShortConv, match_short_conv
from ad_mlir.passes.patterns.distance_bias import (
    biased_mask,
    check_distance_bias,
    match_distance_bias,
    scaled_logits,
)
from ad_mlir.passes.patterns.matching import describe_op, erase_dead
from ad_mlir.passes.patterns.mla_patterns import Mla, match_mla
from ad_mlir.passes.patterns.scan_patterns import (
    GatedDeltaRule,
    SelectiveScan,
    SsmScan,
    match_gated_delta_rule,
    match_selective_scan,
    match_ssm_scan,
)
from ad_mlir.passes.patterns.sparse_attention import Indexer, SparseMask, match_sparse_mask
from ad_mlir.passes.patterns.step_positions import StepPositions, match_step_positions, rows_axis
from ad_mlir.passes.patterns.token_window import PaddedConvs, Shift, match_left_pad, match_shift
from ad_mlir.passes.position_mixing import position_mixers

log = logging.getLogger(__name__)
Match = TypeVar("Match")

POSITION_INPUT = "position_ids"
STATE_SLOTS_INPUT = "state_slots"
MIXERS_LISTED = 4
"""Position-mixing ops named in a refusal (the count says how many more)."""


class PerSequenceState(PassFailedException):
    """The paged form refused where the slot form caches the model: states kept per sequence with
    no attention to page, DeepSeek sparse attention's indexer (cached in slots only), MLA with
    sink logits, or sink logits per token (Inkling2's)."""


@dataclass(frozen=True)
class InsertCachedAttentionPass(ModulePass):
    """Attention -> `ad.cached_attention` over per-layer K/V cache arguments (module docstring)."""

    name = "insert-cached-attention"
    skippable_on_error: ClassVar[bool] = False
    """Its refusals name the layer and the op: skipped, they would reach `LLM` as a module
    without caches."""

    max_batch: int = 8
    """Cache slots: sequences that can be in flight at once."""
    max_seq_len: int = 2048
    """Tokens a slot holds (prompt + generated); with `paged`, the most a sequence holds (the
    length at which masks are evaluated)."""
    paged: bool = False
    """`ad.paged_attention` over page pools and one flattened batch (module docstring)."""
    page_size: int = 16
    """With `paged`: tokens a page holds (a power of two)."""
    num_pages: int = 256
    """With `paged`: pages of each pool."""
    logits_indices: bool = False
    """The slot form with a `logits_indices` argument: the LM head runs on those tokens only
    (the paged form always has it)."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.max_batch < 1 or self.max_seq_len < 1:
            raise PassFailedException(f"insert-cached-attention: max-batch {self.max_batch} and max-seq-len "
                                      f"{self.max_seq_len} must be positive")
        if self.paged and (self.page_size < 1 or self.page_size & (self.page_size - 1) or self.num_pages < 1):
            raise PassFailedException(f"insert-cached-attention: page-size {self.page_size} must be a power of two "
                                      f"and num-pages {self.num_pages} positive")
        for fn in op.ops:
            if isinstance(fn, func.FuncOp) and fn.body.blocks:
                if self.paged:
                    self._apply_paged(fn)
                else:
                    self._apply_to(fn)

    def _apply_paged(self, fn: func.FuncOp) -> None:
        """The paged, flattened form: `ad.paged_attention`s, their metadata and the gathered LM head."""
        found, missed = _find_attentions(fn)
        attentions, mlas = _split_mlas(found)
        for window in _find_token_windows(fn):
            raise PerSequenceState(
                f"{_layer(_window_op(window))}: a cached token window keeps a state per sequence, which the paged form "
                "(paged=true) does not hold: compile this model in the slot form (paged=false)")
        convs, scans = _find_short_convs(fn), _find_scans(fn)
        if not attentions and not mlas:
            if convs or scans:
                mixer = convs[0].conv if convs else scans[0].op
                raise PerSequenceState(
                    f"{_layer(mixer)}: the model keeps states per sequence but has no attention, so the paged form "
                    "(paged=true) has nothing to page: compile this model in the slot form (paged=false)")
            _refuse_uncached_mixers(fn, missed)
            log.info("insert-cached-attention: no attention in @%s", fn.sym_name.data)
            return
        metadata = [_append_argument(fn, TensorType(i64, shape), {ad.INPUT_ATTR: name, attr: ""})
                    for name, attr, shape in PAGED_METADATA]
        query_starts, cache_starts = metadata[:2]
        if convs or scans:
            state_slots = _append_argument(fn, TensorType(i64, [DYNAMIC_INDEX]),
                                           {ad.INPUT_ATTR: STATE_SLOTS_INPUT, ad.STATE_SLOTS_ATTR: ""})
            for i, conv in enumerate(convs):
                self._replace_conv(fn, conv, i, state_slots, cache_starts, query_starts)
            for i, scan in enumerate(scans):
                self._replace_scan(fn, scan, i, state_slots, cache_starts, query_starts)
        for i, attention in enumerate(attentions):
            self._replace(fn, attention, i, metadata[:3])
        for i, mla in enumerate(mlas):
            self._replace_paged_mla(fn, mla, i, metadata[:3])
        region_dce(fn.body)
        _positions_from_input(fn)
        _refuse_uncached_mixers(fn, missed)
        _gather_logits(fn, metadata[3])
        log.info("insert-cached-attention: %d attentions and %d MLAs paged (%d pages x %d tokens), %d short "
                 "convolutions and %d scans over %d state slots", len(attentions), len(mlas), self.num_pages,
                 self.page_size, len(convs), len(scans), self.max_batch)

    def _apply_to(self, fn: func.FuncOp) -> None:
        found, missed = _find_attentions(fn)
        attentions, mlas = _split_mlas(found)
        convs = _find_short_convs(fn)
        scans = _find_scans(fn)
        windows = _find_token_windows(fn)
        states = [*convs, *scans, *windows]
        if attentions or mlas or states:
            slots = _append_argument(fn, TensorType(i64, [DYNAMIC_INDEX]),
                                     {ad.INPUT_ATTR: "cache_slots", ad.CACHE_SLOTS_ATTR: ""})
            starts = _append_argument(fn, TensorType(i64, [DYNAMIC_INDEX]),
                                      {ad.INPUT_ATTR: "cache_starts", ad.CACHE_STARTS_ATTR: ""})
            for i, attention in enumerate(attentions):
                self._replace(fn, attention, i, [slots, starts])
            for i, conv in enumerate(convs):
                self._replace_conv(fn, conv, i, slots, starts)
            for i, scan in enumerate(scans):
                self._replace_scan(fn, scan, i, slots, starts)
            for i, window in enumerate(windows):
                self._replace_window(fn, window, i, slots, starts)
            indexers: dict[ad.TorchOp, SSAValue] = {}
            for i, mla in enumerate(mlas):
                self._replace_mla(fn, mla, i, slots, starts, indexers)
            for topk in indexers:
                erase_computation(topk.outputs[0], Rewriter.erase_op)
            region_dce(fn.body)
            _positions_from_starts(fn, starts)
        _refuse_uncached_mixers(fn, missed)
        if self.logits_indices and (attentions or mlas or states):
            _gather_logits(fn, _append_argument(fn, TensorType(i64, [DYNAMIC_INDEX]),
                                                {ad.INPUT_ATTR: "logits_indices", ad.LOGITS_INDICES_ATTR: ""}))
        if not attentions and not mlas and not states:
            log.info("insert-cached-attention: no attention in @%s (neither an attention op nor HF's eager "
                     "matmul/softmax form)", fn.sym_name.data)
            return
        log.info("insert-cached-attention: %d attentions, %d MLAs, %d short convolutions, %d scans and %d token windows "
                 "cached (%d slots x %d tokens)", len(attentions), len(mlas), len(convs), len(scans), len(windows),
                 self.max_batch, self.max_seq_len)

    def _replace_mla(self, fn: func.FuncOp, mla: Mla, i: int, slots: SSAValue, starts: SSAValue,
                     indexers: dict[ad.TorchOp, SSAValue]) -> None:
        """MLA's expanded attention -> `ad.cached_mla_attention` over a latent cache argument
        `latent_cache_<i>` [max-batch, max-seq-len, rank + rope] in the latent's dtype; under
        DeepSeek sparse attention's mask, with the selection of its indexer (`indexers`: those
        cached so far, by their `aten.topk`)."""
        attention = mla.attention
        layer = _layer(attention.output)
        sparse = self._sparse_mask(fn, attention, layer)
        selected: list[SSAValue] = []
        if sparse is not None:
            attention.mask = sparse.causal
            if sparse.indexer.topk not in indexers:
                indexers[sparse.indexer.topk] = self._cached_indexer(fn, sparse.indexer, layer, len(indexers), slots,
                                                                     starts)
            selected = [indexers[sparse.indexer.topk]]
        cache_type = self._latent_type(fn, mla, layer, [self.max_batch, self.max_seq_len])
        cache = _append_argument(fn, cache_type, {ad.INPUT_ATTR: f"latent_cache_{i}", ad.CACHE_ATTR: f"{layer} latent"})
        cached = ad.CachedMlaAttentionOp.build(
            operands=[mla.q_nope, mla.q_rope, mla.latent, mla.k_rope, mla.kv_b_weight, cache, slots, starts, selected,
                      _optional(attention.sinks)],
            properties={"scale": FloatAttr(attention.scale, Float64Type())},
            result_types=[attention.output.results[0].type])
        cached.location = attention.output.location
        Rewriter.replace_op(attention.output, cached)
        erase_dead(Rewriter.erase_op, [*attention.chain, *mla.ops, *(sparse.ops if sparse is not None else ())])
        if attention.mask is not None:
            erase_computation(attention.mask, Rewriter.erase_op)

    def _sparse_mask(self, fn: func.FuncOp, attention: Attention, layer: str) -> SparseMask | None:
        """DeepSeek sparse attention's selection in `attention`'s mask (`match_sparse_mask`),
        whose indexer must mask causally; None when the mask holds no selection; raises when it
        holds one of another form."""
        found = match_sparse_mask(attention.mask) if attention.mask is not None else None
        if isinstance(found, str):
            raise PassFailedException(f"{layer}: its attention mask selects keys by aten.topk, but {found}")
        if found is not None:
            try:
                mask = evaluate(fn, found.indexer.mask, self._inputs())
                if causal_window(mask) is not None:
                    raise MaskError("it is a sliding window")
            except MaskError as e:
                raise PassFailedException(f"{layer}: the mask of its sparse attention's indexer is not causal: {e}") \
                    from None
        return found

    def _cached_indexer(self, fn: func.FuncOp, indexer: Indexer | Selection, layer: str, i: int, slots: SSAValue,
                        starts: SSAValue) -> SSAValue:
        """`ad.cached_index_topk` over a cache argument `index_key_cache_<i>` [max-batch,
        max-seq-len, index head dim] in the key's dtype, placed before the `aten.topk` it replaces.
        It keeps at most max-seq-len keys: a slot holds no more (DeepSeek-V3.2's index_topk of 2048
        under a shorter cache would carry columns that are all -1)."""
        k = min(indexer.k, self.max_seq_len)
        key_type = indexer.key.type
        cache_type = TensorType(key_type.element_type, [self.max_batch, self.max_seq_len, key_type.get_shape()[2]])
        cache = _append_argument(fn, cache_type, {ad.INPUT_ATTR: f"index_key_cache_{i}",
                                                  ad.CACHE_ATTR: f"{layer} index_key"})
        batch, seq = indexer.query.type.get_shape()[:2]
        chosen = ad.CachedIndexTopkOp.build(
            operands=[indexer.query, indexer.key, indexer.weights, cache, slots, starts],
            properties={"scale": FloatAttr(indexer.scale, Float64Type()), "topk": IntegerAttr(k, i64)},
            result_types=[TensorType(i64, [batch, seq, k])])
        chosen.location = indexer.topk.location
        chosen.result.name_hint = "selected"
        Rewriter.insert_op(chosen, InsertPoint.before(indexer.topk))
        return chosen.result

    def _latent_type(self, fn: func.FuncOp, mla: Mla, layer: str, rows: list[int]) -> TensorType:
        """The type of MLA's cache of latent ++ rotated key part per token, [*rows, rank + rope] in
        the latent's dtype (rows: slots and tokens, or pages and page rows); a sliding-window MLA
        is refused."""
        if self._window(fn, mla.attention, layer) is not None:
            raise PassFailedException(f"{layer}: MLA under a sliding-window mask is not cached (only causal MLA is)")
        rank, rope = mla.latent.type.get_shape()[3], mla.k_rope.type.get_shape()[3]
        return TensorType(mla.latent.type.element_type, [*rows, rank + rope])

    def _replace_paged_mla(self, fn: func.FuncOp, mla: Mla, i: int, metadata: list[SSAValue]) -> None:
        """MLA's expanded attention -> `ad.paged_mla_attention` over a pool `latent_pages_<i>`
        [num-pages, page-size, rank + rope] in the latent's dtype (metadata: query_starts,
        cache_starts, block_tables)."""
        attention = mla.attention
        layer = _layer(attention.output)
        if self._sparse_mask(fn, attention, layer) is not None or attention.sinks is not None:
            raise PerSequenceState(
                f"{layer}: an MLA under DeepSeek sparse attention's key selection or with sink logits is cached in the "
                "slot form only (paged=false)")
        _refuse_batched(attention, layer, "MLA query")
        pool_type = self._latent_type(fn, mla, layer, [self.num_pages, self.page_size])
        pool = _append_argument(fn, pool_type, {ad.INPUT_ATTR: f"latent_pages_{i}", ad.CACHE_ATTR: f"{layer} latent"})
        paged = ad.PagedMlaAttentionOp.build(
            operands=[mla.q_nope, mla.q_rope, mla.latent, mla.k_rope, mla.kv_b_weight, pool, *metadata],
            properties={"scale": FloatAttr(attention.scale, Float64Type())},
            result_types=[attention.output.results[0].type])
        paged.location = attention.output.location
        Rewriter.replace_op(attention.output, paged)
        erase_dead(Rewriter.erase_op, [*attention.chain, *mla.ops])
        if attention.mask is not None:
            erase_computation(attention.mask, Rewriter.erase_op)

    def _replace_scan(self, fn: func.FuncOp, scan: SsmScan | GatedDeltaRule | SelectiveScan, i: int,
                      slots: SSAValue, starts: SSAValue, query_starts: SSAValue | None = None) -> None:
        """An opaque chunked scan -> its cached op over a state argument in fp32: Mamba2's
        `ssm_state_<i>` [max-batch, heads, head_dim, state_size], the gated delta rule's
        `recurrent_state_<i>` [max-batch, value heads, key dim, value dim]; in the paged form
        (`query_starts` given) over the flattened sequences, `slots` being their state slots."""
        if isinstance(scan, SelectiveScan):
            self._replace_selective_scan(fn, scan, i, slots, starts, query_starts)
            return
        if isinstance(scan, SsmScan):
            _, _, heads, head_dim = scan.input.type.get_shape()
            shape, role = [heads, head_dim, scan.b.type.get_shape()[3]], "ssm_state"
        else:
            _, _, v_heads, v_dim = scan.value.type.get_shape()
            shape, role = [v_heads, scan.key.type.get_shape()[3], v_dim], "recurrent_state"
        state = _append_argument(fn, TensorType(Float32Type(), [self.max_batch, *shape]),
                                 {ad.INPUT_ATTR: f"{role}_{i}", ad.CACHE_ATTR: f"{_layer(scan.op)} {role}"})
        if isinstance(scan, SsmScan):
            properties: dict[str, Attribute] = {"dt_min": FloatAttr(scan.dt_min, Float64Type())}
            if scan.dt_softplus:
                properties["dt_softplus"] = UnitAttr()
            if scan.dt_max is not None:
                properties["dt_max"] = FloatAttr(scan.dt_max, Float64Type())
            cached = ad.CachedSsmScanOp.build(
                operands=[scan.input, scan.dt, scan.a, scan.b, scan.c, _optional(scan.d), _optional(scan.dt_bias),
                          state, slots, starts, _optional(query_starts)],
                properties=properties, result_types=[scan.op.results[0].type])
        else:
            cached = ad.CachedGatedDeltaRuleOp.build(
                operands=[scan.query, scan.key, scan.value, scan.g, scan.beta, state, slots, starts,
                          _optional(query_starts)],
                properties={"use_qk_l2norm": UnitAttr()} if scan.use_qk_l2norm else {},
                result_types=[scan.op.results[0].type])
        cached.location = scan.op.location
        Rewriter.replace_op(scan.op, cached)

    def _replace_selective_scan(self, fn: func.FuncOp, scan: SelectiveScan, i: int, slots: SSAValue,
                                starts: SSAValue, query_starts: SSAValue | None) -> None:
        """Mamba1's opaque selective scan -> `ad.cached_selective_scan` over `ssm_state_<i>`
        [max-batch, channels, state_size] in fp32."""
        state_type = TensorType(Float32Type(), [self.max_batch, *scan.a.type.get_shape()])
        state = _append_argument(fn, state_type, {ad.INPUT_ATTR: f"ssm_state_{i}",
                                                  ad.CACHE_ATTR: f"{_layer(scan.op)} ssm_state"})
        cached = ad.CachedSelectiveScanOp.build(
            operands=[scan.input, scan.dt, scan.a, scan.b, scan.c, _optional(scan.d), _optional(scan.z),
                      _optional(scan.dt_bias), state, slots, starts, _optional(query_starts)],
            properties={"dt_softplus": UnitAttr()} if scan.dt_softplus else {},
            result_types=[scan.op.results[0].type])
        cached.location = scan.op.location
        Rewriter.replace_op(scan.op, cached)

    def _replace_conv(self, fn: func.FuncOp, conv: ShortConv, i: int, slots: SSAValue, starts: SSAValue,
                      query_starts: SSAValue | None = None) -> None:
        """The convolution and its cut -> `ad.cached_causal_conv1d` over a state argument
        [max-batch, channels, kernel - 1] in the input's dtype; in the paged form (`query_starts`
        given) over the flattened sequences, `slots` being their state slots."""
        channels, _, kernel = conv.weight.type.get_shape()
        state_type = TensorType(conv.input.type.element_type, [self.max_batch, channels, kernel - 1])
        state = _append_argument(fn, state_type, {ad.INPUT_ATTR: f"conv_state_{i}",
                                                  ad.CACHE_ATTR: f"{_layer(conv.conv)} conv_state"})
        cached = ad.CachedCausalConv1dOp.build(
            operands=[conv.input, conv.weight, _optional(conv.bias), state, slots, starts, _optional(query_starts)],
            result_types=[conv.cut.result.type],
        )
        cached.location = conv.conv.location
        Rewriter.replace_op(conv.cut, cached)
        Rewriter.erase_op(conv.conv)

    def _replace_window(self, fn: func.FuncOp, found: PaddedConvs | Shift, i: int, slots: SSAValue,
                        starts: SSAValue) -> None:
        """A left pad read by convolutions, or a shift by tokens -> `ad.cached_token_window` over a
        state argument `token_window_<i>` (the input's shape with max-batch slots and `width`
        tokens) in the input's dtype: the convolutions and unfolds read it as they read the pad
        (the cut to its last seq + width rows, all of them, goes); the shift is its first seq rows."""
        x, at = found.input, _window_op(found)
        shape = list(x.type.get_shape())
        shape[0], shape[found.dim] = self.max_batch, found.width
        state = _append_argument(fn, TensorType(x.type.element_type, shape),
                                 {ad.INPUT_ATTR: f"token_window_{i}", ad.CACHE_ATTR: f"{_layer(at)} token_window"})
        initial = [found.initial] if isinstance(found, Shift) else []
        window = ad.CachedTokenWindowOp.build(operands=[x, initial, state, slots, starts],
                                              properties={"dim": IntegerAttr(found.dim, i64)},
                                              result_types=[at.results[0].type])
        window.location = at.location
        window.result.name_hint = "window"
        if isinstance(found, PaddedConvs):
            Rewriter.replace_op(found.pad, window)
            if found.cut is not None:  # it keeps all of the window's rows too
                Rewriter.replace_op(found.cut, [], [window.result])
            return
        tokens = ad.SymSizeOp.build(operands=[x], properties={"dim": IntegerAttr(found.dim, i64)},
                                    result_types=[IndexType()])
        tokens.result.name_hint = "tokens"
        first = ad.SliceOp.build(operands=[window.result, [tokens.result]],
                                 properties={"dim": IntegerAttr(found.dim, i64),
                                             "static_bounds": DenseArrayBase.from_list(i64, [0, DYNAMIC_INDEX, 1])},
                                 result_types=[found.cut.result.type])
        for op in (tokens, first):
            op.location = found.cut.location
        Rewriter.insert_op([window, tokens], InsertPoint.before(found.cat))
        Rewriter.replace_op(found.cut, first)
        Rewriter.erase_op(found.cat)

    def _replace(self, fn: func.FuncOp, attention: Attention, i: int, metadata: list[SSAValue]) -> None:
        """`attention` -> `ad.cached_attention` (metadata: slots, starts) or, with `paged`,
        `ad.paged_attention` (metadata: query_starts, cache_starts, block_tables)."""
        layer = _layer(attention.output)
        if attention.rope is not None and not _reads_input(fn, attention.rope[0], POSITION_INPUT):
            raise PassFailedException(
                f"{layer}: the RoPE positions do not come from a '{POSITION_INPUT}' input; export the model with "
                f"{POSITION_INPUT} as an input so the cache can offset them")
        if self.paged:
            _refuse_batched(attention, layer, "query")
        compressed = self._compressed_keys(fn, attention, layer)  # first: CSA's mask holds a top-k too
        if self._sparse_mask(fn, attention, layer) is not None:
            raise PassFailedException(
                f"{layer}: DeepSeek sparse attention (a key selection by its indexer's top-k) is cached only over MLA "
                "in the slot form (paged=false); this attention is not MLA (the log says why)")
        distance_bias, bias_computed = self._distance_bias(fn, attention, layer)
        _bias_as_key_dim(attention)
        window = self._window(fn, attention, layer)
        if attention.key_seq_first:
            attention.key = _heads_first(attention.key)
        kind = "pages" if self.paged else "cache"
        caches = [_append_argument(fn, self._cache_type(x), {ad.INPUT_ATTR: f"{role[0]}_{kind}_{i}",
                                                             ad.CACHE_ATTR: f"{layer} {role}"})
                  for role, x in (("key", attention.key), ("value", attention.value))]
        entries: list[SSAValue | list] = [[], [], []]
        if compressed is not None:
            entries = [compressed.compressed, _append_argument(
                fn, self._cache_type(compressed.compressed),
                {ad.INPUT_ATTR: f"c_cache_{i}", ad.CACHE_ATTR: f"{layer} compressed"}), []]
            if compressed.selection is not None:
                entries[2] = self._csa_selection(fn, compressed, layer, metadata[0], metadata[1])
        properties: dict[str, Attribute] = {"scale": FloatAttr(attention.scale, Float64Type())}
        if attention.interleaved:
            properties["interleaved"] = UnitAttr()
        if window is not None:
            properties["window"] = IntegerAttr(window, i64)
        if attention.softcap is not None:
            properties["softcap"] = FloatAttr(attention.softcap, Float64Type())
        rope = list(attention.rope) if attention.rope is not None else [[], []]
        norm_weights: list[SSAValue | list] = [[], []]
        if attention.qk_norm is not None:
            *norm_weights, norm = attention.qk_norm
            properties |= norm.properties()
        sinks = [self._sinks(attention, layer)] if attention.sinks is not None else []
        slopes = [self._alibi_slopes(fn, attention, layer)] if attention.alibi is not None else []
        op_class = ad.PagedAttentionOp if self.paged else ad.CachedAttentionOp
        cached = op_class.build(
            operands=[attention.query, attention.key, attention.value, *rope, *norm_weights, *caches, *metadata,
                      sinks, slopes, distance_bias, *([] if self.paged else entries)],
            properties=properties,
            result_types=[attention.output.results[0].type],
        )
        cached.location = attention.output.location
        # the key count of the repeated keys ++ entries (2 x seq), computed by a torch op DCE keeps
        counts = [v.owner for op in attention.chain if isinstance(op, ad.ExpandOp) for v in op.operands
                  if isinstance(v.type, IndexType) and isinstance(v.owner, ad.TorchOp)] if compressed else []
        Rewriter.replace_op(attention.output, cached)
        erase_dead(Rewriter.erase_op, attention.chain)
        if compressed is not None:
            erase_dead(Rewriter.erase_op, [*compressed.ops, *counts])
            if compressed.selection is not None:
                erase_computation(compressed.selection.chosen, Rewriter.erase_op)
            else:
                erase_computation(compressed.hidden, Rewriter.erase_op)
        computations = (attention.mask, attention.alibi, attention.zeroed, *(attention.selected or ()),
                        *(attention.multiplied or ())[:1], bias_computed)
        for computed in dict.fromkeys(computations):  # CPM-Ant's two masks may be one value
            if computed is not None:
                erase_computation(computed, Rewriter.erase_op)

    def _distance_bias(self, fn: func.FuncOp, attention: Attention,
                       layer: str) -> tuple[list[SSAValue], SSAValue | None]:
        """([the per-token logits], the bias they replace) when the scores' bias (eager: added
        to the scores; SDPA: the float mask `where(mask, bias, lowest)`, which leaves the boolean
        mask) is Inkling's relative bias gathered by distance (`patterns/distance_bias.py`; the
        logits scaled per query as the bias was, by new ops before the attention); ([], None)
        for any other. A bias of that form gathered otherwise raises, naming the layer."""
        if attention.alibi is not None and (found := match_distance_bias(attention.alibi)) is not None:
            bias, attention.alibi = attention.alibi, None
        elif attention.mask is not None and not attention.mask_fills and (split := biased_mask(attention.mask)):
            bias = attention.mask
            attention.mask, found = split
        else:
            return [], None
        try:
            check_distance_bias(fn, found, self._inputs())
        except MaskError as e:
            raise PassFailedException(f"{layer}: {e}; only a bias gathered by the query-key distance can be "
                                      "cached") from None
        return [scaled_logits(found, InsertPoint.before(attention.output))], bias

    def _sinks(self, attention: Attention, layer: str) -> SSAValue:
        """The op's `sinks`: [heads] as matched, or a [batch, heads, seq, 1] column per token
        squeezed to [batch, heads, seq] (a new op before the attention; the slot form only)."""
        sinks = attention.sinks
        shape = sinks.type.get_shape()
        if len(shape) == 1:
            return sinks
        if self.paged:
            raise PerSequenceState(f"{layer}: its sink logits are one per token (Inkling2's); the paged form "
                                   "(paged=true) takes one per head only: compile it in the slot form")
        squeeze = ad.SqueezeOp.build(operands=[sinks], properties={"dim": DenseArrayBase.from_list(i64, [3])},
                                     result_types=[TensorType(sinks.type.element_type, shape[:3])])
        squeeze.location = attention.output.location
        Rewriter.insert_op(squeeze, InsertPoint.before(attention.output))
        return squeeze.result

    def _compressed_keys(self, fn: func.FuncOp, attention: Attention, layer: str) -> CompressedKeys | None:
        """DeepSeek-V4's compressed entries concatenated to `attention`'s keys
        (`match_compressed_keys`), taken apart: the attention's key, value and mask become the
        sliding-window ones. Only those at compress rate 1 are cached (one entry per token, seen
        causally, CSA's as its indexer chooses), in the slot form; other forms are refused by name."""
        found = match_compressed_keys(attention)
        if found is None:
            return None
        if isinstance(found, UncachedCompression):
            raise PassFailedException(
                f"{layer}: its keys concatenate the compressed K/V entries of {found.describe()}, which are not "
                "cached (only DeepSeek-V4's CSA and HCA at compress rate 1 as transformers 5.24 writes them are: one "
                "entry per token)")
        if self.paged:
            raise PerSequenceState(f"{layer}: DeepSeek-V4's compressed K/V entries are cached in the slot form only "
                                   "(paged=false)")
        try:
            hidden = found.hidden if found.selection is None else found.selection.future
            if causal_window(~evaluate(fn, hidden, self._inputs())) is not None:
                raise MaskError("it is a sliding window")
        except MaskError as e:
            raise PassFailedException(f"{layer}: the mask of its DeepSeek-V4 compressed entries is not causal: {e}") \
                from None
        attention.key = attention.value = found.key
        attention.mask = found.mask
        return found

    def _csa_selection(self, fn: func.FuncOp, compressed: CompressedKeys, layer: str, slots: SSAValue,
                       starts: SSAValue) -> SSAValue:
        """CSA's indexer at compress rate 1 as `ad.cached_index_topk` over its own index-key cache
        (its result replaces HF's chosen entries). The previous-token shifts of the entries' and
        the index keys' computations are shifts by one token (`token_window.match_shift`), each
        its own cached token window (`_replace_window`)."""
        selection = compressed.selection
        chosen = self._cached_indexer(fn, selection, layer, _roles(fn, "index_key"), slots, starts)
        selection.chosen.replace_all_uses_with(chosen)
        return chosen

    def _cache_type(self, x: SSAValue) -> TensorType:
        """[max-batch, max-seq-len, kv_heads, head_dim] of the key's or the value's heads (a value
        head dim of its own gets a value cache of its own width); with `paged`, [num-pages,
        page-size, kv_heads, head_dim]."""
        _, heads, _, head_dim = x.type.get_shape()
        size = [self.num_pages, self.page_size] if self.paged else [self.max_batch, self.max_seq_len]
        return TensorType(x.type.element_type, [*size, heads, head_dim])

    def _window(self, fn: func.FuncOp, attention: Attention, layer: str) -> int | None:
        """None for causal attention, the window of a sliding-window mask; raises otherwise."""
        if attention.mask is None and attention.selected is None and attention.multiplied is None:
            if not attention.causal:
                raise PassFailedException(f"{layer}: attention without a mask and not causal cannot be cached")
            return attention.window
        try:
            windows = []
            if attention.mask is not None:
                mask = evaluate(fn, attention.mask, self._inputs())
                if attention.mask_fills:  # masked_fill's mask: True where masked
                    if mask.dtype != torch.bool:
                        raise MaskError(f"its masked_fill mask is {mask.dtype}, not boolean")
                    if attention.zeroed is not None:
                        self._check_zeroed(fn, attention.zeroed, mask)
                    mask = ~mask
                windows.append(causal_window(mask))
            if attention.selected is not None:  # GPT-Neo's where(mask, scores, fill): both masks apply
                windows.append(self._selected_window(fn, *attention.selected))
            if attention.multiplied is not None:  # OpenAI-GPT's scores * mask + (1 - mask) * fill
                windows.append(self._multiplied_window(fn, *attention.multiplied))
            return min((w for w in windows if w is not None), default=None)
        except NotCausalWindow as e:
            raise PassFailedException(f"{layer}: {e}; only those can be cached") from None
        except MaskError as e:
            raise PassFailedException(f"{layer}: {e}") from None

    def _check_zeroed(self, fn: func.FuncOp, zeroed: SSAValue, masked: torch.Tensor) -> None:
        """CPM-Ant's mask that zeroes the probabilities after the softmax must be the scores'
        masked_fill mask `masked` (evaluated); a MaskError otherwise."""
        values = evaluate(fn, zeroed, self._inputs())
        try:
            same = values.dtype == torch.bool and torch.equal(*torch.broadcast_tensors(values, masked))
        except RuntimeError:  # shapes that do not broadcast together
            same = False
        if not same:
            raise MaskError("its probabilities are zeroed after the softmax under a mask other than its scores' one")

    def _selected_window(self, fn: func.FuncOp, mask: SSAValue, fill: SSAValue) -> int | None:
        """The window of `where(mask, scores, fill)`'s boolean mask, whose fill must mask (very
        negative: at most half the dtype's lowest); a MaskError otherwise."""
        window = causal_window(evaluate(fn, mask, self._inputs()))
        value = evaluate(fn, fill, self._inputs())
        if not value.is_floating_point() or float(value.max()) > torch.finfo(value.dtype).min / 2:
            raise MaskError(f"its masked scores are filled with {float(value.max())}, not a very negative number")
        return window

    def _multiplied_window(self, fn: func.FuncOp, mask: SSAValue, fill: float) -> int | None:
        """The window of `scores * mask + (1 - mask) * fill`'s mask, which must hold only 0 and 1
        (the scores where 1: the sum is then exactly the scores or exactly the fill), whose fill must
        be at most `MULTIPLIED_FILL_MAX`; a MaskError otherwise."""
        if fill > MULTIPLIED_FILL_MAX:
            raise MaskError(f"its scores are masked as scores * mask + (1 - mask) * {fill}: the fill is not at most "
                            f"{MULTIPLIED_FILL_MAX}")
        values = evaluate(fn, mask, self._inputs())
        if not values.is_floating_point() or not torch.all((values == 0) | (values == 1)):
            raise MaskError("its scores are masked as scores * mask + (1 - mask) * fill by a mask that holds values "
                            "other than 0 and 1")
        return causal_window(values == 1)

    def _alibi_slopes(self, fn: func.FuncOp, attention: Attention, layer: str) -> SSAValue:
        """The [heads] slopes of the bias added to the scores, which must be ALiBi's (viewed as
        [heads], once for every layer, when the graph holds them as [1, heads, 1, 1]); raises
        otherwise."""
        heads = attention.query.type.get_shape()[1]
        try:
            slopes = alibi_slopes(fn, attention.alibi, heads, self._inputs())
        except MaskError as e:
            raise PassFailedException(f"{layer}: {e}; only ALiBi's bias can be cached") from None
        if slopes.type.get_shape() == (heads,):
            return slopes
        viewed = TensorType(slopes.type.element_type, [heads])
        done = next((u.operation for u in slopes.uses if isinstance(u.operation, ad.ReshapeOp)
                     and u.operation.result.type == viewed), None)
        if done is not None:
            return done.result
        view = ad.ReshapeOp.build(operands=[slopes, []], properties={"static_sizes": DenseArrayBase.from_list(i64, [heads])},
                                  result_types=[viewed])
        Rewriter.insert_op(view, InsertPoint.after(slopes.owner))
        return view.result

    def _inputs(self) -> dict[str, torch.Tensor]:
        """Inputs of max-seq-len new tokens, at which the mask and bias computations run."""
        n = self.max_seq_len
        return {"input_ids": torch.zeros(1, n, dtype=torch.int64), POSITION_INPUT: torch.arange(n)[None, :]}


MULTIPLIED_FILL_MAX = -1e4
"""The largest fill of OpenAI-GPT's `scores * mask + (1 - mask) * fill` taken as masking (HF's
is -1e4). Its masked logits are exactly the fill (a finite score times 0 is 0), so each masked
probability is exp(fill - row max) / sum, and exp underflows to exactly 0 in fp32 (and in the
fp32 softmax of bf16 and fp16 inputs) below -104 (half the smallest subnormal, 2^-150): the
result is the causal kernel's exactly for every row with an attended score above fill + 104
(-9896 for -1e4), which the query's own key is in any row whose scores are not all hugely negative."""


PAGED_METADATA = (
    ("query_starts", ad.QUERY_STARTS_ATTR, [DYNAMIC_INDEX]),
    ("cache_starts", ad.CACHE_STARTS_ATTR, [DYNAMIC_INDEX]),
    ("block_tables", ad.BLOCK_TABLES_ATTR, [DYNAMIC_INDEX, DYNAMIC_INDEX]),
    ("logits_indices", ad.LOGITS_INDICES_ATTR, [DYNAMIC_INDEX]),
)
"""The metadata arguments of a paged function, in order: name, marking attribute, shape (int64)."""


def _gather_logits(fn: func.FuncOp, indices: SSAValue) -> None:
    """The LM head's input gathered at `indices` along the token axis (`aten.index_select`), so
    the LM head and what follows it (elementwise) run on those tokens only. Logits that come
    from no `ad.linear` through elementwise ops are gathered themselves (the same rows, without
    the saving), when their next-to-last axis is the tokens'."""
    returned = fn.body.block.last_op
    logits = returned.operands[0] if isinstance(returned, func.ReturnOp) and returned.operands else None
    head = _lm_head(logits) if logits is not None else None
    if head is None and (logits is None or not _token_axis_is_next_to_last(logits)):
        what = describe_op(logits.owner) if logits is not None and isinstance(logits.owner, Operation) else "no op"
        raise PassFailedException(
            f"insert-cached-attention: the logits (the function's first result, from {what}) do not come from an "
            "ad.linear LM head through elementwise ops, nor are they [..., tokens, vocab], so they cannot be "
            "computed for the logits_indices tokens alone")
    rows = head.input if head is not None else logits
    gather = ad.TorchOp.build(
        operands=[[rows, indices]], result_types=[[rows.type]],
        properties={"target": StringAttr("aten.index_select.default"),
                    "args": ArrayAttr([ad.OperandRefAttr(0), IntegerAttr(len(rows.type.get_shape()) - 2, i64),
                                       ad.OperandRefAttr(1)]),
                    "kwargs": DictionaryAttr({})})
    if head is not None:
        gather.location = head.location
        gather.results[0].name_hint = "logits_rows"
        Rewriter.insert_op(gather, InsertPoint.before(head))
        head.operands[0] = gather.results[0]
    else:
        log.info("insert-cached-attention: the logits come from %s, not an ad.linear LM head: the logits are "
                 "gathered, not its input", describe_op(logits.owner) if isinstance(logits.owner, Operation) else "an argument")
        Rewriter.insert_op(gather, InsertPoint.before(returned))
        returned.operands[0] = gather.results[0]


def _lm_head(logits: SSAValue) -> ad.LinearOp | None:
    """The `ad.linear` the logits come from through elementwise ops and casts that have no
    other per-token operand, or None."""
    value: SSAValue | None = logits
    while value is not None and not isinstance(value.owner, ad.LinearOp):
        owner = value.owner
        per_token = [v for v in getattr(owner, "operands", ()) if _has_token_axis(v)]
        value = per_token[0] if isinstance(owner, ad.ElementwiseOp | ad.CastOp) and len(per_token) == 1 else None
    return value.owner if value is not None else None


def _token_axis_is_next_to_last(value: SSAValue) -> bool:
    return isinstance(value.type, TensorType) and len(value.type.get_shape()) >= 2 and \
        value.type.get_shape()[-2] == DYNAMIC_INDEX


def _has_token_axis(value: SSAValue) -> bool:
    """A tensor with a dynamic dim (the flattened tokens'); weights and scalars have none."""
    return isinstance(value.type, TensorType) and DYNAMIC_INDEX in value.type.get_shape()


def _refuse_batched(attention: Attention, layer: str, what: str) -> None:
    """The paged form takes a step's tokens as one flattened sequence: `attention`'s query must
    have batch 1 (`what` names the query in the error)."""
    batch = attention.query.type.get_shape()[0]
    if batch != 1:
        raise PassFailedException(
            f"{layer}: the paged form takes the step's tokens as one flattened sequence, but the {what}'s batch "
            f"is {batch}, not 1: export the model with input_ids [1, tokens] (ad_mlir.llm.cache_export.export_for_cache with flat=True)")


def _refuse_uncached_mixers(fn: func.FuncOp, missed: dict[Operation, str]) -> None:
    """Raise naming every op left that mixes token positions: with a cache, a decode step would
    run it on the new tokens alone, without the earlier ones it reads (a silently wrong token).
    `missed`: softmaxes that weigh values but whose attention did not match, with why (named first)."""
    mixers = position_mixers(fn)
    if mixers:
        listed = "; ".join(m.describe() for m in mixers[:MIXERS_LISTED])
        more = f" (and {len(mixers) - MIXERS_LISTED} more)" if len(mixers) > MIXERS_LISTED else ""
        unmatched = [(op, why) for op, why in missed.items() if any(m.op is op for m in mixers)]
        others = f" (and {len(unmatched) - 1} more)" if len(unmatched) > 1 else ""
        spelled = (f"the attention at {_layer(unmatched[0][0])}{others} is no form it caches: {unmatched[0][1]}; "
                   if unmatched else "")
        raise PassFailedException(
            f"insert-cached-attention: {spelled}{len(mixers)} op(s) mix token positions outside the cached attention, and "
            f"nothing caches their state between steps, so generation would be wrong: {listed}{more}. Models with "
            "such sequence mixers (scans other than Mamba's and the gated delta rule's; linear "
            "attention; convolutions other than HF's causal short convolution; attention forms not matched as "
            "attention) are not supported for generation yet")


def _positions_from_starts(fn: func.FuncOp, starts: SSAValue) -> None:
    """The slot form: a range counting the step's tokens as positions (`match_step_positions`)
    becomes each row's real ones, its cache start + 0..seq-1, flattened to [batch * seq] so that
    the per-position ops keep their types; where those meet the rows, they are viewed as
    [batch, 1.., seq, ...] (the token axis where the rows have it)."""
    for found in _step_positions(fn, batched=True):
        arange = found.arange
        column, row = _unsqueezed(starts, 1), _unsqueezed(arange.result, 0)
        grid = ad.AddOp(column.result, row.result, TensorType(i64, [DYNAMIC_INDEX, DYNAMIC_INDEX]))
        flat = _viewed(grid.result, [], [-1])
        batch = ad.SymSizeOp.build(operands=[found.input_ids], properties={"dim": IntegerAttr(0, i64)},
                                   result_types=[IndexType()])
        new_ops = [column, row, grid, flat, batch]
        for op in new_ops:
            op.location = arange.location
        Rewriter.insert_op(new_ops, InsertPoint.after(arange))
        flat.result.name_hint = "positions"
        arange.result.replace_uses_with_if(flat.result, lambda use, keep=row: use.operation is not keep)
        for op, index in found.meetings:
            value = op.operands[index]
            rest = list(value.type.get_shape()[value.type.get_shape().index(DYNAMIC_INDEX) + 1:])
            ones = [1] * (rows_axis(value, op.results[0]) - 1)
            view = _viewed(value, [batch.result, arange.end], [DYNAMIC_INDEX, *ones, DYNAMIC_INDEX, *rest])
            view.location = op.location
            Rewriter.insert_op(view, InsertPoint.before(op))
            op.operands[index] = view.result
        log.info("insert-cached-attention: the positions counted at %s start at each row's cache start",
                 _layer(arange))


def _positions_from_input(fn: func.FuncOp) -> None:
    """The paged form: a range counting the step's tokens as positions (`match_step_positions`)
    becomes the `position_ids` input [1, tokens] (an argument added where the model has none),
    viewed as [tokens]."""
    found = _step_positions(fn, batched=False)
    if not found:
        return
    given = [a for a in fn.body.block.args if input_name(fn, a) == POSITION_INPUT]
    positions = given[0] if given else _append_argument(fn, TensorType(i64, [1, DYNAMIC_INDEX]),
                                                        {ad.INPUT_ATTR: POSITION_INPUT})
    flat = _viewed(positions, [], [-1])
    flat.location = found[0].arange.location
    Rewriter.insert_op(flat, InsertPoint.at_start(fn.body.block))
    flat.result.name_hint = "positions"
    for f in found:
        log.info("insert-cached-attention: the positions counted at %s are the %s input", _layer(f.arange),
                 POSITION_INPUT)
        size = f.arange.end.owner
        f.arange.result.replace_all_uses_with(flat.result)
        erase_dead(Rewriter.erase_op, [f.arange, size])


def _step_positions(fn: func.FuncOp, batched: bool) -> list[StepPositions]:
    """The ranges of `fn` that count the step's tokens as positions, in program order, among
    those the mixer check would refuse; why another one is not, to the log."""
    found = []
    for mixer in position_mixers(fn):
        if not isinstance(mixer.op, ad.ArangeOp):
            continue
        match = match_step_positions(fn, mixer.op, batched)
        if isinstance(match, str):
            log.info("insert-cached-attention: the range at %s does not take the step's positions: %s",
                     _layer(mixer.op), match)
        elif match is not None:
            found.append(match)
    return found


def _unsqueezed(value: SSAValue, dim: int) -> ad.UnsqueezeOp:
    shape = list(value.type.get_shape())
    return ad.UnsqueezeOp.build(operands=[value], properties={"dim": IntegerAttr(dim, i64)},
                                result_types=[TensorType(value.type.element_type, [*shape[:dim], 1, *shape[dim:]])])


def _viewed(value: SSAValue, sizes: list[SSAValue], static: list[int]) -> ad.ReshapeOp:
    """`value` reshaped to `static` (DYNAMIC_INDEX where `sizes` gives the size, -1 inferred)."""
    shape = [DYNAMIC_INDEX if d in (DYNAMIC_INDEX, -1) else d for d in static]
    return ad.ReshapeOp.build(operands=[value, sizes], properties={"static_sizes": DenseArrayBase.from_list(i64, static)},
                              result_types=[TensorType(value.type.element_type, shape)])


def _split_mlas(attentions: list[Attention]) -> tuple[list[Attention], list[Mla]]:
    """(the attentions that are not MLA, the MLAs): MLA caches its latent, not K and V."""
    mlas = {id(a): m for a in attentions if (m := _logged(match_mla(a), a.output, "MLA attention")) is not None}
    return [a for a in attentions if id(a) not in mlas], list(mlas.values())


def _find_scans(fn: func.FuncOp) -> list[SsmScan | GatedDeltaRule | SelectiveScan]:
    """HF's scans (the opaque ops of the export patches) of `fn`, in program order."""
    ops = [op for op in fn.body.block.ops if isinstance(op, ad.TorchOp)]
    return [m for op in ops
            if (m := match_ssm_scan(op) or match_gated_delta_rule(op) or match_selective_scan(op)) is not None]


def _optional(value: SSAValue | None) -> list[SSAValue]:
    return [value] if value is not None else []


def _find_token_windows(fn: func.FuncOp) -> list[PaddedConvs | Shift]:
    """The left pads of tokens read by convolutions and the shifts by tokens of `fn`
    (`token_window`), in program order."""
    found = []
    for op in fn.body.block.ops:
        if isinstance(op, ad.TorchOp) and (match := _logged(match_left_pad(op), op, "pad")) is not None:
            found.append(match)
        elif isinstance(op, ad.CatOp) and (match := _logged(match_shift(op), op, "cat")) is not None:
            found.append(match)
    return found


def _window_op(found: PaddedConvs | Shift) -> Operation:
    """The op a cached token window replaces: the pad, or the shift's cat."""
    return found.pad if isinstance(found, PaddedConvs) else found.cat


def _find_short_convs(fn: func.FuncOp) -> list[ShortConv]:
    """HF's short causal convolutions of `fn`, in program order."""
    matches = (_logged(match_short_conv(op), op, "conv1d") for op in fn.body.block.ops if isinstance(op, ad.TorchOp))
    return [m for m in matches if m is not None]


def _find_attentions(fn: func.FuncOp) -> tuple[list[Attention], dict[Operation, str]]:
    """The attentions of `fn` in program order (attention ops and matched eager forms), and the
    softmaxes that weigh values but do not match, with why."""
    found, missed = [], {}
    for op in fn.body.block.ops:
        if isinstance(op, ad.RopeAttentionOp | ad.AttentionOp):
            found.append(_from_attention_op(op))
        elif isinstance(op, ad.SoftmaxOp):
            match = match_eager_attention(op)
            if isinstance(match, str):
                missed[op] = match
            if (match := _logged(match, op, "softmax")) is not None:
                found.append(match)
    return found, missed


def _logged(match: Match | str | None, op: Operation, what: str) -> Match | None:
    """A matcher's result: the match, or None; why a near miss is not cached goes to the log."""
    if isinstance(match, str):
        log.info("insert-cached-attention: the %s at %s is not cached: %s", what, _layer(op), match)
        return None
    return match


def _from_attention_op(op: ad.RopeAttentionOp | ad.AttentionOp) -> Attention:
    scale = op.scale.value.data if op.scale is not None else op.key.type.get_shape()[3] ** -0.5
    attention = Attention(op, op.query, op.key, op.value, None, op.attn_mask, op.is_causal is not None, scale)
    if isinstance(op, ad.RopeAttentionOp):
        attention.rope = (op.cos, op.sin)
        attention.interleaved = op.interleaved is not None
        attention.window = op.window.value.data if op.window is not None else None
        attention.softcap = op.softcap.value.data if op.softcap is not None else None
        if op.q_norm_weight is not None:
            attention.qk_norm = (op.q_norm_weight, op.k_norm_weight, ad.QkNorm.of_op(op))
    return attention


def _layer(op: Operation) -> str:
    return op.location.desc.data if isinstance(op.location, NameLoc) else op.name


def _append_argument(fn: func.FuncOp, arg_type: TensorType, attrs: dict[str, str]) -> BlockArgument:
    block = fn.body.block
    arg = block.insert_arg(arg_type, len(block.args))
    arg.name_hint = attrs[ad.INPUT_ATTR]
    arg_attrs = list(fn.arg_attrs.data) if fn.arg_attrs else [DictionaryAttr({}) for _ in block.args[:-1]]
    arg_attrs.append(DictionaryAttr({k: StringAttr(v) for k, v in attrs.items()}))
    fn.arg_attrs = ArrayAttr(arg_attrs)
    fn.function_type = FunctionType.from_lists([a.type for a in block.args], fn.function_type.outputs.data)
    return arg


def _roles(fn: func.FuncOp, role: str) -> int:
    """The cache arguments of `fn` so far whose `ad.cache` role is `role` (to number the next)."""
    return sum(1 for attrs in (fn.arg_attrs.data if fn.arg_attrs else ())
               if ad.CACHE_ATTR in attrs.data and attrs.data[ad.CACHE_ATTR].data.endswith(f" {role}"))


def _bias_as_key_dim(attention: Attention) -> None:
    """Doge's dynamic mask (`match_key_bias`: a bias per key and kv head, under HF's mask) as one
    more head dim: the query gets a 1 and the key bias / scale, so that the scaled scores gain
    the bias (the cache holds each key's bias with it); HF's mask stays the attention's, a
    masked_fill mask. The key and value lose their repeat_kv. Nothing changes for another mask."""
    heads = attention.query.type.get_shape()[1]
    found = match_key_bias(attention.mask, heads) if attention.mask is not None and not attention.mask_fills \
        and attention.rope is None and attention.alibi is None else None
    if found is None:
        return
    bias, masked, ops = found
    (key, key_ops), (value, value_ops) = (match_repeat_kv(x, heads) for x in (attention.key, attention.value))
    kv_heads = bias.type.get_shape()[1]
    if key.type.get_shape()[1] != kv_heads or value.type.get_shape()[1] != kv_heads:
        return
    at = InsertPoint.before(attention.output)
    query, dtype = attention.query, attention.query.type.element_type
    sizes = [ad.SymSizeOp.build(operands=[query], properties={"dim": IntegerAttr(d, i64)}, result_types=[IndexType()])
             for d, n in enumerate(query.type.get_shape()[:3]) if n == DYNAMIC_INDEX]
    one = ad.ConstantOp(FloatAttr(1.0, Float64Type()))
    ones = ad.FullOp.build(operands=[[s.result for s in sizes], one.result],
                           properties={"static_size": DenseArrayBase.from_list(i64, [*query.type.get_shape()[:3], 1])},
                           result_types=[TensorType(dtype, [*query.type.get_shape()[:3], 1])])
    column = ad.UnsqueezeOp.build(operands=[bias], properties={"dim": IntegerAttr(3, i64)},
                                  result_types=[TensorType(bias.type.element_type, [*bias.type.get_shape(), 1])])
    inverse = ad.ConstantOp(FloatAttr(1 / attention.scale, Float64Type()))
    scaled = ad.MulOp(column.result, inverse.result, column.result.type)
    new_ops: list[Operation] = [*sizes, one, ones, column, inverse, scaled]
    if bias.type.element_type != key.type.element_type:
        new_ops.append(ad.CastOp(scaled.result, TensorType(key.type.element_type, column.result.type.get_shape())))
    widened = [ad.CatOp.build(operands=[[x, extra]], properties={"dim": IntegerAttr(3, i64)},
                              result_types=[TensorType(x.type.element_type, [*x.type.get_shape()[:3],
                                                                             x.type.get_shape()[3] + 1])])
               for x, extra in ((query, ones.result), (key, new_ops[-1].results[0]))]
    Rewriter.insert_op([*new_ops, *widened], at)
    attention.query, attention.key, attention.value = widened[0].result, widened[1].result, value
    attention.mask, attention.mask_fills = masked, True
    attention.chain += [*ops, *key_ops, *value_ops]


def _heads_first(key: SSAValue) -> SSAValue:
    """[batch, seq, heads, head_dim] `key` permuted to [batch, heads, seq, head_dim], placed
    right after it."""
    b, s, h, d = key.type.get_shape()
    permute = ad.PermuteOp.build(operands=[key], properties={"dims": DenseArrayBase.from_list(i64, [0, 2, 1, 3])},
                                 result_types=[TensorType(key.type.element_type, [b, h, s, d])])
    Rewriter.insert_op(permute, InsertPoint.after(key.owner) if isinstance(key.owner, Operation)
                       else InsertPoint.at_start(key.owner))
    return permute.result


def _reads_input(fn: func.FuncOp, value: SSAValue, name: str) -> bool:
    return any(input_name(fn, a) == name for a in backward_slice(value)[1])


