"""Which values of a function are weights, or computed from weights alone.

Such values are the same on every call: the exporter computes them once (the weight
concatenation of `fuse-gemms`, a cast of a weight, Gemma's `1 + w`), so fusion leaves them
out of regions and the kernel count does not include them.
"""

from __future__ import annotations

from collections.abc import Container

from xdsl.dialects import func
from xdsl.dialects.builtin import DictionaryAttr
from xdsl.ir import Operation, SSAValue
from xdsl.traits import Pure

from ad_mlir.dialects import ad


def weight_of(arg_attrs: DictionaryAttr) -> tuple[str, str] | None:
    """(attribute name, FQN) of a weight argument, None for a user input."""
    for name in ad.WEIGHT_ATTRS:
        if name in arg_attrs.data:
            return name, arg_attrs.data[name].data
    return None


def weight_arguments(fn: func.FuncOp) -> set[SSAValue]:
    """The entry-block arguments that stand for weights (not user inputs)."""
    attrs = fn.arg_attrs.data if fn.arg_attrs is not None else ()
    return {
        arg
        for arg, a in zip(fn.body.block.args, attrs, strict=False)
        if isinstance(a, DictionaryAttr) and any(name in a.data for name in ad.WEIGHT_ATTRS)
    }


def computes_from_weights_only(op: Operation, weight_only: Container[SSAValue]) -> bool:
    """A pure op whose operands are weight-only values or constants (at least one weight)."""
    if not op.has_trait(Pure) or isinstance(op, ad.ConstantOp | ad.FusedOp) or not op.operands:
        return False
    known = [v in weight_only or isinstance(v.owner, ad.ConstantOp) for v in op.operands]
    return all(known) and any(v in weight_only for v in op.operands)


def weight_only_values(fn: func.FuncOp) -> set[SSAValue]:
    """The weights and every value computed from weights alone, in `fn`'s entry block."""
    values = weight_arguments(fn)
    for op in fn.body.block.ops:
        if computes_from_weights_only(op, values):
            values.update(op.results)
    return values
