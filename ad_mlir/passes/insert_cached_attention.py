"""`insert-cached-attention`: every token mixer of a decoder is cached, each cache a new argument
of the function (AutoDeploy's cache-initialization stage): causal attention over K/V caches,
MLA over its latent, short causal convolutions, recurrent scans and token windows over states;
a graph left with any other op that mixes token positions is refused.

This module is the driver: it names no mixer. The mixers are the lines of
`passes/cache/table.py`, each a module of `passes/cache/` whose docstring says what it matches
and caches. For each function the driver asks every line for its matches, all before any is
cached, then adds the cache metadata arguments the cached ops read and has each mixer cache its
matches, in the table's order, over cache arguments it adds (marked `ad.cache = "<layer>
<role>"`, the layer being the mixer's HF module path).

In the slot form the metadata is, once per function, `cache_slots` and `cache_starts`
(tensor<?xi64>: each batch row's cache slot and the tokens that slot already holds), marked
`ad.cache_slots` / `ad.cache_starts`; the slot form is a configuration of the paged one (a slot
is a page of max-seq-len tokens): attention and MLA read the slots as block tables one page wide
(`cache_slots` unsqueezed to [batch, 1]) and their caches are the pools, each batch row one
sequence; with `logits-indices=true` (as `ad_mlir.LLM` compiles) also
`logits_indices` (tensor<?xi64>, marked `ad.logits_indices`): the step's token indices whose
logits are computed, in every row (a prefill wants its last token's only), gathered before the
LM head as in the paged form (`cache/logits.py`).

With `paged=true` (vLLM's paged K/V, one flattened batch per step) the mixers with rows per
token (attention, MLA) are cached over page pools [num-pages, page-size, ...], and the function
gets, in this order, the arguments `query_starts` [seqs + 1], `cache_starts` [seqs],
`block_tables` [seqs, max_pages_per_seq] and `logits_indices` [n] (all int64, marked
`ad.query_starts`, `ad.cache_starts`, `ad.block_tables`, `ad.logits_indices`; then
`position_ids` [1, T] where the pass gives a range the real positions and the model has none).
The model must be exported with batch 1 (`input_ids` and `position_ids` [1, T]: the step's tokens
of every sequence, flattened); the LM head runs only on the flattened tokens `logits_indices`.
States that are per sequence (short convolutions, scans) are not paged but kept in pools of
`max-batch` state slots ([max-batch, ...] as in the slot form), one slot per running sequence:
the function gets one more argument, `state_slots` [seqs] (int64, marked `ad.state_slots`, after
`logits_indices`), and each such op takes `query_starts` besides, so that it runs sequence by
sequence over the flattened tokens, sequence s from slot `state_slots[s]`, from a zero state
where its `cache_starts[s]` is 0 (`ad.cached_causal_conv1d`'s docstring); their kernels run every
sequence in one launch, reading `query_starts` on the device (`codegen/templates/state_rows.py`).
A model of such states alone (Mamba, RWKV: no attention) gets the same metadata and no page
pool. A mixer the paged form does not hold is refused by name (`PerSequenceState`: compile such
a model in the slot form).

With `kv-cache-dtype=fp8` (vLLM's `kv_cache_dtype`: `fp8` or `fp8_e4m3`) attention's K/V
caches are float8_e4m3fn, half the bytes of 16-bit ones, quantized with per-tensor scales of
1.0 (`cache/attention.py`); states per sequence keep their dtype, and a mixer that cannot hold
its rows per token in e4m3 (MLA's latent) is refused by name (`KvCacheDtypeRefused`, a
ValueError).

Once the mixers are cached, a range that counts the step's tokens as positions gets the real
ones (`cache/positions.py`). After that, any op that still mixes token positions
(`position_mixing.position_mixers`: another convolution or scan over the sequence, an opaque
state-space scan, a reduction or contraction over a token axis, a shift, an attention softmax not
matched, positions counted inside the graph) is an error naming each op and its layer: a decode
step would run it on its new tokens alone. The pass is never skipped on error
(`skippable_on_error`), so that error is what `LLM` raises.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import DYNAMIC_INDEX, IntegerAttr, ModuleOp, TensorType, i64
from xdsl.ir import SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.transforms.dead_code_elimination import region_dce
from xdsl.utils.exceptions import PassFailedException

from ad_mlir.dialects import ad
from ad_mlir.passes.cache.interface import (
    KV_CACHE_DTYPES,
    CachedMixer,
    CacheSite,
    Found,
    KvCacheDtypeRefused,
    append_argument,
    layer_of,
)
from ad_mlir.passes.cache.logits import gather_logits
from ad_mlir.passes.cache.positions import positions_from_input, positions_from_starts
from ad_mlir.passes.cache.table import MIXERS
from ad_mlir.passes.position_mixing import position_mixers

log = logging.getLogger(__name__)

STATE_SLOTS_INPUT = "state_slots"
MIXERS_LISTED = 4
"""Position-mixing ops named in a refusal (the count says how many more)."""

PAGED_METADATA = (
    ("query_starts", ad.QUERY_STARTS_ATTR, [DYNAMIC_INDEX]),
    ("cache_starts", ad.CACHE_STARTS_ATTR, [DYNAMIC_INDEX]),
    ("block_tables", ad.BLOCK_TABLES_ATTR, [DYNAMIC_INDEX, DYNAMIC_INDEX]),
    ("logits_indices", ad.LOGITS_INDICES_ATTR, [DYNAMIC_INDEX]),
)
"""The metadata arguments of a paged function, in order: name, marking attribute, shape (int64)."""

Mixers = list[tuple[CachedMixer, Found]]
"""Each line of the table with what it found in one function."""


@dataclass(frozen=True)
class InsertCachedAttentionPass(ModulePass):
    """Every token mixer -> its cached op over per-layer cache arguments (module docstring)."""

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
    """Attention over page pools of `page-size` tokens and one flattened batch (module docstring)."""
    page_size: int = 16
    """With `paged`: tokens a page holds (a power of two)."""
    num_pages: int = 256
    """With `paged`: pages of each pool."""
    logits_indices: bool = False
    """The slot form with a `logits_indices` argument: the LM head runs on those tokens only
    (the paged form always has it)."""
    kv_cache_dtype: str = "auto"
    """What attention's K/V caches hold: `auto` (the key's dtype) or `fp8` / `fp8_e4m3`
    (float8_e4m3fn, per-tensor scales of 1.0)."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.max_batch < 1 or self.max_seq_len < 1:
            raise PassFailedException(f"insert-cached-attention: max-batch {self.max_batch} and max-seq-len "
                                      f"{self.max_seq_len} must be positive")
        if self.paged and (self.page_size < 1 or self.page_size & (self.page_size - 1) or self.num_pages < 1):
            raise PassFailedException(f"insert-cached-attention: page-size {self.page_size} must be a power of two "
                                      f"and num-pages {self.num_pages} positive")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise KvCacheDtypeRefused(f"insert-cached-attention: kv-cache-dtype {self.kv_cache_dtype!r} is none of "
                                      f"{', '.join(KV_CACHE_DTYPES)}")
        for fn in op.ops:
            if isinstance(fn, func.FuncOp) and fn.body.blocks:
                # every mixer finds its matches before any is cached: a rewrite must not change what another finds
                found = [(mixer, mixer.find(fn)) for mixer in MIXERS]
                if self.kv_cache_dtype != "auto":
                    _refuse_unquantized(found, self.kv_cache_dtype)
                if self.paged:
                    self._apply_paged(fn, found)
                else:
                    self._apply_slots(fn, found)

    def _apply_slots(self, fn: func.FuncOp, found: Mixers) -> None:
        """The slot form: each mixer cached over slots of `max-batch` rows."""
        cached = [(mixer, f) for mixer, f in found if f.matches]
        if cached:
            slots = _metadata_argument(fn, "cache_slots", ad.CACHE_SLOTS_ATTR)
            starts = _metadata_argument(fn, "cache_starts", ad.CACHE_STARTS_ATTR)
            site = self._site(fn, starts, slots, block_tables=_slot_tables(fn, slots))
            for mixer, f in cached:
                mixer.cache(site, f.matches)
            region_dce(fn.body)
            positions_from_starts(fn, starts)
        _refuse_uncached_mixers(fn, found)
        if not cached:
            log.info("insert-cached-attention: no attention in @%s (neither an attention op nor HF's eager "
                     "matmul/softmax form)", fn.sym_name.data)
            return
        if self.logits_indices:
            gather_logits(fn, _metadata_argument(fn, "logits_indices", ad.LOGITS_INDICES_ATTR))
        log.info("insert-cached-attention: %s cached (%d slots x %d tokens)", _counted(cached), self.max_batch,
                 self.max_seq_len)

    def _apply_paged(self, fn: func.FuncOp, found: Mixers) -> None:
        """The paged, flattened form: the mixers with rows per token over page pools, those with a
        state per sequence over state slots (a model of states alone: no pool), their metadata
        and the gathered LM head."""
        states = [(mixer, f) for mixer, f in found if f.matches and mixer.per_sequence]
        pages = [(mixer, f) for mixer, f in found if f.matches and not mixer.per_sequence]
        if not pages and not states:
            _refuse_uncached_mixers(fn, found)
            log.info("insert-cached-attention: no attention in @%s", fn.sym_name.data)
            return
        query_starts, starts, block_tables, logits_indices = (
            append_argument(fn, TensorType(i64, shape), {ad.INPUT_ATTR: name, attr: ""})
            for name, attr, shape in PAGED_METADATA)
        slots = _metadata_argument(fn, STATE_SLOTS_INPUT, ad.STATE_SLOTS_ATTR) if states else None
        site = self._site(fn, starts, slots, query_starts, block_tables)
        for mixer, f in [*states, *pages]:  # the states' arguments next to state_slots
            mixer.cache(site, f.matches)
        region_dce(fn.body)
        positions_from_input(fn)
        _refuse_uncached_mixers(fn, found)
        gather_logits(fn, logits_indices)
        log.info("insert-cached-attention: %s paged (%d pages x %d tokens), %s over %d state slots",
                 _counted(pages) or "nothing", self.num_pages, self.page_size, _counted(states) or "no state",
                 self.max_batch)

    def _site(self, fn: func.FuncOp, starts: SSAValue, slots: SSAValue | None, query_starts: SSAValue | None = None,
              block_tables: SSAValue | None = None) -> CacheSite:
        return CacheSite(fn, self.max_batch, self.max_seq_len, self.paged, self.page_size, self.num_pages, starts,
                         slots, query_starts, block_tables, self.kv_cache_dtype)


def _metadata_argument(fn: func.FuncOp, name: str, attr: str) -> SSAValue:
    """A new int64 [?] argument `name`, marked by `attr`."""
    return append_argument(fn, TensorType(i64, [DYNAMIC_INDEX]), {ad.INPUT_ATTR: name, attr: ""})


def _slot_tables(fn: func.FuncOp, slots: SSAValue) -> SSAValue:
    """The slot form's block tables [batch, 1]: each row's slot, the one page of max-seq-len
    tokens its sequence holds (dropped with the dead code where no mixer reads it)."""
    table = ad.UnsqueezeOp.build(operands=[slots], properties={"dim": IntegerAttr(1, i64)},
                                 result_types=[TensorType(i64, [DYNAMIC_INDEX, 1])])
    table.result.name_hint = "block_tables"
    Rewriter.insert_op(table, InsertPoint.at_start(fn.body.block))
    return table.result


def _refuse_unquantized(found: Mixers, kv_cache_dtype: str) -> None:
    """A mixer with rows per token that cannot hold them in e4m3 is refused by name."""
    for mixer, f in found:
        if f.matches and not mixer.per_sequence and not mixer.fp8_kv_cache:
            raise KvCacheDtypeRefused(
                f"{layer_of(mixer.replaced(f.matches[0]))}: kv_cache_dtype={kv_cache_dtype!r} is not supported for "
                f"{mixer.name} (its cache stays in the model's dtype): use kv_cache_dtype='auto'")


def _counted(found: Mixers) -> str:
    """`2 attention, 1 short convolution`: the log's count of each mixer cached."""
    return ", ".join(f"{len(f.matches)} {mixer.name}" for mixer, f in found)


def _refuse_uncached_mixers(fn: func.FuncOp, found: Mixers) -> None:
    """Raise naming every op left that mixes token positions: with a cache, a decode step would
    run it on the new tokens alone, without the earlier ones it reads (a silently wrong token).
    The ops a mixer found but did not match (`Found.missed`), with why, are named first."""
    mixers = position_mixers(fn)
    if not mixers:
        return
    listed = "; ".join(m.describe() for m in mixers[:MIXERS_LISTED])
    more = f" (and {len(mixers) - MIXERS_LISTED} more)" if len(mixers) > MIXERS_LISTED else ""
    unmatched = [(mixer.name, op, why) for mixer, f in found for op, why in f.missed.items()
                 if any(m.op is op for m in mixers)]
    others = f" (and {len(unmatched) - 1} more)" if len(unmatched) > 1 else ""
    spelled = ""
    if unmatched:
        name, op, why = unmatched[0]
        spelled = f"the {name} at {layer_of(op)}{others} is no form it caches: {why}; "
    raise PassFailedException(
        f"insert-cached-attention: {spelled}{len(mixers)} op(s) mix token positions outside the cached attention, and "
        f"nothing caches their state between steps, so generation would be wrong: {listed}{more}. Models with "
        "such sequence mixers (scans other than Mamba's and the gated delta rule's; linear "
        "attention; convolutions other than HF's causal short convolution; attention forms not matched as "
        "attention) are not supported for generation yet")
