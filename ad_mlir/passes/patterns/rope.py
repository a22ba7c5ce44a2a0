"""HF's RoPE as the passes match it (rotate_half or interleaved pairs, full or partial rotary,
heads before or after the sequence): `fuse-rope-attention` fuses it into attention,
`optimize-rope` into `ad.rope`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    ArrayAttr,
    DenseArrayBase,
    IntegerAttr,
    TensorType,
    i64,
)
from xdsl.ir import Operation, SSAValue

from ad_mlir.dialects import ad
from ad_mlir.passes.patterns.matching import (
    is_pure,
    other_operand,
    plain_binary,
    producer,
    same_computation,
)


@dataclass
class Rope:
    """One tensor's RoPE as HF spells it (matched; nothing is built until the rewrite)."""

    x: SSAValue
    """The tensor rotated, all of its head dim: [b, h, s, d], or [b, s, h, d] when `heads_dim` is 2."""
    cos: SSAValue
    """The table that multiplies x's rotated dims, broadcast over heads (4-D, size 1 at heads_dim),
    or an `ad.rope`'s [b or 1, s, R] operand."""
    sin: SSAValue
    interleaved: bool
    heads_dim: int
    chain: list[Operation] = field(default_factory=list)
    """The pattern's ops, users first (erased once dead); not the tables."""

    @property
    def rotary_dim(self) -> int:
        return self.cos.type.get_shape()[-1]

    @property
    def heads_first_shape(self) -> tuple[int, ...]:
        """x's shape as [b, h, s, d]."""
        b, one, two, d = self.x.type.get_shape()
        return (b, one, two, d) if self.heads_dim == 1 else (b, two, one, d)


def _last_dim(op: ad.CatOp | ad.SliceOp, rank: int) -> bool:
    dim = op.dim.value.data if op.dim is not None else 0
    return ad.normalize_dim(dim, rank) == rank - 1


def _static_slice(op: Operation | None, x: SSAValue) -> tuple[int, int, int] | None:
    """(start, end, step) of a last-dim static slice of `x`, `end` clamped to the dim."""
    if not isinstance(op, ad.SliceOp) or op.input != x or op.bounds or not _last_dim(op, len(x.type.get_shape())):
        return None
    start, end, step = op.static_bounds.get_values()
    return start, min(end, x.type.get_shape()[-1]), step


def rotate_half_of(value: SSAValue) -> tuple[SSAValue, list[Operation]] | None:
    """`x` when `value` is `cat(-x[..., d/2:], x[..., :d/2])` on the last dim."""
    cat = producer(value, ad.CatOp)
    if cat is None or len(cat.tensors) != 2 or not _last_dim(cat, len(value.type.get_shape())):
        return None
    neg = producer(cat.tensors[0], ad.NegOp)
    high = neg.input.owner if neg is not None else None
    low = cat.tensors[1].owner
    if not isinstance(high, ad.SliceOp) or not isinstance(low, ad.SliceOp) or high.input != low.input:
        return None
    x = low.input
    d = x.type.get_shape()[-1]
    if _static_slice(high, x) != (d // 2, d, 1) or _static_slice(low, x) != (0, d // 2, 1) or d % 2:
        return None
    return x, [cat, neg, high, low]


def _torch_op(value: SSAValue, target: str) -> ad.TorchOp | None:
    op = producer(value, ad.TorchOp)
    return op if op is not None and op.target.data == target and not op.kwargs.data else None


def _int_arg(op: ad.TorchOp, i: int, default: int) -> int | None:
    """The i-th positional argument of a torch op, an int (`default` when not given)."""
    args = op.args.data
    if i >= len(args):
        return default
    return args[i].value.data if isinstance(args[i], IntegerAttr) else None


def rotate_every_two_of(value: SSAValue) -> tuple[SSAValue, list[Operation]] | None:
    """`x` when `value` is `flatten(stack(-x[..., 1::2], x[..., ::2], -1), -2)` (GPT-J's
    rotate_every_two; Ernie 4.5's and GLM's rotate_half), the flatten possibly a view merging
    the last two dims (as AOTAutograd, through torch.compile, writes it)."""
    flatten = _torch_op(value, "aten.flatten.using_ints") or _last_two_merged(value)
    stacked = flatten.operands[0] if flatten is not None else None
    stack = _torch_op(stacked, "aten.stack.default") if stacked is not None else None
    if stack is None or len(stack.args.data) < 1 or not isinstance(stack.args.data[0], ArrayAttr):
        return None
    rank = len(stacked.type.get_shape())
    flattened = (_int_arg(flatten, 1, 0), _int_arg(flatten, 2, -1)) if isinstance(flatten, ad.TorchOp) else (-2, -1)
    dims = (_int_arg(stack, 1, 0), *flattened)
    if None in dims or tuple(ad.normalize_dim(d, rank) for d in dims) != (rank - 1, rank - 2, rank - 1):
        return None
    refs = stack.args.data[0].data
    if len(refs) != 2 or not all(isinstance(r, ad.OperandRefAttr) for r in refs):
        return None
    neg = producer(stack.inputs[refs[0].index.data], ad.NegOp)
    even = stack.inputs[refs[1].index.data].owner
    odd = neg.input.owner if neg is not None else None
    if not isinstance(odd, ad.SliceOp) or not isinstance(even, ad.SliceOp) or odd.input != even.input:
        return None
    x = even.input
    d = x.type.get_shape()[-1]
    if d % 2 or _static_slice(even, x) != (0, d, 2) or _static_slice(odd, x) != (1, d, 2):
        return None
    return x, [flatten, stack, neg, odd, even]


def _last_two_merged(value: SSAValue) -> ad.ReshapeOp | None:
    """The view computing `value` when it merges its input's last two dims (static) and keeps
    the others, at most one of them dynamic (then equal by the element count): `flatten(x, -2)`."""
    view = producer(value, ad.ReshapeOp)
    if view is None:
        return None
    shape, merged = view.input.type.get_shape(), value.type.get_shape()
    if len(shape) != len(merged) + 1 or shape[:-2] != merged[:-1] or sum(d == DYNAMIC_INDEX for d in merged[:-1]) > 1 \
            or DYNAMIC_INDEX in shape[-2:] or merged[-1] != shape[-2] * shape[-1]:
        return None
    return view


def _is_table(table: SSAValue, x: SSAValue, heads_dim: int) -> bool:
    """`table` broadcasts over the heads of `x`: 4-D, size 1 at heads_dim, x's last dim."""
    shape, x_shape = table.type.get_shape(), x.type.get_shape()
    return len(shape) == 4 and shape[heads_dim] == 1 and shape[-1] == x_shape[-1] and shape[0] in (1, x_shape[0])


def _rotation(value: SSAValue, heads_dim: int) -> Rope | None:
    """`x * C + rotate(x) * S` (any operand order), with x's type throughout (no promotion)."""
    add = value.owner
    if not plain_binary(add, ad.AddOp):
        return None
    for straight, rotated in (add.operands, reversed(add.operands)):
        m1, m2 = producer(straight, ad.MulOp), producer(rotated, ad.MulOp)
        if m1 is None or m2 is None:
            continue
        for cos in m1.operands:
            x = other_operand(m1, cos)
            for sin in m2.operands:
                turned = other_operand(m2, sin)
                interleaved, rot = False, rotate_half_of(turned)
                if rot is None:
                    interleaved, rot = True, rotate_every_two_of(turned)
                if (rot is not None and rot[0] == x and _is_table(cos, x, heads_dim) and _is_table(sin, x, heads_dim)
                        and value.type == m1.result.type == m2.result.type == x.type):
                    return Rope(x, cos, sin, interleaved, heads_dim, [add, m1, m2, *rot[1]])
    return None


def _partial(value: SSAValue, heads_dim: int) -> Rope | None:
    """`cat(rot(x[..., :R]), x[..., R:])`: the rope of x, its dims past R passed through."""
    cat = producer(value, ad.CatOp)
    if cat is None or len(cat.tensors) != 2 or not _last_dim(cat, len(value.type.get_shape())):
        return None
    rope = _rotation(cat.tensors[0], heads_dim)
    passed = producer(cat.tensors[1], ad.SliceOp)
    if rope is None or passed is None:
        return None
    x, r = passed.input, rope.rotary_dim
    if _static_slice(passed, x) != (r, x.type.get_shape()[-1], 1) or value.type != x.type:
        return None
    # The rotated part: x[..., :R], or x itself when R is the head dim (canonicalize drops a full slice).
    if rope.x != x and _static_slice(rope.x.owner, x) != (0, r, 1):
        return None
    rope.chain = [cat, *rope.chain, passed, *([rope.x.owner] if rope.x != x else [])]
    rope.x = x
    return rope


def _rope_of(value: SSAValue, heads_dim: int) -> Rope | None:
    return _partial(value, heads_dim) or _rotation(value, heads_dim)


def swaps_heads_and_seq(op: ad.TransposeOp) -> bool:
    rank = len(op.input.type.get_shape())
    return rank == 4 and {ad.normalize_dim(d.value.data, rank) for d in (op.dim0, op.dim1)} == {1, 2}


def match_rope(value: SSAValue) -> Rope | None:
    """The RoPE that computes `value` ([b, h, s, d]), in any spelling of the module docstring."""
    if len(value.type.get_shape()) != 4:
        return None
    transpose = producer(value, ad.TransposeOp)
    if transpose is not None and swaps_heads_and_seq(transpose):
        rope = _rope_of(transpose.input, heads_dim=2)
        if rope is not None:
            rope.chain.insert(0, transpose)
            return rope
    return _rope_of(value, heads_dim=1)


def same_tables(a: Rope, b: Rope) -> bool:
    """`a` and `b` rotate alike: the same form, rotary dim and layout, the same tables."""
    return ((a.interleaved, a.heads_dim, a.rotary_dim) == (b.interleaved, b.heads_dim, b.rotary_dim)
            and same_computation(a.cos, b.cos) and same_computation(a.sin, b.sin))


Insert = Callable[[Operation], Operation]
"""Inserts a new op where the fused op goes (before it) and returns it."""


def heads_first(rope: Rope, insert: Insert) -> SSAValue:
    """The rotated tensor as [b, h, s, d]: x, or a new transpose of GPT-J's [b, s, h, d]."""
    if rope.heads_dim == 1:
        return rope.x
    x = rope.x.type
    transpose = ad.TransposeOp.build(operands=[rope.x],
                                     properties={"dim0": IntegerAttr(1, i64), "dim1": IntegerAttr(2, i64)},
                                     result_types=[TensorType(x.element_type, rope.heads_first_shape)])
    return insert(transpose).result


def _without_heads(table: SSAValue, heads_dim: int, insert: Insert) -> SSAValue:
    """The [b or 1, s, R] table that `table` broadcasts over heads: the operand of its unsqueeze,
    or a new squeeze of it (`table` itself when it is one already: an `ad.rope`'s)."""
    if len(table.type.get_shape()) == 3:
        return table
    unsqueeze = producer(table, ad.UnsqueezeOp)
    if unsqueeze is not None and ad.normalize_dim(unsqueeze.dim.value.data, 4) == heads_dim:
        return unsqueeze.input
    shape = [n for i, n in enumerate(table.type.get_shape()) if i != heads_dim]
    squeeze = ad.SqueezeOp.build(operands=[table], properties={"dim": DenseArrayBase.from_list(i64, [heads_dim])},
                                 result_types=[TensorType(table.type.element_type, shape)])
    return insert(squeeze).result


def tables(rope: Rope, insert: Insert) -> tuple[SSAValue, SSAValue]:
    """The op's cos and sin operands ([b or 1, s, R])."""
    return _without_heads(rope.cos, rope.heads_dim, insert), _without_heads(rope.sin, rope.heads_dim, insert)


def table_ops(*ropes: Rope, depth: int = 4) -> list[Operation]:
    """The pure ops that made the ropes' 4-D tables, `depth` ops up, users first (erased once
    dead: the key's copy of GPT-J's tables, an unsqueeze the op reads through)."""
    found: list[Operation] = []
    level = [t for r in ropes for t in (r.cos, r.sin)]
    for _ in range(depth):
        ops = [v.owner for v in level if isinstance(v.owner, Operation) and is_pure(v.owner)]
        found += ops
        level = [v for op in ops for v in op.operands]
    return found
