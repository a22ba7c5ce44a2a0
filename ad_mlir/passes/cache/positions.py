"""Positions a decoder counts itself, given the step's real ones (the driver's, once the mixers
are cached).

A decoder whose forward takes no `position_ids` counts its positions itself: BART's, mBART's,
TrOCR's and BlenderBot's learned positional embedding, Pegasus' and Marian's sinusoidal table,
indexed by `arange(seq)` (plus BART's offset of 2); Inkling's log scaling of its full layers'
queries by `tau(arange(seq) + 1)`. Such a range (`step_positions.match_step_positions`: from 0
by 1 over `input_ids`' sequence axis, int64, each of its uses turned into positions by an
embedding's indices, cos/sin or a cast to a float through per-position ops only) gets the step's
real positions. In the slot form they are each row's cache start + the range
(`cache_starts[:, None] + arange(seq)`), flattened to [batch * seq] so that the ops between the
range and the table keep their types; where the looked-up rows (one per position, no batch axis)
meet the [batch, seq, ...] rows (the add to the token embeddings, TrOCR's expand over the batch,
Inkling's [1, 1, seq, 1] factor on the [batch, heads, seq, head_dim] query), they are viewed as
[batch, seq, ...] ([batch, 1, seq, 1]). In the paged form they are the `position_ids` input [1,
T], viewed as [T] (an argument added after the others where the model has none). Whatever the
model adds to the range (BART's 2) stays and applies to the real positions. A range used in any
other way (compared with each row's length, indexing rows) is left alone and refused by the
driver, naming its layer.
"""

from __future__ import annotations

import logging

from xdsl.dialects import func
from xdsl.dialects.builtin import DYNAMIC_INDEX, DenseArrayBase, IndexType, IntegerAttr, TensorType, i64
from xdsl.ir import SSAValue
from xdsl.rewriter import InsertPoint, Rewriter

from ad_mlir.dialects import ad
from ad_mlir.passes.cache.interface import POSITION_INPUT, append_argument, layer_of
from ad_mlir.passes.patterns.attention_masks import input_name
from ad_mlir.passes.patterns.matching import erase_dead
from ad_mlir.passes.patterns.step_positions import StepPositions, match_step_positions, rows_axis
from ad_mlir.passes.position_mixing import position_mixers

log = logging.getLogger(__name__)


def positions_from_starts(fn: func.FuncOp, starts: SSAValue) -> None:
    """The slot form: a range counting the step's tokens as positions (`match_step_positions`)
    becomes each row's real ones, its cache start + 0..seq-1, flattened to [batch * seq] so that
    the per-position ops keep their types; where those meet the rows, they are viewed as
    [batch, 1.., seq, ...] (the token axis where the rows have it)."""
    for found in _step_positions(fn, batched=True):
        arange = found.arange
        column, row = _unsqueezed(starts, 1), _unsqueezed(arange.result, 0)
        grid = ad.AddOp(column.result, row.result, TensorType(i64, [DYNAMIC_INDEX, DYNAMIC_INDEX]))
        flat = _viewed(grid.result, [], [-1])
        batch = ad.SymSizeOp.build(operands=[found.input_ids], properties={"dim": IntegerAttr(0, i64)},
                                   result_types=[IndexType()])
        new_ops = [column, row, grid, flat, batch]
        for op in new_ops:
            op.location = arange.location
        Rewriter.insert_op(new_ops, InsertPoint.after(arange))
        flat.result.name_hint = "positions"
        arange.result.replace_uses_with_if(flat.result, lambda use, keep=row: use.operation is not keep)
        for op, index in found.meetings:
            value = op.operands[index]
            rest = list(value.type.get_shape()[value.type.get_shape().index(DYNAMIC_INDEX) + 1:])
            ones = [1] * (rows_axis(value, op.results[0]) - 1)
            view = _viewed(value, [batch.result, arange.end], [DYNAMIC_INDEX, *ones, DYNAMIC_INDEX, *rest])
            view.location = op.location
            Rewriter.insert_op(view, InsertPoint.before(op))
            op.operands[index] = view.result
        log.info("insert-cached-attention: the positions counted at %s start at each row's cache start",
                 layer_of(arange))


def positions_from_input(fn: func.FuncOp) -> None:
    """The paged form: a range counting the step's tokens as positions (`match_step_positions`)
    becomes the `position_ids` input [1, tokens] (an argument added where the model has none),
    viewed as [tokens]."""
    found = _step_positions(fn, batched=False)
    if not found:
        return
    given = [a for a in fn.body.block.args if input_name(fn, a) == POSITION_INPUT]
    positions = given[0] if given else append_argument(fn, TensorType(i64, [1, DYNAMIC_INDEX]),
                                                       {ad.INPUT_ATTR: POSITION_INPUT})
    flat = _viewed(positions, [], [-1])
    flat.location = found[0].arange.location
    Rewriter.insert_op(flat, InsertPoint.at_start(fn.body.block))
    flat.result.name_hint = "positions"
    for f in found:
        log.info("insert-cached-attention: the positions counted at %s are the %s input", layer_of(f.arange),
                 POSITION_INPUT)
        size = f.arange.end.owner
        f.arange.result.replace_all_uses_with(flat.result)
        erase_dead(Rewriter.erase_op, [f.arange, size])


def _step_positions(fn: func.FuncOp, batched: bool) -> list[StepPositions]:
    """The ranges of `fn` that count the step's tokens as positions, in program order, among
    those the mixer check would refuse; why another one is not, to the log."""
    found = []
    for mixer in position_mixers(fn):
        if not isinstance(mixer.op, ad.ArangeOp):
            continue
        match = match_step_positions(fn, mixer.op, batched)
        if isinstance(match, str):
            log.info("insert-cached-attention: the range at %s does not take the step's positions: %s",
                     layer_of(mixer.op), match)
        elif match is not None:
            found.append(match)
    return found


def _unsqueezed(value: SSAValue, dim: int) -> ad.UnsqueezeOp:
    shape = list(value.type.get_shape())
    return ad.UnsqueezeOp.build(operands=[value], properties={"dim": IntegerAttr(dim, i64)},
                                result_types=[TensorType(value.type.element_type, [*shape[:dim], 1, *shape[dim:]])])


def _viewed(value: SSAValue, sizes: list[SSAValue], static: list[int]) -> ad.ReshapeOp:
    """`value` reshaped to `static` (DYNAMIC_INDEX where `sizes` gives the size, -1 inferred)."""
    shape = [DYNAMIC_INDEX if d in (DYNAMIC_INDEX, -1) else d for d in static]
    return ad.ReshapeOp.build(operands=[value, sizes], properties={"static_sizes": DenseArrayBase.from_list(i64, static)},
                              result_types=[TensorType(value.type.element_type, shape)])
