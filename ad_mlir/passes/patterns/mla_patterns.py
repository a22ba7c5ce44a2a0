"""Multi-head latent attention (MLA: DeepSeek-V2/V3 and the models built like them) as HF writes
it, for `insert-cached-attention` to cache the compressed latent instead of the heads' K and V.

HF's `DeepseekV3Attention` (transformers 5.24, eager and SDPA alike) expands a normalized latent
`c` [batch, 1, seq, rank] and a rotated key part shared by the heads `k_rot` [batch, 1, seq,
rope] into per-head keys and values before an ordinary attention:
    kv        = transpose(view(linear(c, W_kv_b), [batch, seq, heads, nope + v_dim]), 1, 2)
    k_nope, v = split(kv, [nope, v_dim], -1)
    key       = [k_nope, expand(k_rot, [batch, heads, seq, rope])] along the last dim
    query     = cat(q_nope, q_rot, -1)
    out       = attention(query, key, v)
where the key is written either as `cat` or as HF's `new_empty` with two `copy_` into slices of
it. RoPE stays where the graph computes it (on q_rot and k_rot, from position ids, interleaved or
not): the cached op takes the rotated parts. `match_mla` reads this shape around an attention
found by `attention_patterns`; None when its value is no such expansion (it is no MLA).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.ir import Operation, SSAValue

from ad_mlir.dialects import ad
from ad_mlir.passes.patterns.attention_patterns import Attention
from ad_mlir.passes.patterns.matching import producer

NEW_EMPTY = "aten.new_empty.default"
COPY = "aten.copy_.default"


@dataclass(frozen=True)
class Mla:
    """One MLA: the attention it was, and what `ad.cached_mla_attention` takes."""

    attention: Attention
    q_nope: SSAValue
    q_rope: SSAValue
    latent: SSAValue
    """[batch, 1, seq, rank]: the normalized compressed K/V."""
    k_rope: SSAValue
    """[batch, 1, seq, rope]: the rotated key part every head shares."""
    kv_b_weight: SSAValue
    ops: list[Operation]
    """The expansion's ops, users first (erased once dead)."""


def match_mla(attention: Attention) -> Mla | str | None:
    """The MLA around `attention` (module docstring); None when its value is not split from an
    up-projected single-head latent; why not, when it is but the rest differs."""
    expansion = _expansion(attention.value)
    if expansion is None:
        return None
    split, view_ops, linear = expansion
    if attention.rope is not None or attention.softcap is not None or attention.alibi is not None \
            or attention.qk_norm is not None or (attention.sinks is not None and len(attention.sinks.type.get_shape()) != 1):
        return "its attention applies RoPE, a soft cap, ALiBi, QK-norm or sink logits per token itself"
    key = _key_parts(attention.key)
    if key is None or key[0] != split.outputs[0]:
        return "its key is not [k_nope, k_rot expanded to every head] of the expanded latent's k_nope"
    _, k_rope, key_ops = key
    query = producer(attention.query, ad.CatOp)
    if query is None or len(query.tensors) != 2 or not _last_dim(query):
        return "its query is not cat(q_nope, q_rot) along the head dim"
    q_nope, q_rope = query.tensors
    if q_rope.type.get_shape()[3] != k_rope.type.get_shape()[3] or q_nope.type.get_shape()[3] != \
            split.outputs[0].type.get_shape()[3]:
        return "its query's nope and rope parts are not the key's widths"
    ops = [query, *key_ops, split, *view_ops, linear]
    return Mla(attention, q_nope, q_rope, linear.input, k_rope, linear.weight, ops)


def _expansion(value: SSAValue) -> tuple[ad.SplitOp, list[Operation], ad.LinearOp] | None:
    """(split, views, linear) when `value` is the second piece of a split of
    `transpose(view(linear(c, W)), 1, 2)` along the head dim, c [batch, 1, seq, rank] and the
    linear without bias."""
    split = value.owner
    if not isinstance(split, ad.SplitOp) or len(split.outputs) != 2 or value != split.outputs[1] \
            or ad.normalize_dim(split.dim.value.data if split.dim else 0, 4) != 3:
        return None
    transpose = producer(split.input, ad.TransposeOp)
    view = producer(transpose.input, ad.ReshapeOp) if transpose is not None else None
    linear = producer(view.input, ad.LinearOp) if view is not None else None
    if linear is None or linear.bias is not None or len(linear.input.type.get_shape()) != 4 \
            or linear.input.type.get_shape()[1] != 1:
        return None
    if {ad.normalize_dim(d.value.data, 4) for d in (transpose.dim0, transpose.dim1)} != {1, 2}:
        return None
    return split, [transpose, view], linear


def _key_parts(key: SSAValue) -> tuple[SSAValue, SSAValue, list[Operation]] | None:
    """(k_nope, k_rot [batch, 1, seq, rope], ops users first) when `key` is k_nope and k_rot
    expanded to the heads, joined as `cat` or as `new_empty` written by two `copy_` (the nope
    slice first)."""
    cat = producer(key, ad.CatOp)
    if cat is not None:
        if len(cat.tensors) != 2 or not _last_dim(cat):
            return None
        k_nope, rot = cat.tensors
        expand = producer(rot, ad.ExpandOp)
        return (k_nope, expand.input, [cat, expand]) if _one_head(expand) else None
    empty = key.owner
    if not isinstance(empty, ad.TorchOp) or empty.target.data != NEW_EMPTY:
        return None
    users = [use.operation for use in empty.outputs[0].uses]
    copies = [c for op in users if (c := _copy_into_slice(op)) is not None]
    if len(copies) != 2 or len(users) != 3:  # the two slices and the attention
        return None
    (nope_slice, nope_copy, k_nope), (rot_slice, rot_copy, rot) = sorted(copies, key=lambda c: _slice_start(c[0]))
    width = k_nope.type.get_shape()[3]
    expand = producer(rot, ad.ExpandOp)
    if _slice_start(nope_slice) != 0 or _slice_start(rot_slice) != width or not _one_head(expand):
        return None
    return k_nope, expand.input, [nope_copy, rot_copy, nope_slice, rot_slice, empty, expand]


def _copy_into_slice(op: Operation) -> tuple[ad.SliceOp, ad.TorchOp, SSAValue] | None:
    """(slice, copy_, source) when `op` is a last-dim slice written whole by one `copy_`."""
    if not isinstance(op, ad.SliceOp) or ad.normalize_dim(op.dim.value.data, 4) != 3 or not op.result.has_one_use():
        return None
    copy = next(iter(op.result.uses)).operation
    if not isinstance(copy, ad.TorchOp) or copy.target.data != COPY or len(copy.inputs) != 2 \
            or copy.inputs[0] != op.result or copy.outputs[0].uses:
        return None
    return op, copy, copy.inputs[1]


def _slice_start(op: ad.SliceOp) -> int:
    return op.static_bounds.get_values()[0]


def _one_head(expand: ad.ExpandOp | None) -> bool:
    """`expand` broadcasts a [batch, 1, seq, rope] key part to every head."""
    return expand is not None and len(expand.input.type.get_shape()) == 4 and expand.input.type.get_shape()[1] == 1


def _last_dim(cat: ad.CatOp) -> bool:
    return ad.normalize_dim(cat.dim.value.data if cat.dim else 0, 4) == 3
