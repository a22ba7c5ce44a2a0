"""Multi-head latent attention, cached (DeepSeek-V2/V3: `mla_patterns.match_mla`, an attention
whose keys and values HF expands from a normalized latent by `kv_b_proj`, the rotated key part
shared by the heads).

It becomes `ad.cached_mla_attention` over one argument `latent_cache_<i>` [max-batch,
max-seq-len, kv_lora_rank + qk_rope_head_dim] in the latent's dtype (each slot one page of the
op's pool, the block tables `cache_slots` unsqueezed), marked `ad.cache = "<layer> latent"`: the
latent ++ rotated key part of each token, not the heads' K and V (at DeepSeek-V3's sizes 576
values per token and layer instead of 128 heads x (192 + 128)). The expansion is erased;
the cached op absorbs `kv_b_proj` into the query and the output. An MLA that does not match
exactly is cached as plain attention over its expanded K and V (`attention.py`; the log says
why). An MLA with sink logits (HY-V4's eager form) carries them over (`sinks`). Under DeepSeek
sparse attention's mask it takes its indexer's selection (`sparse_attention.py`). Its mask is
evaluated as an attention's (`masks.py`): only causal MLA is cached.

With `paged` the same op takes one flattened batch (`query_starts`) over one pool
`latent_pages_<i>` [num-pages, page-size, kv_lora_rank + qk_rope_head_dim] in the latent's dtype,
marked as above: its pages hold the latent ++ rotated key part. A sparse MLA, or one with
sinks, is cached in the slot form only (`PerSequenceState`: `paged_where_possible` falls back
to the slot form).
"""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.dialects.builtin import Float64Type, FloatAttr, TensorType
from xdsl.ir import Operation, SSAValue
from xdsl.rewriter import Rewriter
from xdsl.utils.exceptions import PassFailedException

from ad_mlir.dialects import ad
from ad_mlir.passes.cache.attention import find_attentions, refuse_batched
from ad_mlir.passes.cache.interface import (
    CachedMixer,
    CacheSite,
    Found,
    PerSequenceState,
    layer_of,
    logged,
    optional,
)
from ad_mlir.passes.cache.masks import attention_window
from ad_mlir.passes.cache.sparse_attention import cached_indexer, sparse_mask
from ad_mlir.passes.patterns.attention_masks import erase_computation
from ad_mlir.passes.patterns.matching import erase_dead
from ad_mlir.passes.patterns.mla_patterns import Mla, match_mla

ROLE = "latent"


def _find(fn: func.FuncOp) -> Found:
    """The attentions of `fn` that are MLA; why a near miss is not, to the log."""
    matches = (logged(match_mla(a), a.output, "MLA attention") for a in find_attentions(fn).matches)
    return Found([m for m in matches if m is not None])


def _cache_all(site: CacheSite, mlas: list[Mla]) -> None:
    """Each MLA cached; each indexer once for the layers that share it."""
    indexers: dict[ad.TorchOp, SSAValue] = {}
    for i, mla in enumerate(mlas):
        _cache(site, mla, i, indexers)
    for topk in indexers:
        erase_computation(topk.outputs[0], Rewriter.erase_op)


def _cache(site: CacheSite, mla: Mla, i: int, indexers: dict[ad.TorchOp, SSAValue]) -> None:
    """MLA's expanded attention -> `ad.cached_mla_attention` over a latent argument
    `latent_cache_<i>` [max-batch, max-seq-len, rank + rope] (paged: `latent_pages_<i>`
    [num-pages, page-size, rank + rope]) in the latent's dtype; under DeepSeek sparse attention's
    mask, with the selection of its indexer (`indexers`: those cached so far, by their
    `aten.topk`)."""
    attention = mla.attention
    layer = layer_of(attention.output)
    sparse = sparse_mask(site, attention, layer)
    if site.paged:
        _check_paged(mla, layer, sparse is not None)
    selected: list[SSAValue] = []
    if sparse is not None:
        attention.mask = sparse.causal
        if sparse.indexer.topk not in indexers:
            indexers[sparse.indexer.topk] = cached_indexer(site, sparse.indexer, layer)
        selected = [indexers[sparse.indexer.topk]]
    kind = "pages" if site.paged else "cache"
    cache = site.add_cache(_latent_type(site, mla, layer), f"latent_{kind}_{i}", layer, ROLE)
    cached = ad.CachedMlaAttentionOp.build(
        operands=[mla.q_nope, mla.q_rope, mla.latent, mla.k_rope, mla.kv_b_weight, cache, site.block_tables,
                  site.starts, optional(site.query_starts), selected, optional(attention.sinks)],
        properties={"scale": FloatAttr(attention.scale, Float64Type())},
        result_types=[attention.output.results[0].type])
    _replace(mla, cached, sparse.ops if sparse is not None else [])


def _check_paged(mla: Mla, layer: str, sparse: bool) -> None:
    """What the paged form refuses: a sparse MLA (its indexer keeps slots) or one with sinks
    (`PerSequenceState`: `paged_where_possible` falls back to the slot form), a batched query."""
    if sparse or mla.attention.sinks is not None:
        raise PerSequenceState(
            f"{layer}: an MLA under DeepSeek sparse attention's key selection or with sink logits is cached in the "
            "slot form only (paged=false)")
    refuse_batched(mla.attention, layer, "MLA query")


def _replace(mla: Mla, cached: Operation, selection_ops: list[Operation]) -> None:
    """`cached` in place of the attention; the expansion, the key selection's ops and the mask's
    computation erased where nothing else uses them."""
    attention = mla.attention
    cached.location = attention.output.location
    Rewriter.replace_op(attention.output, cached)
    erase_dead(Rewriter.erase_op, [*attention.chain, *mla.ops, *selection_ops])
    if attention.mask is not None:
        erase_computation(attention.mask, Rewriter.erase_op)


def _latent_type(site: CacheSite, mla: Mla, layer: str) -> TensorType:
    """The type of MLA's cache of latent ++ rotated key part per token, [*rows, rank + rope] in
    the latent's dtype (rows: slots and tokens, or pages and page rows); a sliding-window MLA
    is refused."""
    if attention_window(site, mla.attention, layer) is not None:
        raise PassFailedException(f"{layer}: MLA under a sliding-window mask is not cached (only causal MLA is)")
    rank, rope = mla.latent.type.get_shape()[3], mla.k_rope.type.get_shape()[3]
    return TensorType(mla.latent.type.element_type, [*site.cache_rows(), rank + rope])


def _replaced(mla: Mla) -> Operation:
    return mla.attention.output


MIXER = CachedMixer("MLA", _find, _cache_all, _replaced)
