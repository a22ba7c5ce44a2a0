"""DeepSeek-V4's compressed K/V entries, cached beside its sliding-window keys
(`compressed_attention.match_compressed_keys`): its attention concatenates the compressor's
entries to its one K = V head and the compressor's block bias to HF's mask.

At compress rate 1 (one entry per token) the entries become the cached attention's `compressed`
over an argument `c_cache_<i>` [max-batch, max-seq-len, 1, head_dim] in the key's dtype, marked
`ad.cache = "<layer> compressed"`, attended causally without the window (HCA's bias's mask is
evaluated and must be causal). CSA's indexer (its mask evaluated, causal) becomes
`ad.cached_index_topk` over `index_key_cache_<j>` (`sparse_attention.py`), its result the cached
op's `selected`; each previous-token shift of its entries' and index keys' computations
(`cat([fill, x], 1)[:, :-1]`, kv filled with 0, gates with -inf) is a shift by one token, a
cached token window (`token_window.py`) with the fill as its initial row. The concatenations and
the block bias are erased. Other compress rates are refused naming the layer, the kind and the
rate; the paged form refuses the entries as `PerSequenceState`. This is no line of the table:
the attention mixer caches the entries of the attentions that have them.
"""

from __future__ import annotations

from xdsl.dialects.builtin import IndexType, TensorType
from xdsl.ir import Operation, SSAValue
from xdsl.rewriter import Rewriter
from xdsl.utils.exceptions import PassFailedException

from ad_mlir.dialects import ad
from ad_mlir.passes.cache.interface import CacheSite, PerSequenceState
from ad_mlir.passes.cache.sparse_attention import cached_indexer
from ad_mlir.passes.patterns.attention_masks import MaskError, causal_window, erase_computation, evaluate
from ad_mlir.passes.patterns.attention_patterns import Attention
from ad_mlir.passes.patterns.compressed_attention import (
    CompressedKeys,
    UncachedCompression,
    match_compressed_keys,
)
from ad_mlir.passes.patterns.matching import erase_dead

ROLE = "compressed"


def compressed_keys(site: CacheSite, attention: Attention, layer: str) -> CompressedKeys | None:
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
    if site.paged:
        raise PerSequenceState(f"{layer}: DeepSeek-V4's compressed K/V entries are cached in the slot form only "
                               "(paged=false)")
    try:
        hidden = found.hidden if found.selection is None else found.selection.future
        if causal_window(~evaluate(site.fn, hidden, site.mask_inputs())) is not None:
            raise MaskError("it is a sliding window")
    except MaskError as e:
        raise PassFailedException(f"{layer}: the mask of its DeepSeek-V4 compressed entries is not causal: {e}") \
            from None
    attention.key = attention.value = found.key
    attention.mask = found.mask
    return found


def compressed_operands(site: CacheSite, found: CompressedKeys, cache_type: TensorType, layer: str,
                        i: int) -> list[SSAValue | list[SSAValue]]:
    """The cached attention's `compressed`, its cache `c_cache_<i>` and `selected` (CSA's: its
    indexer as `ad.cached_index_topk` over its own index-key cache, whose result replaces HF's
    chosen entries)."""
    cache = site.add_cache(cache_type, f"c_cache_{i}", layer, ROLE)
    if found.selection is None:
        return [found.compressed, cache, []]
    chosen = cached_indexer(site, found.selection, layer)
    found.selection.chosen.replace_all_uses_with(chosen)
    return [found.compressed, cache, chosen]


def key_counts(attention: Attention) -> list[Operation]:
    """The torch ops that count the repeated keys ++ entries (2 x seq) for the attention's
    expands: DCE keeps torch ops, so they are erased by hand once dead."""
    return [v.owner for op in attention.chain if isinstance(op, ad.ExpandOp) for v in op.operands
            if isinstance(v.type, IndexType) and isinstance(v.owner, ad.TorchOp)]


def erase_compression(found: CompressedKeys, counts: list[Operation]) -> None:
    """The concatenations, the block bias and what computed the entries' mask, once the cached
    op has replaced the attention."""
    erase_dead(Rewriter.erase_op, [*found.ops, *counts])
    if found.selection is not None:
        erase_computation(found.selection.chosen, Rewriter.erase_op)
    else:
        erase_computation(found.hidden, Rewriter.erase_op)
