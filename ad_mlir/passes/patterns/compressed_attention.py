"""DeepSeek-V4's compressed K/V entries as HF writes them (transformers 5.24,
`DeepseekV4Attention` with a CSA or HCA compressor), for `insert-cached-attention` to cache
them beside the sliding-window keys.

Its attention (one shared K = V head) concatenates the compressor's entries to the keys and
the compressor's block bias to HF's mask, on the key axis:
    kv   = cat([kv, compressed_kv], dim=2)                      (then repeat_kv: key and value)
    mask = cat([mask, block_bias], dim=-1)
HCA's block bias lets query t see entry w iff w < (t + 1) // compress_rate:
    block_bias = masked_fill(new_zeros(...), arange(entries) >= (position_ids + 1) // rate, -inf)
CSA's is built by a scatter of its indexer's top-k selection instead. `match_compressed_keys`
reads this shape from a matched attention; None when its key is no such concatenation.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects.builtin import FloatAttr, IntegerAttr
from xdsl.ir import Operation, SSAValue

from ad_mlir.dialects import ad
from ad_mlir.passes.patterns.attention_masks import backward_slice
from ad_mlir.passes.patterns.attention_patterns import Attention
from ad_mlir.passes.patterns.matching import producer

MASKED_FILL = "aten.masked_fill.Scalar"
NEW_ZEROS = "aten.new_zeros.default"
FLOOR_DIVIDE = "aten.floor_divide.default"
TOPK = "aten.topk.default"


@dataclass(frozen=True)
class CompressedKeys:
    """An attention over sliding-window keys and compressed entries (module docstring)."""

    key: SSAValue
    """The sliding-window keys [batch, kv_heads, seq, head_dim], also the values."""
    compressed: SSAValue
    """The compressed entries [batch, kv_heads, entries, head_dim], each its own key and value."""
    mask: SSAValue
    """HF's mask of the sliding-window keys."""
    hidden: SSAValue
    """The block bias's boolean mask: True where a query may not see an entry."""
    ops: list[Operation]
    """The concatenations and the block bias's masked_fill, users first."""


@dataclass(frozen=True)
class UncachedCompression:
    """Compressed entries of a form not cached: CSA (`sparse`: an indexer's top-k selection) or
    a compress rate above 1 (`rate`, None where the graph does not show it)."""

    sparse: bool
    rate: int | None

    def describe(self) -> str:
        kind = "CSA (compressed entries selected by an indexer's top-k)" if self.sparse else "HCA"
        rate = f"compress rate {self.rate}" if self.rate is not None else "a compress rate not read from the graph"
        return f"DeepSeek-V4 {kind} at {rate}"


def match_compressed_keys(attention: Attention) -> CompressedKeys | UncachedCompression | None:
    """DeepSeek-V4's keys ++ compressed entries of `attention` (module docstring): the entries
    and the block bias's mask when they are HCA's at compress rate 1 (one entry per token, seen
    causally), what they are instead when not; None when the key is no such concatenation."""
    cat = producer(attention.key, ad.CatOp)
    if cat is None or attention.value != attention.key or len(cat.tensors) != 2 or attention.mask is None \
            or attention.key_seq_first or _dim(cat, 4) != 2:
        return None
    masks = producer(attention.mask, ad.CatOp)
    if masks is None or len(masks.tensors) != 2 or _dim(masks, 4) != 3:
        return None
    key, compressed = cat.tensors
    mask, bias = masks.tensors
    found = _rate_one_bias(bias)
    if found is None:
        return UncachedCompression(_reads(bias, TOPK), _rate(bias))
    fill, zeros = found
    return CompressedKeys(key, compressed, mask, fill.inputs[1], [masks, cat, fill, zeros])


def _rate_one_bias(bias: SSAValue) -> tuple[ad.TorchOp, ad.TorchOp] | None:
    """(the masked_fill, its zeros) when `bias` is HCA's block bias at compress rate 1: zeros
    filled with -inf where `arange(entries) >= (position_ids + 1) // 1`."""
    fill = bias.owner
    if not (isinstance(fill, ad.TorchOp) and fill.target.data == MASKED_FILL and len(fill.inputs) == 2
            and bias.has_one_use()):
        return None
    zeros = fill.inputs[0].owner
    value = fill.args.data[2] if len(fill.args.data) == 3 else None
    if not (isinstance(zeros, ad.TorchOp) and zeros.target.data == NEW_ZEROS) \
            or not isinstance(value, FloatAttr) or value.value.data != float("-inf") or _rate(bias) != 1:
        return None
    return fill, zeros


def _rate(bias: SSAValue) -> int | None:
    """The compress rate the block bias divides the positions by (HF's `(position_ids + 1) //
    rate`: the last such division its values are computed from, as earlier layers' come first),
    None where it holds no such division."""
    divisors = [op.args.data[1] for op in backward_slice(bias, values_only=True)[0]
                if isinstance(op, ad.TorchOp) and op.target.data == FLOOR_DIVIDE and len(op.args.data) == 2]
    return divisors[-1].value.data if divisors and isinstance(divisors[-1], IntegerAttr) else None


def _reads(value: SSAValue, target: str) -> bool:
    return any(isinstance(op, ad.TorchOp) and op.target.data == target for op in backward_slice(value)[0])


def _dim(cat: ad.CatOp, rank: int) -> int:
    return ad.normalize_dim(cat.dim.value.data if cat.dim is not None else 0, rank)
