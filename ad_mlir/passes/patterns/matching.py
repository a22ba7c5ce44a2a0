"""Small helpers the LLM fusion patterns share to read a def-use chain."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    DenseArrayBase,
    FloatAttr,
    IntegerAttr,
    NameLoc,
    TensorType,
    i64,
)
from xdsl.ir import Attribute, Block, Operation, OpResult, SSAValue
from xdsl.traits import Pure

from ad_mlir.dialects import ad

OpT = TypeVar("OpT", bound=Operation)


def producer(value: SSAValue, op_type: type[OpT]) -> OpT | None:
    """The op of type `op_type` that defines `value`, if that is what defines it."""
    owner = value.owner
    return owner if isinstance(owner, op_type) else None


def sole_user(value: SSAValue, op_type: type[OpT]) -> OpT | None:
    """The only user of `value`, if it has one use and it is an `op_type`."""
    if not value.has_one_use():
        return None
    user = value.get_user_of_unique_use()
    return user if isinstance(user, op_type) else None


def constant(value: SSAValue) -> float | None:
    """The number an `ad.constant` holds, or None for anything else."""
    op = producer(value, ad.ConstantOp)
    if op is None or not isinstance(op.value, IntegerAttr | FloatAttr):
        return None
    return float(op.value.value.data)


def other_operand(op: Operation, value: SSAValue) -> SSAValue | None:
    """For a two-operand op with `value` as one operand: the other one."""
    a, b = op.operands
    if a == value:
        return b
    return a if b == value else None


def plain_binary(op: Operation, op_type: type[ad.BinaryOp]) -> bool:
    """`op` is an `op_type` without alpha (add/sub with alpha 1 only)."""
    return isinstance(op, op_type) and getattr(op, "alpha", None) is None


def is_last_dim_row_reduction(op: ad.ReductionOp) -> bool:
    rank = len(op.input.type.get_shape())
    return op.reduced_dims() == (rank - 1,) and op.keepdim is not None and getattr(op, "dtype", None) is None


def dominates_op(value: SSAValue, op: Operation) -> bool:
    """`value` is defined before `op` in `op`'s block (or is an argument of an enclosing block)."""
    owner = value.owner
    if isinstance(owner, Block):
        return True
    return owner.parent_block() is op.parent_block() and owner.is_before_in_block(op)


MASKED_FILLS = frozenset({"aten.masked_fill.Scalar", "aten.masked_fill_.Scalar", "aten.masked_fill.Tensor"})
"""`masked_fill`, its in-place form (XLM's `scores.masked_fill_(mask, lowest)`, which the
export keeps in place: the same value where the filled tensor has no other user, which the
matchers require of what they match) and its form with a 0-d tensor fill (CPM-Ant's
`torch.scalar_tensor`)."""
SCALAR_TENSOR = "aten.scalar_tensor.default"


def match_masked_fill(op: Operation) -> tuple[SSAValue, SSAValue, float | None, list[Operation]] | None:
    """(x, mask, the fill, [the fill's `scalar_tensor`]) when `op` is a torch `masked_fill(x,
    mask, fill)`, in place or not; the fill None where it is no number known here (a tensor not
    made by `torch.scalar_tensor` of one)."""
    if not isinstance(op, ad.TorchOp) or op.target.data not in MASKED_FILLS or len(op.inputs) not in (2, 3) \
            or len(op.args.data) != 3 or op.args.data[:2] != (ad.OperandRefAttr(0), ad.OperandRefAttr(1)):
        return None
    fill = op.args.data[2]
    if len(op.inputs) == 2:
        return op.inputs[0], op.inputs[1], _number(fill), []
    made = op.inputs[2].owner
    if fill != ad.OperandRefAttr(2) or not isinstance(made, ad.TorchOp) or made.target.data != SCALAR_TENSOR \
            or made.inputs or not made.args.data or not op.inputs[2].has_one_use():
        return op.inputs[0], op.inputs[1], None, []
    return op.inputs[0], op.inputs[1], _number(made.args.data[0]), [made]


def _number(attr: Attribute) -> float | None:
    return float(attr.value.data) if isinstance(attr, IntegerAttr | FloatAttr) else None


PURE_TORCH_TARGETS = frozenset({"aten.repeat_interleave.self_int"})
"""Opaque torch ops known to have no side effect (the patterns compare and erase them)."""


def is_pure(op: Operation) -> bool:
    """`op` computes its results from its operands alone (an `ad` op marked Pure, or a torch op of
    PURE_TORCH_TARGETS)."""
    if isinstance(op, ad.TorchOp):
        return op.target.data in PURE_TORCH_TARGETS
    return op.has_trait(Pure)


def same_computation(a: SSAValue, b: SSAValue, depth: int = 4) -> bool:
    """`a` and `b` are one value, or the same result of equal pure ops (name, properties,
    attributes) on operands that are, at most `depth` ops up (HF code that computes a table once
    per use: canonicalize's CSE does not merge opaque torch ops)."""
    if a == b:
        return True
    if depth == 0 or not isinstance(a, OpResult) or not isinstance(b, OpResult) or a.index != b.index:
        return False
    x, y = a.op, b.op
    if x.name != y.name or x.properties != y.properties or x.attributes != y.attributes or not is_pure(x):
        return False
    return len(x.operands) == len(y.operands) and all(
        same_computation(u, v, depth - 1) for u, v in zip(x.operands, y.operands, strict=True))


def erase_dead(erase: Callable[[Operation], None], ops: Iterable[Operation]) -> None:
    """Erase (with `erase`: a PatternRewriter's `erase`, or `Rewriter.erase_op` outside a
    pattern) the ops of a matched chain that lost their last use, users first, and then the
    constants only they used."""
    constants: dict[Operation, None] = {}
    for op in ops:
        if op.parent is not None and all(not r.uses for r in op.results):
            constants.update((v.owner, None) for v in op.operands if isinstance(v.owner, ad.ConstantOp))
            erase(op)
    for const in constants:
        if const.parent is not None and not const.result.uses:
            erase(const)


def keeps_rows(view: ad.ReshapeOp) -> bool:
    """A reshape that only regroups rows (the last dim stays, static), as OPT's
    `hidden.reshape(-1, hidden.size(-1))`: row-wise ops (norms, per-token quantization)
    commute with it."""
    before, after = view.input.type.get_shape(), view.result.type.get_shape()
    return bool(before) and bool(after) and before[-1] == after[-1] != DYNAMIC_INDEX


def reshape_like(view: ad.ReshapeOp, value: SSAValue, result_type: Attribute, last_size: int | None = None) -> ad.ReshapeOp:
    """`view`'s reshape applied to `value` (the same sizes; the last one `last_size` if given,
    e.g. 1 for per-row scales), typed `result_type`."""
    static = list(view.static_sizes.get_values())
    if last_size is not None:
        static[-1] = last_size
    op = ad.ReshapeOp.build(
        operands=[value, list(view.sizes)],
        properties={"static_sizes": DenseArrayBase.from_list(i64, static)},
        result_types=[result_type],
    )
    op.location = view.location
    return op


def describe_op(op: Operation) -> str:
    """`%name = ad.op at <HF module>`: an op as a user finds it in the IR."""
    name = f"%{op.results[0].name_hint} = " if op.results and op.results[0].name_hint else ""
    where = f" at {op.location.desc.data}" if isinstance(op.location, NameLoc) else ""
    return f"{name}{op.name}{where}"


def is_float_cast(op: Operation) -> bool:
    """`op` casts to a float type: integers (positions) become numbers that scale values."""
    # imported here: `ad-opt` on IR whose passes need no torch then loads none (~1 s a run)
    from ad_mlir.semantics.op_table import torch_dtype

    return isinstance(op, ad.CastOp) and isinstance(op.result.type, TensorType) \
        and torch_dtype(op.result.type.element_type).is_floating_point
