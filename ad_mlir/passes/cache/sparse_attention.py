"""DeepSeek sparse attention's lightning indexer, cached (DeepSeek-V3.2, GLM-5, A.X K2, HY-V4,
dots.3 note: `sparse_attention.match_sparse_mask`, an MLA whose mask is the causal mask
restricted to the top-k keys of a lightning indexer; DeepSeek-V4's CSA indexer over its
compressed entries, `compressed_attention.py`).

The indexer's `aten.topk` becomes `ad.cached_index_topk` over an argument `index_key_cache_<i>`
[max-batch, max-seq-len, index head dim] in the key's dtype, marked `ad.cache = "<layer>
index_key"` (each token's one index key), and the cached attention takes its result as
`selected`; a layer whose mask reuses another's topk (GLM-5's "shared" layers) gets the same
selection (`mla.py`). The indexer's own mask must be causal. A sparse attention that is not MLA is
refused by name (`attention.py`), and the paged form refuses a sparse MLA as `PerSequenceState`.
This is no line of the table: the mixers whose masks hold an indexer cache it.
"""

from __future__ import annotations

from xdsl.dialects.builtin import Float64Type, FloatAttr, IntegerAttr, TensorType, i64
from xdsl.ir import SSAValue
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.utils.exceptions import PassFailedException

from ad_mlir.dialects import ad
from ad_mlir.passes.cache.interface import CacheSite
from ad_mlir.passes.patterns.attention_masks import MaskError, causal_window, evaluate
from ad_mlir.passes.patterns.attention_patterns import Attention
from ad_mlir.passes.patterns.compressed_attention import Selection
from ad_mlir.passes.patterns.sparse_attention import Indexer, SparseMask, match_sparse_mask

ROLE = "index_key"


def sparse_mask(site: CacheSite, attention: Attention, layer: str) -> SparseMask | None:
    """DeepSeek sparse attention's selection in `attention`'s mask (`match_sparse_mask`),
    whose indexer must mask causally; None when the mask holds no selection; raises when it
    holds one of another form."""
    found = match_sparse_mask(attention.mask) if attention.mask is not None else None
    if isinstance(found, str):
        raise PassFailedException(f"{layer}: its attention mask selects keys by aten.topk, but {found}")
    if found is not None:
        try:
            mask = evaluate(site.fn, found.indexer.mask, site.mask_inputs())
            if causal_window(mask) is not None:
                raise MaskError("it is a sliding window")
        except MaskError as e:
            raise PassFailedException(f"{layer}: the mask of its sparse attention's indexer is not causal: {e}") \
                from None
    return found


def cached_indexer(site: CacheSite, indexer: Indexer | Selection, layer: str) -> SSAValue:
    """`ad.cached_index_topk` over a cache argument `index_key_cache_<i>` [max-batch,
    max-seq-len, index head dim] in the key's dtype, placed before the `aten.topk` it replaces.
    It keeps at most max-seq-len keys: a slot holds no more (DeepSeek-V3.2's index_topk of 2048
    under a shorter cache would carry columns that are all -1)."""
    k = min(indexer.k, site.max_seq_len)
    key_type = indexer.key.type
    cache_type = TensorType(key_type.element_type, [site.max_batch, site.max_seq_len, key_type.get_shape()[2]])
    cache = site.add_cache(cache_type, f"index_key_cache_{site.count_roles(ROLE)}", layer, ROLE)
    batch, seq = indexer.query.type.get_shape()[:2]
    chosen = ad.CachedIndexTopkOp.build(
        operands=[indexer.query, indexer.key, indexer.weights, cache, site.slots, site.starts],
        properties={"scale": FloatAttr(indexer.scale, Float64Type()), "topk": IntegerAttr(k, i64)},
        result_types=[TensorType(i64, [batch, seq, k])])
    chosen.location = indexer.topk.location
    chosen.result.name_hint = "selected"
    Rewriter.insert_op(chosen, InsertPoint.before(indexer.topk))
    return chosen.result
