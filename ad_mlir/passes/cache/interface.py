"""What the cache-insertion driver (`passes/insert_cached_attention.py`) and a cached mixer share:
the table row a mixer gives (`CachedMixer`), the function being cached as the driver hands it
to the mixers (`CacheSite`: the sizes and the metadata arguments its cached ops read), and the
helpers every mixer uses to add a cache argument and to name a layer."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, FunctionType, NameLoc, StringAttr, TensorType
from xdsl.ir import BlockArgument, Operation, SSAValue
from xdsl.utils.exceptions import PassFailedException

from ad_mlir.dialects import ad

log = logging.getLogger(__name__)
Match = TypeVar("Match")

POSITION_INPUT = "position_ids"
"""The input the RoPE positions and the masks' positions come from (with a cache, the new
tokens' positions are start + 0..seq-1)."""


class PerSequenceState(PassFailedException):
    """The paged form refused where the slot form caches the model: DeepSeek sparse attention's
    indexer (cached in slots only), MLA with sink logits, sink logits per token (Inkling2's),
    DeepSeek-V4's compressed entries, or convolutions over a token window."""


class KvCacheDtypeRefused(PassFailedException, ValueError):
    """`kv-cache-dtype` (`LLM`'s `kv_cache_dtype`) is not one the pass knows, or a mixer found
    cannot hold its cache in it (MLA's latent, DeepSeek-V4's compressed entries)."""


KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
"""`kv-cache-dtype`'s values, vLLM's names: `auto`, the model's dtype; `fp8` (= `fp8_e4m3`),
attention's K/V pools in float8_e4m3fn with a per-tensor scale each for keys and values."""

FP8_KV_SCALE = 1.0
"""The K/V scales without a checkpoint's (vLLM's default): K/V entries beyond +-448 saturate."""


@dataclass(frozen=True)
class Found:
    """A mixer's matches in a function, in program order, and the ops that look like it but do
    not match, with why (the refusal of uncached mixers names them first)."""

    matches: list[Any]
    missed: dict[Operation, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CacheSite:
    """A function being cached, as the driver hands it to each mixer: where its caches go, how big
    they are, and the metadata arguments its cached ops read."""

    fn: func.FuncOp
    max_batch: int
    max_seq_len: int
    paged: bool
    page_size: int
    num_pages: int
    starts: SSAValue
    """`cache_starts`: the tokens each row's slot (paged: each sequence) already holds."""
    slots: SSAValue | None
    """Each row's slot (`cache_slots`); paged, each sequence's state slot (`state_slots`, None
    when no mixer keeps a state per sequence)."""
    query_starts: SSAValue | None = None
    """Paged only: where each sequence's tokens start in the flattened step."""
    block_tables: SSAValue | None = None
    """Each sequence's pages (the slot form: each row's slot, [batch, 1])."""
    kv_cache_dtype: str = "auto"
    """What attention's K/V pools hold (`KV_CACHE_DTYPES`)."""

    @property
    def fp8_kv_cache(self) -> bool:
        return self.kv_cache_dtype != "auto"

    def cache_rows(self) -> list[int]:
        """The leading dims of a cache of tokens: [max-batch, max-seq-len], paged [num-pages, page-size]."""
        return [self.num_pages, self.page_size] if self.paged else [self.max_batch, self.max_seq_len]

    def add_cache(self, arg_type: TensorType, name: str, layer: str, role: str) -> BlockArgument:
        """A new argument `name` holding `layer`'s cache, marked `ad.cache = "<layer> <role>"`
        (the role tells the runtime what the argument holds)."""
        return append_argument(self.fn, arg_type, {ad.INPUT_ATTR: name, ad.CACHE_ATTR: f"{layer} {role}"})

    def count_roles(self, role: str) -> int:
        """The cache arguments so far whose role is `role` (to number the next one)."""
        return sum(1 for attrs in (self.fn.arg_attrs.data if self.fn.arg_attrs else ())
                   if ad.CACHE_ATTR in attrs.data and attrs.data[ad.CACHE_ATTR].data.endswith(f" {role}"))

    def state_operands(self, state: SSAValue) -> list[SSAValue | list[SSAValue] | None]:
        """A per-sequence state's operands: the state, slots, starts and, paged, query_starts (the
        op then runs sequence by sequence over the flattened tokens)."""
        return [state, self.slots, self.starts, optional(self.query_starts)]

    def mask_inputs(self) -> dict[str, torch.Tensor]:
        """Inputs of max-seq-len new tokens, at which mask and bias computations run."""
        n = self.max_seq_len
        return {"input_ids": torch.zeros(1, n, dtype=torch.int64), POSITION_INPUT: torch.arange(n)[None, :]}


@dataclass(frozen=True)
class CachedMixer:
    """One line of the table of cached mixers (`cache/table.py`): how the driver finds a mixer in
    a function and has it cached."""

    name: str
    """What one match is, for the log (`3 attention` cached)."""
    find: Callable[[func.FuncOp], Found]
    """Its matches in the function, before any is cached."""
    cache: Callable[[CacheSite, list[Any]], None]
    """Replaces the matches by cached ops over cache arguments it adds."""
    replaced: Callable[[Any], Operation]
    """The op a match replaces (its location names the layer in the driver's refusals)."""
    per_sequence: bool = False
    """Its state is one per sequence (a convolution's or a scan's), not one row per token: paged,
    it is kept in `state_slots`, and pages only what has rows per token."""
    fp8_kv_cache: bool = False
    """It holds its rows per token in e4m3 with `kv-cache-dtype=fp8` (a mixer with rows per token
    that does not is refused then; a state per sequence keeps its dtype)."""


def append_argument(fn: func.FuncOp, arg_type: TensorType, attrs: dict[str, str]) -> BlockArgument:
    """A new last argument of `fn`, named by its `ad.input` and carrying `attrs`."""
    block = fn.body.block
    arg = block.insert_arg(arg_type, len(block.args))
    arg.name_hint = attrs[ad.INPUT_ATTR]
    arg_attrs = list(fn.arg_attrs.data) if fn.arg_attrs else [DictionaryAttr({}) for _ in block.args[:-1]]
    arg_attrs.append(DictionaryAttr({k: StringAttr(v) for k, v in attrs.items()}))
    fn.arg_attrs = ArrayAttr(arg_attrs)
    fn.function_type = FunctionType.from_lists([a.type for a in block.args], fn.function_type.outputs.data)
    return arg


def layer_of(op: Operation) -> str:
    """The HF module path `op` came from (its location), or the op's name without one."""
    return op.location.desc.data if isinstance(op.location, NameLoc) else op.name


def logged(match: Match | str | None, op: Operation, what: str) -> Match | None:
    """A matcher's result: the match, or None; why a near miss is not cached goes to the log."""
    if isinstance(match, str):
        log.info("insert-cached-attention: the %s at %s is not cached: %s", what, layer_of(op), match)
        return None
    return match


def find_ops(fn: func.FuncOp, op_type: type[Operation], match: Callable[[Any], Any], what: str) -> Found:
    """What `match` finds at `fn`'s ops of `op_type`, in program order; why a near miss (a
    string) is not cached goes to the log, naming the op as `what`."""
    return Found([m for op in fn.body.block.ops
                  if isinstance(op, op_type) and (m := logged(match(op), op, what)) is not None])


def optional(value: SSAValue | None) -> list[SSAValue]:
    """An optional operand as xDSL builds it: the value, or none."""
    return [value] if value is not None else []
