"""A decoder's positions counted inside the graph: `arange(0, seq)` over the step's tokens, as
HF's decoders without a `position_ids` input spell them (BART's, mBART's and TrOCR's learned
positional embedding of `arange(past, past + seq)` plus an offset of 2, Pegasus' and Marian's
sinusoidal table, BlenderBot's learned one, with `past` 0 in the export), becoming positions as
an embedding's indices or RoPE's cos/sin, or cast to a float as numbers (Inkling's log scaling
of each query and its relative bias by `tau(position)`, viewed as [1, 1, seq, 1]).

Such a range is exact as positions only for a prefill from 0: with a cache, token t of a step
is at start + t. `match_step_positions` finds a range that can take the real positions: it
counts the tokens of `input_ids`' sequence axis from 0 by 1, and every use of it turns it into
positions (through an embedding, cos/sin or a cast to a float) by per-position ops (unsqueeze,
cast, broadcast, a view that keeps only the token axis, elementwise arithmetic with no other
token tensor: BART's `+ 2`, Inkling's clamp and log), so each token's values read its own
position and nothing else. Where the range's values (one per token, no batch axis) first meet
rows of [batch, ..., seq, ...] (the add to the token embeddings, TrOCR's expand over the batch,
Inkling's product with the [batch, heads, seq, head_dim] query) is where per-row positions,
given flattened, are viewed as [batch, 1.., seq, ...] again."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects import func
from xdsl.dialects.builtin import DYNAMIC_INDEX, IntegerAttr, TensorType, i64
from xdsl.ir import BlockArgument, Operation, SSAValue

from ad_mlir.dialects import ad
from ad_mlir.passes.patterns.attention_masks import input_name
from ad_mlir.passes.patterns.matching import describe_op, is_float_cast

TOKENS_INPUT = "input_ids"


@dataclass(frozen=True)
class StepPositions:
    arange: ad.ArangeOp
    input_ids: BlockArgument
    """The token ids [batch, seq] whose sequence axis the range counts."""
    meetings: tuple[tuple[Operation, int], ...]
    """(op, operand index) where a value computed per position from the range (its token axis
    the only dynamic one) meets [batch, seq, ...] rows: an elementwise op with a token tensor,
    or an expand over the batch. Only with `batched`."""


def match_step_positions(fn: func.FuncOp, arange: ad.ArangeOp, batched: bool) -> StepPositions | str | None:
    """The range `arange` as the step's positions; None where it spans no token axis, else why
    its uses are not positions alone. `batched`: the step's rows are [batch, seq] (the slot form),
    so the meetings with the rows must be of a shape that takes them (`_meets_rows`)."""
    shape = arange.result.type.get_shape()
    if shape != (DYNAMIC_INDEX,):
        return None
    if arange.result.type.element_type != i64 or not _is_int(arange.start, 0) or not _is_int(arange.step, 1):
        return "it is not a range of int64 from 0 by 1"
    tokens = _counted_tokens(fn, arange.end)
    if tokens is None:
        return f"its length is not the sequence length of '{TOKENS_INPUT}' [batch, seq]"
    meetings: list[tuple[Operation, int]] = []
    why = _walk(arange.result, encoded=False, flat=batched, meetings=meetings)
    return why if why is not None else StepPositions(arange, tokens, tuple(meetings))


def _is_int(value: SSAValue, expected: int) -> bool:
    const = value.owner
    return isinstance(const, ad.ConstantOp) and isinstance(const.value, IntegerAttr) and \
        const.value.value.data == expected


def _counted_tokens(fn: func.FuncOp, end: SSAValue) -> BlockArgument | None:
    """The `input_ids` argument whose dim 1 `end` is the size of."""
    size = end.owner
    if not isinstance(size, ad.SymSizeOp) or not isinstance(size.input, BlockArgument):
        return None
    ids = size.input
    if input_name(fn, ids) != TOKENS_INPUT or len(ids.type.get_shape()) != 2 or size.dim.value.data % 2 != 1:
        return None
    return ids


def _walk(value: SSAValue, encoded: bool, flat: bool, meetings: list[tuple[Operation, int]]) -> str | None:
    """Follow `value` (computed from the range) to where it is positions: why not, or None. `encoded`:
    it went through an embedding or cos/sin; `flat`: it has no batch axis yet (meetings recorded)."""
    for use in value.uses:
        user = use.operation
        now_encoded = encoded or (isinstance(user, ad.EmbeddingOp) and use.index == 1) or \
            isinstance(user, ad.CosOp | ad.SinOp) or is_float_cast(user)
        if _per_position(user, value):
            why = _walk(user.results[0], now_encoded, flat, meetings)
        elif isinstance(user, ad.ExpandOp):  # broadcast over the batch: each row the same positions
            why = _meet(user, use.index, meetings) if flat else None
            why = why or _walk(user.result, now_encoded, False, meetings)
        elif not encoded:
            why = (f"it reaches {describe_op(user)} before it becomes positions (an embedding's indices, cos/sin or "
                   "a float)")
        else:
            why = _meet(user, use.index, meetings) if flat else None
        if why is not None:
            return why
    return None


def _per_position(op: Operation, value: SSAValue) -> bool:
    """`op` computes each position's values from that position's alone: an unsqueeze, a cast,
    an expand to static sizes, a view of [seq] with other dims of 1 only, an embedding of
    `value`, or elementwise arithmetic (a torch clamp too) whose other operands have no token
    axis."""
    if isinstance(op, ad.UnsqueezeOp | ad.CastOp):
        return True
    if isinstance(op, ad.ReshapeOp):
        shape = op.result.type.get_shape()
        return value.type.get_shape() == (DYNAMIC_INDEX,) and shape.count(DYNAMIC_INDEX) == 1 and \
            all(d in (1, DYNAMIC_INDEX) for d in shape)
    if isinstance(op, ad.TorchOp) and op.target.data in ELEMENTWISE_TORCH_OPS:
        return tuple(op.inputs) == (value,)
    if isinstance(op, ad.ExpandOp):
        return not op.sizes
    if isinstance(op, ad.EmbeddingOp):
        return op.indices is value and not _has_token_axis(op.weight)
    return isinstance(op, ad.ElementwiseOp) and len(op.results) == 1 and \
        not any(_has_token_axis(v) for v in op.operands if v is not value)


ELEMENTWISE_TORCH_OPS = frozenset({"aten.clamp.default"})
"""Opaque torch ops that compute each element from that element alone (with number arguments)."""


def _meet(op: Operation, index: int, meetings: list[tuple[Operation, int]]) -> str | None:
    """Record where per-position values meet [batch, seq, ...] rows; why that shape does not
    take per-row positions viewed as [batch, seq], or None."""
    if not isinstance(op, ad.ElementwiseOp | ad.ExpandOp) or not _meets_rows(op.operands[index], op.results[0]):
        return (f"its per-position values meet the [batch, seq] rows in {describe_op(op)}, not as a broadcast "
                "of [seq, ...] against [batch, seq, ...]")
    meetings.append((op, index))
    return None


def _meets_rows(value: SSAValue, result: SSAValue) -> bool:
    """`value` ([seq, ...] or [1.., seq, ...], the rest static) broadcast into `result` [batch,
    ..., seq, ...]: its token axis, aligned from the right, is one of the result's after a
    dynamic batch (`rows_axis`)."""
    shape, out = value.type.get_shape(), result.type.get_shape()
    token = shape.index(DYNAMIC_INDEX)
    return all(d == 1 for d in shape[:token]) and rows_axis(value, result) >= 1 and out[0] == DYNAMIC_INDEX


def rows_axis(value: SSAValue, result: SSAValue) -> int:
    """The axis of `result` that `value`'s token axis broadcasts to (aligned from the right)."""
    shape = value.type.get_shape()
    return len(result.type.get_shape()) - (len(shape) - shape.index(DYNAMIC_INDEX))


def _has_token_axis(value: SSAValue) -> bool:
    return isinstance(value.type, TensorType) and DYNAMIC_INDEX in value.type.get_shape()
