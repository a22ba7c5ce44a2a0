"""Attention, cached: each `ad.rope_attention` (and plain `ad.attention`), and each of HF's eager
attention forms matched whole (`attention_patterns.match_eager_attention`), becomes
`ad.cached_attention` over K/V page pools: in the slot form its batch rows over the slots (pools
of max-seq-len-token pages, the block tables one slot wide), with `paged` one flattened batch over
pages of page-size tokens (`query_starts` besides). What the fused op does besides attention, its
window, soft cap and QK-norm, the cached op does too.

- Two arguments `k_cache_<i>` / `v_cache_<i>` of type [max-batch, max-seq-len, kv_heads,
  head_dim] in the key's dtype, or with `kv-cache-dtype=fp8` in f8E4M3FN, the cached op then
  quantizing with `k_scale` = `v_scale` = 1.0 (vLLM's default without a checkpoint's scales)
  (the value cache of the value's head_dim where it differs: an MLA
  cached as plain attention, whose full per-head K and V are cached, not its latent), marked
  `ad.cache = "<layer> key|value"` (the layer is the attention's HF module path); paged,
  `k_pages_<i>` / `v_pages_<i>` [num-pages, page-size, kv_heads, head_dim].
- The RoPE of an `ad.rope_attention` (or `ad.rope`) carries over whole: its tables (whose width
  is the rotary dim: partial rotary) and `interleaved`; the cache holds the keys rotated. RoPE
  positions must come from a `position_ids` input (export the model with it, as
  `ad_mlir.generate` does): with a cache the new tokens' positions are start + 0..seq-1.
- Its mask is evaluated and dropped (`masks.py`); what the eager forms add to the scores (sinks,
  ALiBi, Inkling's distance bias, Doge's key bias) becomes operands of the cached op
  (`attention_forms.py`); DeepSeek-V4's compressed entries a cache of their own
  (`compressed_attention.py`).

Gemma2's attention is no attention op but HF's eager form (matmul, scale, soft cap, + mask,
softmax, matmul), which becomes `ad.cached_attention` with `softcap` = the cap (q and k possibly
the two results of one `ad.rope`, which the cached op then applies itself). XLM's scores, masked
by an in-place `masked_fill_` (True where masked) of a mask `expand_as` the scores, are matched as
MPT's `masked_fill` without a bias; so are CPM-Ant's, masked by `masked_fill` with a
`torch.scalar_tensor` fill and zeroed again after the softmax by `masked_fill(p, mask, 0)`.
GPT-Neo's `where(mask, scores, fill)` and OpenAI-GPT's `scores * mask + (1 - mask) * fill` are
matched too. The pass runs before `decompose` (as `ad_mlir.LLM`'s pipeline places it). The scores
and probabilities must have no other user (with a cache they would cover the new tokens only); a
softmax that feeds a matmul but does not match exactly is left alone, and the driver's refusal
says why it is no attention form (OpenAI-GPT's mask multiplied in from its triangular buffer in
another form).

An attention that is MLA is `mla.py`'s; a sparse attention (DeepSeek's key selection by an
indexer's top-k) that is not MLA is refused by name.
"""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.dialects.builtin import (
    Float8E4M3FNType,
    Float64Type,
    FloatAttr,
    IntegerAttr,
    TensorType,
    UnitAttr,
    i64,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.rewriter import Rewriter
from xdsl.utils.exceptions import PassFailedException

from ad_mlir.dialects import ad
from ad_mlir.passes.cache.attention_forms import bias_as_key_dim, distance_bias, heads_first, sinks, slopes
from ad_mlir.passes.cache.compressed_attention import (
    compressed_keys,
    compressed_operands,
    erase_compression,
    key_counts,
)
from ad_mlir.passes.cache.interface import (
    FP8_KV_SCALE,
    POSITION_INPUT,
    CachedMixer,
    CacheSite,
    Found,
    KvCacheDtypeRefused,
    layer_of,
    logged,
    optional,
)
from ad_mlir.passes.cache.masks import attention_window
from ad_mlir.passes.cache.sparse_attention import sparse_mask
from ad_mlir.passes.patterns.attention_masks import backward_slice, erase_computation, input_name
from ad_mlir.passes.patterns.attention_patterns import Attention, match_eager_attention
from ad_mlir.passes.patterns.compressed_attention import CompressedKeys
from ad_mlir.passes.patterns.matching import erase_dead
from ad_mlir.passes.patterns.mla_patterns import Mla, match_mla

ROLES = ("key", "value")


def find_attentions(fn: func.FuncOp) -> Found:
    """The attentions of `fn` in program order (attention ops and matched eager forms), MLA's
    too, and the softmaxes that weigh values but do not match, with why."""
    found, missed = [], {}
    for op in fn.body.block.ops:
        if isinstance(op, ad.RopeAttentionOp | ad.AttentionOp):
            found.append(_from_attention_op(op))
        elif isinstance(op, ad.SoftmaxOp) and (match := match_eager_attention(op)) is not None:
            if isinstance(match, str):
                missed[op] = match
            else:
                found.append(match)
    return Found(found, missed)


def _find(fn: func.FuncOp) -> Found:
    """The attentions that are not MLA (an MLA caches its latent, not K and V: `mla.py`); why a
    softmax is no attention, to the log."""
    found = find_attentions(fn)
    for op, why in found.missed.items():
        logged(why, op, "softmax")
    return Found([a for a in found.matches if not isinstance(match_mla(a), Mla)], found.missed)


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


def _cache_all(site: CacheSite, attentions: list[Attention]) -> None:
    for i, attention in enumerate(attentions):
        _cache(site, attention, i)


def _cache(site: CacheSite, attention: Attention, i: int) -> None:
    """`attention` -> `ad.cached_attention`, its `i`th."""
    layer = layer_of(attention.output)
    compressed = _checked(site, attention, layer)
    bias, bias_computed = distance_bias(site, attention, layer)
    bias_as_key_dim(attention)
    window = attention_window(site, attention, layer)
    if attention.key_seq_first:
        attention.key = heads_first(attention.key)
    cached = _cached_op(site, attention, layer, i, compressed, bias, window)
    counts = key_counts(attention) if compressed is not None else []
    Rewriter.replace_op(attention.output, cached)
    erase_dead(Rewriter.erase_op, attention.chain)
    if compressed is not None:
        erase_compression(compressed, counts)
    _erase_masks(attention, bias_computed)


def _checked(site: CacheSite, attention: Attention, layer: str) -> CompressedKeys | None:
    """Refuses what the cached op cannot take; DeepSeek-V4's compressed entries taken apart."""
    _check_positions(site, attention, layer)
    if site.paged:
        refuse_batched(attention, layer, "query")
    compressed = compressed_keys(site, attention, layer)  # first: CSA's mask holds a top-k too
    if compressed is not None and site.fp8_kv_cache:
        raise KvCacheDtypeRefused(
            f"{layer}: kv_cache_dtype={site.kv_cache_dtype!r} is not supported for attention with DeepSeek-V4's "
            "compressed entries (its compressed cache stays in the model's dtype): use kv_cache_dtype='auto'")
    if sparse_mask(site, attention, layer) is not None:
        raise PassFailedException(
            f"{layer}: DeepSeek sparse attention (a key selection by its indexer's top-k) is cached only over MLA "
            "in the slot form (paged=false); this attention is not MLA (the log says why)")
    return compressed


def _cached_op(site: CacheSite, attention: Attention, layer: str, i: int, compressed: CompressedKeys | None,
               bias: list[SSAValue], window: int | None) -> Operation:
    """The cached op over `attention`'s new cache arguments, its `i`th, not yet in place."""
    kind = "pages" if site.paged else "cache"
    caches = [site.add_cache(_cache_type(site, x), f"{role[0]}_{kind}_{i}", layer, role)
              for role, x in zip(ROLES, (attention.key, attention.value), strict=True)]
    entries = [[], [], []] if compressed is None else \
        compressed_operands(site, compressed, _cache_type(site, compressed.compressed), layer, i)
    rope = list(attention.rope) if attention.rope is not None else [[], []]
    norm_weights = list(attention.qk_norm[:2]) if attention.qk_norm is not None else [[], []]
    operands = [attention.query, attention.key, attention.value, *rope, *norm_weights, *caches, site.block_tables,
                site.starts, optional(site.query_starts),
                [sinks(site, attention, layer)] if attention.sinks is not None else [],
                [slopes(site, attention, layer)] if attention.alibi is not None else [], bias, *entries]
    cached = ad.CachedAttentionOp.build(operands=operands, properties=_properties(site, attention, window),
                                        result_types=[attention.output.results[0].type])
    cached.location = attention.output.location
    return cached


def _check_positions(site: CacheSite, attention: Attention, layer: str) -> None:
    """RoPE's positions must come from the `position_ids` input, which the cache offsets."""
    if attention.rope is not None and not any(input_name(site.fn, a) == POSITION_INPUT
                                              for a in backward_slice(attention.rope[0])[1]):
        raise PassFailedException(
            f"{layer}: the RoPE positions do not come from a '{POSITION_INPUT}' input; export the model with "
            f"{POSITION_INPUT} as an input so the cache can offset them")


def _properties(site: CacheSite, attention: Attention, window: int | None) -> dict[str, Attribute]:
    """The cached op's scale, the K/V scales of fp8 pools, and the interleaved RoPE, window, soft
    cap and QK-norm it carries over."""
    properties: dict[str, Attribute] = {"scale": FloatAttr(attention.scale, Float64Type())}
    if site.fp8_kv_cache:
        properties |= {"k_scale": FloatAttr(FP8_KV_SCALE, Float64Type()),
                       "v_scale": FloatAttr(FP8_KV_SCALE, Float64Type())}
    if attention.interleaved:
        properties["interleaved"] = UnitAttr()
    if window is not None:
        properties["window"] = IntegerAttr(window, i64)
    if attention.softcap is not None:
        properties["softcap"] = FloatAttr(attention.softcap, Float64Type())
    if attention.qk_norm is not None:
        properties |= attention.qk_norm[2].properties()
    return properties


def _erase_masks(attention: Attention, bias_computed: SSAValue | None) -> None:
    """The computations of the masks and biases the cached op replaced, where nothing else uses them."""
    computations = (attention.mask, attention.alibi, attention.zeroed, *(attention.selected or ()),
                    *(attention.multiplied or ())[:1], bias_computed)
    for computed in dict.fromkeys(computations):  # CPM-Ant's two masks may be one value
        if computed is not None:
            erase_computation(computed, Rewriter.erase_op)


def _cache_type(site: CacheSite, x: SSAValue) -> TensorType:
    """[max-batch, max-seq-len, kv_heads, head_dim] of the key's or the value's heads (a value
    head dim of its own gets a value cache of its own width); with `paged`, [num-pages,
    page-size, kv_heads, head_dim]; in e4m3 with `kv-cache-dtype=fp8`."""
    _, heads, _, head_dim = x.type.get_shape()
    element = Float8E4M3FNType() if site.fp8_kv_cache else x.type.element_type
    return TensorType(element, [*site.cache_rows(), heads, head_dim])


def refuse_batched(attention: Attention, layer: str, what: str) -> None:
    """The paged form takes a step's tokens as one flattened sequence: `attention`'s query must
    have batch 1 (`what` names the query in the error)."""
    batch = attention.query.type.get_shape()[0]
    if batch != 1:
        raise PassFailedException(
            f"{layer}: the paged form takes the step's tokens as one flattened sequence, but the {what}'s batch "
            f"is {batch}, not 1: export the model with input_ids [1, tokens] (ad_mlir.llm.cache_export.export_for_cache "
            "with flat=True)")


def _replaced(attention: Attention) -> Operation:
    return attention.output


MIXER = CachedMixer("attention", _find, _cache_all, _replaced, fp8_kv_cache=True)
