"""The logits computed for some tokens only (the driver's, with a `logits_indices` argument):
AutoDeploy's `gather_logits_before_lm_head`.

The LM head runs only on the tokens `logits_indices` names: its input is gathered along the token
axis (a prefill wants its last token's logits only; paged, the step's tokens of every sequence
are flattened, so the logits are [1, n, vocab]). The LM head is the `ad.linear` that the logits
come from, through elementwise ops only (a cast, Gemma2's soft cap); without one the logits
themselves are gathered (their next-to-last axis must be the tokens', else the pass refuses).
"""

from __future__ import annotations

import logging

from xdsl.dialects import func
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    ArrayAttr,
    DictionaryAttr,
    IntegerAttr,
    StringAttr,
    TensorType,
    i64,
)
from xdsl.ir import Operation, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.utils.exceptions import PassFailedException

from ad_mlir.dialects import ad
from ad_mlir.passes.patterns.matching import describe_op

log = logging.getLogger(__name__)


def gather_logits(fn: func.FuncOp, indices: SSAValue) -> None:
    """The LM head's input gathered at `indices` along the token axis (`aten.index_select`), so
    the LM head and what follows it (elementwise) run on those tokens only. Logits that come
    from no `ad.linear` through elementwise ops are gathered themselves (the same rows, without
    the saving), when their next-to-last axis is the tokens'."""
    returned = fn.body.block.last_op
    logits = returned.operands[0] if isinstance(returned, func.ReturnOp) and returned.operands else None
    head = _lm_head(logits) if logits is not None else None
    if head is None and (logits is None or not _token_axis_is_next_to_last(logits)):
        what = describe_op(logits.owner) if logits is not None and isinstance(logits.owner, Operation) else "no op"
        raise PassFailedException(
            f"insert-cached-attention: the logits (the function's first result, from {what}) do not come from an "
            "ad.linear LM head through elementwise ops, nor are they [..., tokens, vocab], so they cannot be "
            "computed for the logits_indices tokens alone")
    rows = head.input if head is not None else logits
    gather = ad.TorchOp.build(
        operands=[[rows, indices]], result_types=[[rows.type]],
        properties={"target": StringAttr("aten.index_select.default"),
                    "args": ArrayAttr([ad.OperandRefAttr(0), IntegerAttr(len(rows.type.get_shape()) - 2, i64),
                                       ad.OperandRefAttr(1)]),
                    "kwargs": DictionaryAttr({})})
    if head is not None:
        gather.location = head.location
        gather.results[0].name_hint = "logits_rows"
        Rewriter.insert_op(gather, InsertPoint.before(head))
        head.operands[0] = gather.results[0]
    else:
        log.info("insert-cached-attention: the logits come from %s, not an ad.linear LM head: the logits are "
                 "gathered, not its input", describe_op(logits.owner) if isinstance(logits.owner, Operation) else "an argument")
        Rewriter.insert_op(gather, InsertPoint.before(returned))
        returned.operands[0] = gather.results[0]


def _lm_head(logits: SSAValue) -> ad.LinearOp | None:
    """The `ad.linear` the logits come from through elementwise ops and casts that have no
    other per-token operand, or None."""
    value: SSAValue | None = logits
    while value is not None and not isinstance(value.owner, ad.LinearOp):
        owner = value.owner
        per_token = [v for v in getattr(owner, "operands", ()) if _has_token_axis(v)]
        value = per_token[0] if isinstance(owner, ad.ElementwiseOp | ad.CastOp) and len(per_token) == 1 else None
    return value.owner if value is not None else None


def _token_axis_is_next_to_last(value: SSAValue) -> bool:
    return isinstance(value.type, TensorType) and len(value.type.get_shape()) >= 2 and \
        value.type.get_shape()[-2] == DYNAMIC_INDEX


def _has_token_axis(value: SSAValue) -> bool:
    """A tensor with a dynamic dim (the flattened tokens'); weights and scalars have none."""
    return isinstance(value.type, TensorType) and DYNAMIC_INDEX in value.type.get_shape()
