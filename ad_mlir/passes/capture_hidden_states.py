"""`capture-hidden-states`: the function also returns the residual stream (the hidden states)
after some decoder layers, for every token, concatenated along the hidden axis.

EAGLE-3's draft head reads the target's hidden states after a low, a middle and a high layer
(AutoDeploy's hidden-states cache, vLLM's auxiliary hidden states). `layers` numbers them as
HF's `output_hidden_states` and vLLM's `eagle_aux_hidden_state_layer_ids` do: `i` is the stream
after `i` decoder layers (0: the embeddings, as the first layer reads them; the layer count: the
last layer's output, before the final norm). The result is appended to the function's results:
`[..., tokens, len(layers) * hidden]`, the streams in the order `layers` gives them.

Layer boundaries come from the ops' locations (an op's HF module path names its layer:
`model.layers.7.mlp`, as `repeated_layers.layout` reads them). The stream after `i` layers is
the value that crosses from layer `i - 1` (or the ops before the layers) into layer `i` or
later, of the stream's type (that of the boundaries where one value crosses; others may carry
values the layers share, such as RoPE's cos and sin, a mask, or a view of them that CSE left in
the first layer that made it):

- as exported, the last residual add of layer `i - 1` (its result feeds layer `i`'s norm and
  residual add);
- after `fuse-add-rmsnorm` / `fuse-add-layernorm`, that add sits in layer `i`'s `ad.add_rms_norm`
  (its location is the norm's), and what crosses are its two summands: the capture reads the
  op's `sum` result.

Capturing before the fusions is the usual order (`LLM` runs it first): the returned value is one
more user of the residual add, which each fusion keeps (an add fused into `ad.add_rms_norm`
hands its users the op's `sum`). A boundary where no single value crosses (a layer that hands the
next one two streams) is refused, naming the layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import AnyFloat, FunctionType, IntegerAttr, ModuleOp, TensorType, i64
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.utils.exceptions import PassFailedException

from ad_mlir.dialects import ad
from ad_mlir.passes.repeated_layers import NotRepeating, layout

ADD_NORMS = (ad.AddRmsNormOp, ad.AddLayerNormOp)
"""The fused ops whose `sum` result is the residual stream their summands cross into."""


@dataclass(frozen=True)
class CaptureHiddenStatesPass(ModulePass):
    """The residual stream after `layers` decoder layers, appended to the results (see the
    module docstring)."""

    name = "capture-hidden-states"

    layers: tuple[int, ...] = ()

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if not self.layers:
            return
        for fn in op.walk():
            if isinstance(fn, func.FuncOp) and fn.body.blocks:
                capture(fn, self.layers)


def capture(fn: func.FuncOp, layers: tuple[int, ...]) -> None:
    """`fn` also returns the concatenated streams after `layers` layers (module docstring)."""
    stack, candidates = stream_candidates(fn)
    values = []
    for i in layers:
        if not 0 <= i < len(candidates):
            raise PassFailedException(f"capture-hidden-states: layer {i} is out of range: the model has "
                                      f"{len(candidates) - 1} decoder layers (0 to {len(candidates) - 1})")
        if len(candidates[i]) != 1:
            where = f"{stack}.{i}" if i < len(candidates) - 1 else "the layers' end"
            raise PassFailedException(f"capture-hidden-states: {len(candidates[i])} values cross into {where} where the "
                                      f"residual stream should be one ({', '.join(_named(v) for v in candidates[i])})")
        values.append(candidates[i][0])
    returned = fn.body.block.last_op
    assert isinstance(returned, func.ReturnOp)
    stream_type = values[0].type
    assert isinstance(stream_type, TensorType)
    shape = list(stream_type.get_shape())
    shape[-1] *= len(values)
    cat = ad.CatOp.build(operands=[values], result_types=[TensorType(stream_type.element_type, shape)],
                         properties={"dim": IntegerAttr(-1, i64)})
    cat.results[0].name_hint = "hidden_states"
    Rewriter.insert_op(cat, InsertPoint.before(returned))
    returned.operands = (*returned.operands, cat.results[0])
    fn.function_type = FunctionType.from_lists(fn.function_type.inputs.data,
                                               [*fn.function_type.outputs.data, cat.results[0].type])


def stream_candidates(fn: func.FuncOp) -> tuple[str, list[list[SSAValue]]]:
    """The layer stack's name, and for i from 0 to the layer count the values that may be the
    residual stream after i layers: those crossing that boundary, of the stream's type (one
    each in a model whose layers hand on one stream)."""
    try:
        stack = layout(fn)
    except NotRepeating as e:
        raise PassFailedException(f"capture-hidden-states: the decoder layers are not found by their locations ({e})") \
            from e
    groups = [stack.prefix, *stack.layers, stack.suffix]
    index = {op: g for g, ops in enumerate(groups) for op in ops}
    crossing = [_crossing(groups, index, g) for g in range(1, len(groups))]
    stream_types = {v.type for values in crossing for v in values if len(values) == 1}
    return stack.stack, [[v for v in values if v.type in stream_types] for values in crossing]


def _crossing(groups: list[list[Operation]], index: dict[Operation, int], g: int) -> list[SSAValue]:
    """Float tensors defined before group `g` (0: the prefix, then each layer, last the suffix)
    and read in it or later, in order of definition; an add-norm op of group `g` whose summands
    both come from before it stands for them with its sum."""
    found: dict[SSAValue, None] = {}
    for op in groups[g - 1]:
        for value in op.results:
            if not _float_tensor(value):
                continue
            for use in value.uses:
                user = _top(use.operation, index)
                if user is None or index[user] < g:
                    continue
                if isinstance(user, ADD_NORMS) and index[user] == g and _sums_from_before(user, index, g):
                    found[user.sum] = None
                else:
                    found[value] = None
    return list(found)


def _sums_from_before(op: ad.AddRmsNormOp | ad.AddLayerNormOp, index: dict[Operation, int], g: int) -> bool:
    return all(isinstance(v.owner, Operation) and index.get(v.owner, g) < g for v in (op.input, op.residual))


def _top(op: Operation, index: dict[Operation, int]) -> Operation | None:
    """The function-level op that holds `op` (itself, or the region op around it)."""
    while op not in index:
        parent = op.parent_op()
        if parent is None:
            return None
        op = parent
    return op


def _float_tensor(value: SSAValue) -> bool:
    return isinstance(value.type, TensorType) and isinstance(value.type.element_type, AnyFloat)


def _named(value: SSAValue) -> str:
    owner = value.owner
    return f"%{value.name_hint or '?'} of {owner.name}" if isinstance(owner, Operation) else f"%{value.name_hint}"
