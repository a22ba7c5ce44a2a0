"""DeepSeek-V4's compressed K/V entries as HF writes them (transformers 5.24,
`DeepseekV4Attention` with a CSA or HCA compressor), for `insert-cached-attention` to cache
them beside the sliding-window keys.

Its attention (one shared K = V head) concatenates the compressor's entries to the keys and
the compressor's block bias to HF's mask, on the key axis:
    kv   = cat([kv, compressed_kv], dim=2)                      (then repeat_kv: key and value)
    mask = cat([mask, block_bias], dim=-1)
HCA's block bias lets query t see entry w iff w < (t + 1) // compress_rate:
    block_bias = masked_fill(new_zeros(...), arange(entries) >= (position_ids + 1) // rate, -inf)
CSA's lets it see only the entries its lightning indexer chose (-1: none):
    index  = sum(relu(q @ k^T) * scale * weights[..., None], dim=2)     (q [B, S, H, D], k [B, S, D])
    chosen = topk(masked_fill(index, arange(entries) >= (position_ids + 1) // rate, -inf),
                  min(index_topk, entries)).indices, -1 where past the threshold
    block_bias = scatter_(new_full(-inf), where(chosen >= 0, chosen, entries), 0)[..., :entries]
At compress rate 1 each CSA entry pools two tokens' halves: the previous token's (Ca, with its
gate) and its own (Cb); the export (`export_patches`) shifts the previous halves in as
`cat([fill, x], dim=1)[:, :-1]` (kv filled with 0, gates with -inf), for the compressor and for
the indexer's own keys: shifts by one token, which `insert-cached-attention` serves with cached
token windows (`token_window.match_shift`). `match_compressed_keys` reads this shape from a matched
attention; None when its key is no such concatenation.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects.builtin import FloatAttr, IntegerAttr
from xdsl.ir import Operation, OpResult, SSAValue

from ad_mlir.dialects import ad
from ad_mlir.passes.patterns.attention_masks import backward_slice
from ad_mlir.passes.patterns.attention_patterns import Attention
from ad_mlir.passes.patterns.matching import constant, producer

MASKED_FILL = "aten.masked_fill.Scalar"
NEW_ZEROS = "aten.new_zeros.default"
NEW_FULL = "aten.new_full.default"
SCATTER_ = "aten.scatter_.value"
SYM_MIN = "torch.sym_min"
FLOOR_DIVIDE = "aten.floor_divide.default"
TOPK = "aten.topk.default"


@dataclass(frozen=True)
class Selection:
    """CSA's lightning indexer over the compressed entries (module docstring), at compress rate 1
    the shape of `ad.cached_index_topk`'s `sum_h w_h relu(scale q_h . k_t)`."""

    query: SSAValue
    """[batch, seq, heads, dim], RoPE applied."""
    key: SSAValue
    """[batch, seq, dim]: one index key per entry, RoPE applied."""
    weights: SSAValue
    """[batch, seq, heads]."""
    scale: float
    k: int
    """HF's `index_topk`."""
    future: SSAValue
    """The index mask: True where a query may not see an entry."""
    topk: ad.TorchOp
    chosen: SSAValue
    """The chosen entries, -1 for none: what `ad.cached_index_topk` gives."""


@dataclass(frozen=True)
class CompressedKeys:
    """An attention over sliding-window keys and compressed entries (module docstring)."""

    key: SSAValue
    """The sliding-window keys [batch, kv_heads, seq, head_dim], also the values."""
    compressed: SSAValue
    """The compressed entries [batch, kv_heads, entries, head_dim], each its own key and value."""
    mask: SSAValue
    """HF's mask of the sliding-window keys."""
    hidden: SSAValue | None
    """HCA's block bias's boolean mask: True where a query may not see an entry."""
    selection: Selection | None
    """CSA's indexer."""
    ops: list[Operation]
    """The concatenations and the block bias's ops, users first."""


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
    and HCA's block bias's mask or CSA's indexer at compress rate 1 (one entry per token), what
    they are instead when not; None when the key is no such concatenation."""
    cat = producer(attention.key, ad.CatOp)
    if cat is None or attention.value != attention.key or len(cat.tensors) != 2 or attention.mask is None \
            or attention.key_seq_first or _dim(cat, 4) != 2:
        return None
    masks = producer(attention.mask, ad.CatOp)
    if masks is None or len(masks.tensors) != 2 or _dim(masks, 4) != 3:
        return None
    key, compressed = cat.tensors
    mask, bias = masks.tensors
    if _rate(bias) == 1 and (found := _rate_one_bias(bias)) is not None:
        fill, zeros = found
        return CompressedKeys(key, compressed, mask, fill.inputs[1], None, [masks, cat, fill, zeros])
    if _rate(bias) == 1 and (chosen := _csa_bias(bias)) is not None:
        selection, ops = chosen
        return CompressedKeys(key, compressed, mask, None, selection, [masks, cat, *ops])
    return UncachedCompression(_reads(bias, TOPK), _rate(bias))


def _csa_bias(bias: SSAValue) -> tuple[Selection, list[Operation]] | None:
    """CSA's block bias (module docstring): its indexer and the ops from the bias to the chosen
    entries, users first."""
    cut = producer(bias, ad.SliceOp)
    scatter = cut.input.owner if cut is not None else None
    if not (isinstance(scatter, ad.TorchOp) and scatter.target.data == SCATTER_ and len(scatter.inputs) == 2
            and _filled(scatter.inputs[0], NEW_FULL, float("-inf")) and scatter.args.data[-1] == FloatAttr(0.0, 64)):
        return None
    index = producer(scatter.inputs[1], ad.UnsqueezeOp)
    valid = producer(index.input, ad.WhereOp) if index is not None else None
    chosen = valid.input if valid is not None else None
    picked = producer(chosen, ad.WhereOp) if chosen is not None else None
    if picked is None or not isinstance(picked.other, OpResult) or picked.other.index != 1:
        return None
    topk = picked.other.owner
    if not (isinstance(topk, ad.TorchOp) and topk.target.data == TOPK and len(topk.inputs) == 2):
        return None
    selection = _indexer(topk, chosen)
    if selection is None:
        return None
    made = scatter.inputs[0].owner
    return selection, [cut, scatter, made, *(v.owner for v in made.operands[1:] if isinstance(v, OpResult)), index,
                       valid, *(v.owner for v in (valid.condition, valid.other) if isinstance(v, OpResult))]


def _indexer(topk: ad.TorchOp, chosen: SSAValue) -> Selection | None:
    """The indexer whose `topk` (of min(index_topk, entries)) the chosen entries come from."""
    masked, count = topk.inputs
    fill = masked.owner
    minimum = count.owner
    if not (isinstance(fill, ad.TorchOp) and fill.target.data == MASKED_FILL and len(fill.inputs) == 2
            and fill.args.data[2] == FloatAttr(float("-inf"), 64)
            and isinstance(minimum, ad.TorchOp) and minimum.target.data == SYM_MIN
            and isinstance(k := minimum.args.data[1], IntegerAttr)):
        return None
    summed = producer(fill.inputs[0], ad.SumOp)
    product = producer(summed.input, ad.MulOp) if summed is not None else None
    if product is None or tuple(summed.dim.get_values()) != (2,):
        return None
    for scored, weighed in ((product.input, product.other), (product.other, product.input)):
        weights = producer(weighed, ad.UnsqueezeOp)
        scaled = producer(scored, ad.MulOp)
        relu = producer(scaled.input, ad.ReluOp) if scaled is not None else None
        dots = producer(relu.input, ad.MatmulOp) if relu is not None else None
        keys = producer(dots.other, ad.UnsqueezeOp) if dots is not None else None
        transposed = producer(keys.input, ad.TransposeOp) if keys is not None else None
        scale = constant(scaled.other) if scaled is not None else None
        if weights is None or transposed is None or scale is None or scale <= 0:
            continue
        return Selection(dots.input, transposed.input, weights.input, scale, k.value.data, fill.inputs[1], topk,
                         chosen)
    return None


def _filled(value: SSAValue, target: str, fill: float) -> bool:
    made = value.owner
    return isinstance(made, ad.TorchOp) and made.target.data == target and made.args.data[-1] == FloatAttr(fill, 64)


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
