"""`match-moe`: a mixture-of-experts block -> `ad.moe`.

Anchored on the router's `aten.topk`, the pass reads three parts:

- The routing: `topk(softmax(float(logits)), k)` (HF's routers: `softmax(logits.float())` or
  `softmax(logits, dtype=float)`), then optionally `w / w.sum(-1, keepdim)` (`normalize`) and a
  cast of the weights to the input's dtype (`round_weights`); or `softmax(topk(logits, k))`,
  the same weights spelled the other way round (`normalize`).
- The experts, in one of two spellings:
  - HF's grouped form (transformers' `grouped_mm_experts_forward`, what Mixtral, Qwen2/3-MoE
    and OLMoE export to): the (token, slot) pairs sorted by expert (`sort`), per-expert offsets
    (`histc` + `cumsum`), the tokens gathered in that order, `grouped_mm` with the stacked
    gate/up weights, `chunk` + silu * up, `grouped_mm` with the stacked down weights, the
    sorted weights multiplied in, the rows put back (`index_put_` of the inverse permutation)
    and summed over the k slots of each token.
  - The per-expert loop (older HF blocks, hand-written ones): a one-hot expert mask permuted
    to [experts, k, tokens], and for each expert e `torch.where(mask[e])`, its tokens gathered,
    its own gate/up/down linears (`silu(x W1) * x W3`, then W2), the weights of its slots
    multiplied in and `index_add_` into a zero tensor. Its weights are stacked into the grouped
    layout by weight-only ops (`ad.cat` + `ad.reshape` of function arguments), which the
    exporter computes once, at compile time, as it does `fuse-gemms`' concatenations.
- Optionally a shared expert added to the result (Qwen2-MoE): `out + sigmoid(x g) * mlp(x)`
  (or `out + mlp(x)`), `mlp` a gated MLP of three linears on the same tokens. Its intermediate
  size must be a multiple of the experts' I: it becomes `shared_experts` virtual experts of
  size I (its gate/up rows and down columns cut in slices, weight-only ops again), which every
  token visits with the sigmoid gate as weight. A shared expert that does not fit stays as it
  is, outside the `ad.moe`.

Every step is checked (targets, arguments, shapes, dtypes, and that each intermediate feeds
only the next step); a block that does not fit is left byte-identical and the log says why, at
the topk's location. The matched ops that lose their last use are erased: the in-place
`div_`/`index_put_`/`index_add_` of a block write only tensors that the block alone reads.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects.builtin import (
    ArrayAttr,
    BFloat16Type,
    DenseArrayBase,
    Float16Type,
    Float32Type,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    ModuleOp,
    StringAttr,
    TensorType,
    UnitAttr,
    i64,
)
from xdsl.dialects.func import FuncOp
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint
from xdsl.utils.exceptions import VerifyException

from ad_mlir.dialects import ad
from ad_mlir.dialects.weights import weight_only_values
from ad_mlir.passes.patterns.activations import silu_of
from ad_mlir.passes.patterns.matching import other_operand, plain_binary, producer, sole_user

log = logging.getLogger(__name__)

GROUPED_MM = ("transformers.grouped_mm_fallback.default", "aten._grouped_mm.default")
DIVISIONS = ("aten.div_.Tensor", "aten.div.Tensor")
NARROW_FLOATS = (BFloat16Type(), Float16Type())
ASSERT_TARGETS = ("_operator.ge", "_operator.le", "aten._assert_scalar.default")
"""torch.export's range checks of the unbacked sizes `torch.where` makes (the loop form)."""


class NotMoe(Exception):
    """Why the graph around a topk is not an MoE block this pass knows."""


def _expect(condition: object, reason: str) -> None:
    if not condition:
        raise NotMoe(reason)


# --------------------------------------------------------------- reading the graph


def _arg(attr: Attribute, operands: Sequence[SSAValue]) -> object:
    """A torch_op argument as a Python value; `#ad.ref<N>` is the N-th operand."""
    if isinstance(attr, ad.OperandRefAttr):
        return operands[attr.index.data]
    if isinstance(attr, IntegerAttr) and attr.type == IntegerType(1):
        return attr.value.data != 0  # xDSL holds True as -1
    if isinstance(attr, IntegerAttr | FloatAttr):
        return attr.value.data
    if isinstance(attr, ArrayAttr):
        return [_arg(a, operands) for a in attr.data]
    if isinstance(attr, StringAttr):
        return attr.data
    return attr


def _call(op: Operation | None, targets: Sequence[str], what: str) -> tuple[ad.TorchOp, list, dict]:
    """`op` as a torch_op of one of `targets` and its (args, kwargs); else the block is not an
    MoE block, for want of `what`."""
    _expect(isinstance(op, ad.TorchOp) and op.target.data in targets, f"no {what}")
    return op, _arg(op.args, op.operands), {k: _arg(v, op.operands) for k, v in op.kwargs.data.items()}


def _call_of(value: SSAValue, targets: Sequence[str], what: str) -> tuple[ad.TorchOp, list, dict]:
    return _call(value.owner if isinstance(value.owner, Operation) else None, targets, what)


def _only_user(value: SSAValue, what: str) -> Operation:
    _expect(value.has_one_use(), f"{what} has other users")
    return value.get_user_of_unique_use()


def _of_type(op: Operation | None, op_type: type, what: str) -> Operation:
    _expect(isinstance(op, op_type), f"no {what}")
    return op


def _is_dim(dim: object, value: SSAValue, expected: int) -> bool:
    """`dim` (maybe negative) is dim `expected` (maybe negative) of `value`."""
    rank = len(value.type.get_shape())
    return isinstance(dim, int) and -rank <= dim < rank and dim % rank == expected % rank


def _shape(value: SSAValue) -> tuple[int, ...]:
    return tuple(value.type.get_shape())


def _reshaped_to(op: Operation | None, shape: tuple[int, ...]) -> bool:
    """`op` is a reshape whose static sizes are `shape` (`-1` for a dynamic size)."""
    return isinstance(op, ad.ReshapeOp) and not op.sizes and tuple(op.static_sizes.get_values()) == shape


def _transposed_experts(value: SSAValue) -> ad.TransposeOp:
    """The op of `w.transpose(-2, -1)` for a 3-D [experts, out, in] `w` (HF's `_grouped_linear`)."""
    t = _of_type(producer(value, ad.TransposeOp), ad.TransposeOp, "transposed expert weights")
    _expect(len(_shape(t.input)) == 3 and {t.dim0.value.data % 3, t.dim1.value.data % 3} == {1, 2},
            "expert weights transposed in another way than [E, out, in] -> [E, in, out]")
    return t


# --------------------------------------------------------------------- routing


@dataclass
class Routing:
    logits: SSAValue
    top_k: int
    experts: SSAValue
    """[tokens, k]: the chosen experts (topk's indices)."""
    weights: SSAValue
    """[tokens, k]: the routing weights as the experts' combine reads them."""
    normalize: bool = False
    rounded_to: Attribute | None = None
    """The dtype the weights are cast to, if they are (`round_weights`: must be the input's)."""
    ops: list[Operation] = field(default_factory=list)


def _float_logits(value: SSAValue) -> tuple[SSAValue, list[Operation]]:
    """`logits` of `value` = `float(logits)` and the cast (or `value`, logits already in f32)."""
    cast = producer(value, ad.CastOp)
    if cast is not None and cast.input.type.element_type in NARROW_FLOATS:
        return cast.input, [cast]
    return value, []


def _last_dim_softmax(op: Operation | None) -> ad.SoftmaxOp | None:
    """`op`, a softmax in f32 over the last dim (the experts)."""
    if not isinstance(op, ad.SoftmaxOp) or op.result.type.element_type != Float32Type():
        return None
    return op if _is_dim(op.dim.value.data, op.input, -1) else None


def match_routing(topk: ad.TorchOp) -> Routing:
    _, args, kwargs = _call(topk, ("aten.topk.default",), "topk")
    _expect(len(topk.results) == 2 and not kwargs and 2 <= len(args) <= 5, "a topk with keyword arguments")
    scores, k = args[0], args[1]
    _expect(len(_shape(scores)) == 2, "router scores that are not [tokens, experts]")
    _expect(_is_dim(args[2] if len(args) > 2 else -1, scores, -1), "a topk over another dim than the experts'")
    _expect(all(a is True for a in args[3:]), "a topk of the smallest values, or unsorted")
    values, experts = topk.results
    softmax = _last_dim_softmax(scores.owner)
    if softmax is not None:  # the top k of the probabilities
        logits, cast = _float_logits(softmax.input)
        r = Routing(logits, k, experts, values, ops=[topk, softmax, *cast])
        _match_normalization(r)
    else:  # the top k of the logits, and a softmax of those: the normalized weights
        later = _last_dim_softmax(_only_user(values, "the top-k values"))
        _expect(later is not None, "no softmax of the router scores, before or after the topk")
        logits, cast = _float_logits(scores)
        r = Routing(logits, k, experts, later.result, True, ops=[topk, later, *cast])
    cast = sole_user(r.weights, ad.CastOp)
    if cast is not None and cast.result.type.element_type in NARROW_FLOATS:
        r.rounded_to, r.weights = cast.result.type.element_type, cast.result
        r.ops.append(cast)
    _expect(r.logits.type.element_type in (Float32Type(), *NARROW_FLOATS), "router logits that are not floats")
    return r


def _divides(op: Operation, numerator: SSAValue, denominator: SSAValue) -> bool:
    """`op` is `numerator / denominator` (`ad.div`, or torch's `div`/`div_` carried opaquely)."""
    if isinstance(op, ad.DivOp):
        return op.rounding_mode is None and list(op.operands) == [numerator, denominator]
    return (isinstance(op, ad.TorchOp) and op.target.data in DIVISIONS and not op.kwargs.data
            and _arg(op.args, op.operands) == [numerator, denominator])


def _match_normalization(r: Routing) -> None:
    """`w / w.sum(-1, keepdim=True)` after the top-k (in place, `div_`, as HF writes it)."""
    users = [use.operation for use in r.weights.uses]
    total = next((u for u in users if isinstance(u, ad.SumOp)), None)
    if total is None:
        return
    _expect(total.reduced_dims() == (1,) and total.keepdim is not None and total.dtype is None,
            "top-k weights summed otherwise than over each token's k")
    div = _only_user(total.result, "the sum of the top-k weights")
    _expect(len(users) == 2 and _divides(div, r.weights, total.result), "top-k weights not divided by their sum")
    r.ops += [total, div]
    r.weights, r.normalize = div.results[0], True


# --------------------------------------------------------------------- experts


@dataclass
class Experts:
    """What the experts part of a block reads and the value it computes."""

    input: SSAValue
    result: SSAValue
    """The block's value (the weighted sum over each token's experts) that `ad.moe` replaces."""
    gate_up: SSAValue | list[SSAValue]
    """Stacked [E, 2I, H], or per expert its gate and up weights [I, H] (g0, u0, g1, u1, ...)."""
    down: SSAValue | list[SSAValue]
    """Stacked [E, H, I], or per expert [H, I]."""
    ops: list[Operation] = field(default_factory=list)


def _gated(value: SSAValue) -> tuple[SSAValue, SSAValue, list[Operation]]:
    """(gate, up, ops) of `silu(gate) * up` (or `ad.silu_and_mul`)."""
    if isinstance(op := value.owner, ad.SiluAndMulOp):
        return op.gate, op.up, [op]
    mul = _of_type(producer(value, ad.MulOp), ad.MulOp, "silu(gate) * up")
    for gate_silu in mul.operands:
        silu = silu_of(gate_silu)
        if silu is not None:
            return silu.input, other_operand(mul, gate_silu), [mul, *silu.ops]
    raise NotMoe("experts whose activation is not silu(gate) * up")


def match_grouped(r: Routing) -> Experts:
    """HF's grouped form, from the routing to the sum over each token's k slots."""
    flat_ids = _of_type(_only_user(r.experts, "the top-k experts"), ad.ReshapeOp, "flattened expert ids")
    _expect(_reshaped_to(flat_ids, (-1,)), "expert ids flattened otherwise")
    sort, args, kwargs = _call(_only_user(flat_ids.result, "the flat expert ids"), ("aten.sort.default",), "sort")
    _expect(args == [flat_ids.result] and not kwargs and len(sort.results) == 2, "a sort with arguments")
    sorted_ids, perm = sort.results
    offsets, offset_ops = _match_offsets(sorted_ids, r)
    flat_w = _of_type(_only_user(r.weights, "the routing weights"), ad.ReshapeOp, "flattened routing weights")
    _expect(_reshaped_to(flat_w, (-1,)), "routing weights flattened otherwise")
    w_sorted, args, _ = _call(_only_user(flat_w.result, "the flat weights"), ("aten.index.Tensor",), "weights sorted")
    _expect(args == [flat_w.result, [perm]], "weights gathered otherwise than by the sort's permutation")
    unsqueeze = _of_type(_only_user(w_sorted.results[0], "the sorted weights"), ad.UnsqueezeOp, "weights column")
    _expect(_is_dim(unsqueeze.dim.value.data, unsqueeze.result, -1), "weights unsqueezed otherwise")
    weighted = _of_type(_only_user(unsqueeze.result, "the weights column"), ad.MulOp, "weighted expert outputs")
    down_mm, down_args, kwargs = _call_of(other_operand(weighted, unsqueeze.result), GROUPED_MM, "down grouped_mm")
    _expect(len(down_args) == 3 and not kwargs and down_args[2] is offsets, "a down grouped_mm on other offsets")
    gate, up, act_ops = _gated(down_args[0])
    chunk, chunk_args, _ = _call_of(gate, HALVES, "gate/up chunk")
    _expect(list(chunk.results) == [gate, up] and _in_halves(chunk, chunk_args) and _is_dim(chunk_args[2], gate, -1),
            "gate/up split otherwise than in two halves of the last dim")
    up_mm, up_args, kwargs = _call_of(chunk_args[0], GROUPED_MM, "gate/up grouped_mm")
    _expect(len(up_args) == 3 and not kwargs and up_args[2] is offsets, "a gate/up grouped_mm on other offsets")
    gather, gather_args, _ = _call_of(up_args[0], ("aten.index.Tensor",), "tokens gathered by expert")
    _expect(len(gather_args[1]) == 1, "tokens gathered by more than one index")
    divide, div_args, _ = _call_of(gather_args[1][0], ("aten.floor_divide.default",), "token of each slot")
    _expect(div_args == [perm, r.top_k], "tokens gathered otherwise than by permutation // k")
    result, restore_ops = _match_restore(weighted, perm, r.top_k)
    gate_up, down = _transposed_experts(up_args[1]), _transposed_experts(down_args[1])
    ops = [*restore_ops, weighted, down_mm, down, *act_ops, chunk, up_mm, gate_up, gather, divide, unsqueeze,
           w_sorted, flat_w, *offset_ops, sort, flat_ids]
    return Experts(gather_args[0], result, gate_up.input, down.input, ops)


HALVES = ("aten.chunk.default", "aten.split.Tensor")
"""`chunk(x, 2, -1)`, as HF writes the gate/up split, and `split(x, half, -1)`, what AOTAutograd
(torch.compile) makes of it."""


def _in_halves(op: ad.TorchOp, args: list) -> bool:
    """The call cuts its input in two equal halves (chunk into 2, or split by half the size)."""
    if op.target.data == "aten.chunk.default":
        return args[1] == 2
    return len(op.results) == 2 and isinstance(args[1], int) and 2 * args[1] == _shape(args[0])[args[2]]


def _match_offsets(sorted_ids: SSAValue, r: Routing) -> tuple[SSAValue, list[Operation]]:
    """`cumsum(histc(float(sorted ids), E, 0, E - 1), 0, dtype=int32)`: the offsets of the
    experts' groups of (token, slot) pairs; E = the router's experts."""
    experts = _shape(r.logits)[1]
    cast = _of_type(_only_user(sorted_ids, "the sorted expert ids"), ad.CastOp, "expert ids cast for histc")
    histc, args, kwargs = _call(_only_user(cast.result, "the cast ids"), ("aten.histc.default",), "histc")
    _expect(args == [cast.result, experts, 0, experts - 1] and not kwargs, "a histc of other bins than the experts'")
    cumsum, args, kwargs = _call(_only_user(histc.results[0], "the histogram"), ("aten.cumsum.default",), "cumsum")
    _expect(len(args) == 2 and _is_dim(args[1], histc.results[0], 0), "a cumsum with arguments")
    return cumsum.results[0], [cumsum, histc, cast]


def _match_restore(weighted: ad.MulOp, perm: SSAValue, top_k: int) -> tuple[SSAValue, list[Operation]]:
    """The rows put back in (token, slot) order (`out[inverse permutation]`) and summed over
    each token's k slots (then cast to the input's dtype when they were weighted in f32)."""
    restored, args, _ = _call(_only_user(weighted.result, "the weighted outputs"), ("aten.index.Tensor",),
                              "rows restored to token order")
    _expect(len(args[1]) == 1, "rows restored by more than one index")
    # index_put_ in a torch.export graph, index_put (functional) after AOTAutograd
    inverse, inv_args, kwargs = _call_of(args[1][0], ("aten.index_put_.default", "aten.index_put.default"),
                                         "inverse permutation")
    _expect(len(inv_args) == 3 and not kwargs and inv_args[1] == [perm], "rows restored otherwise than by perm^-1")
    empty, empty_args, _ = _call_of(inv_args[0], ("aten.empty_like.default",), "inverse permutation buffer")
    arange = _of_type(inv_args[2].owner, ad.ArangeOp, "inverse permutation values")
    _expect(empty_args == [perm] and _constant(arange.start) == 0 and _constant(arange.step) == 1,
            "inverse permutation of another tensor or other values")
    _expect(inverse.results[0].has_one_use() and empty.results[0].has_one_use(), "inverse permutation read elsewhere")
    view = _of_type(_only_user(restored.results[0], "the restored rows"), ad.ReshapeOp, "rows by token and slot")
    hidden = _shape(weighted.result)[1]
    _expect(_shape(view.result)[1:] == (top_k, hidden), "restored rows not viewed as [tokens, k, hidden]")
    total = _of_type(_only_user(view.result, "the rows by slot"), ad.SumOp, "sum over the k slots")
    _expect(total.reduced_dims() == (1,) and total.keepdim is None and total.dtype is None,
            "a sum over other dims than the slots")
    bounds = [v.owner for v in arange.operands if isinstance(v.owner, Operation)]
    result, ops = total.result, [total, view, restored, inverse, empty, arange, *bounds]
    cast = sole_user(result, ad.CastOp)
    if cast is not None and result.type.element_type == Float32Type():  # weighted in f32 (Mixtral's weights)
        result, ops = cast.result, [cast, *ops]
    return result, ops


def _constant(value: SSAValue) -> object:
    op = producer(value, ad.ConstantOp)
    return op.value.value.data if op is not None else None


# ----------------------------------------------------------- the per-expert loop


@dataclass
class _ExpertStep:
    """One expert's part of the loop form: index_add_(acc, 0, tokens, y)."""

    expert: int
    add: ad.TorchOp
    ops: list[Operation]
    gate: SSAValue
    up: SSAValue
    down: SSAValue
    input: SSAValue


def match_loop(r: Routing) -> Experts:
    """The per-expert loop, from the one-hot mask to the last `index_add_`."""
    experts = _shape(r.logits)[1]
    one_hot, args, _ = _call(_only_user(r.experts, "the top-k experts"), ("aten.one_hot.default",), "one_hot mask")
    _expect(args == [r.experts, experts], "a one-hot mask of another size than the experts'")
    permute = _of_type(_only_user(one_hot.results[0], "the mask"), ad.PermuteOp, "mask as [experts, k, tokens]")
    _expect(list(permute.dims.get_values()) == [2, 1, 0], "a mask permuted otherwise than to [experts, k, tokens]")
    steps = sorted((_match_step(select, permute, r) for select in [u.operation for u in permute.result.uses]),
                   key=lambda s: s.expert)
    _expect([s.expert for s in steps] == list(range(experts)), "a loop that does not visit every expert once")
    x = steps[0].input
    _expect(all(s.input is x for s in steps), "experts reading different tokens")
    last = _chain_of_adds(steps, x)
    ops = [op for s in reversed(steps) for op in s.ops] + [permute, one_hot]
    return Experts(x, last.results[0], [w for s in steps for w in (s.gate, s.up)], [s.down for s in steps], ops)


def _match_step(select_op: Operation, permute: ad.PermuteOp, r: Routing) -> _ExpertStep:
    select, args, _ = _call(select_op, ("aten.select.int",), "an expert's row of the mask")
    _expect(args[:2] == [permute.result, 0] and isinstance(args[2], int), "the mask read otherwise than by expert")
    expert = args[2]
    where, _, _ = _call(_only_user(select.results[0], "an expert's mask"), ("aten.where.default",), "torch.where")
    _expect(len(where.results) == 2, "a where with other results than (slot, token)")
    slot, tokens = where.results
    users = [use.operation for use in tokens.uses]
    gathers = {len(u.operands): u for u in users if isinstance(u, ad.TorchOp) and u.target.data == "aten.index.Tensor"}
    adds = [u for u in users if isinstance(u, ad.TorchOp) and u.target.data == "aten.index_add_.default"]
    _expect(len(users) == 3 and set(gathers) == {2, 3} and len(adds) == 1, "an expert's tokens read otherwise")
    x_gather, w_gather = gathers[2], gathers[3]
    x, x_index = _arg(x_gather.args, x_gather.operands)
    _expect(x_index == [tokens], "an expert's tokens gathered otherwise")
    _expect(_arg(w_gather.args, w_gather.operands)[1] == [tokens, slot], "slot weights gathered otherwise")
    unsqueeze = _of_type(producer(w_gather.operands[0], ad.UnsqueezeOp), ad.UnsqueezeOp, "weights column")
    _expect(unsqueeze.input is r.weights and _is_dim(unsqueeze.dim.value.data, unsqueeze.result, -1),
            "slot weights that are not the routing weights")
    add, add_args, kwargs = _call(adds[0], ("aten.index_add_.default",), "index_add_")
    _expect(len(add_args) == 4 and add_args[1] == 0 and add_args[2] is tokens and not kwargs,
            "an index_add_ otherwise than of the expert's rows")
    weighted, cast_ops = _uncast(add_args[3])
    mul = _of_type(producer(weighted, ad.MulOp), ad.MulOp, "weighted expert output")
    mlp = other_operand(mul, w_gather.results[0])
    _expect(mlp is not None, "an expert output weighted otherwise")
    gate, up, down, mlp_ops = _gated_mlp(mlp, x_gather.results[0])
    ops = [add, *cast_ops, mul, w_gather, unsqueeze, *mlp_ops, x_gather, *_range_checks(where), where, select]
    return _ExpertStep(expert, add, ops, gate, up, down, x)


def _range_checks(where: ad.TorchOp) -> list[Operation]:
    """torch.export's asserts on the sizes of `where`'s results (u >= 0, u <= max): they read
    only those sizes, so they go with the loop."""
    checks: list[Operation] = []
    for result in where.results:
        for size in [u.operation for u in result.uses if isinstance(u.operation, ad.SymSizeOp)]:
            for compare in [u.operation for u in size.result.uses]:
                _call(compare, ASSERT_TARGETS[:2], "a range check of an expert's token count")
                for check in [u.operation for u in compare.results[0].uses]:
                    _call(check, ASSERT_TARGETS[2:], "a range assertion")
                    checks.append(check)
                checks.append(compare)
            checks.append(size)
    return checks


def _uncast(value: SSAValue) -> tuple[SSAValue, list[Operation]]:
    cast = producer(value, ad.CastOp)
    return (cast.input, [cast]) if cast is not None and value.has_one_use() else (value, [])


def _gated_mlp(value: SSAValue, x: SSAValue) -> tuple[SSAValue, SSAValue, SSAValue, list[Operation]]:
    """(gate, up, down) weights of `linear(silu(linear(x, gate)) * linear(x, up), down)`."""
    down = _of_type(producer(value, ad.LinearOp), ad.LinearOp, "an expert's down projection")
    gate_value, up_value, act_ops = _gated(down.input)
    gate, up = producer(gate_value, ad.LinearOp), producer(up_value, ad.LinearOp)
    _expect(gate is not None and up is not None and gate.input is x and up.input is x,
            "an expert's gate and up projections that are not linears of its tokens")
    _expect(all(op.bias is None for op in (gate, up, down)), "expert linears with a bias")
    return gate.weight, up.weight, down.weight, [down, *act_ops, gate, up]


def _chain_of_adds(steps: list[_ExpertStep], x: SSAValue) -> ad.TorchOp:
    """The last of the steps' `index_add_`s, which must chain from a zero tensor like x."""
    adds = {s.add for s in steps}
    targets = [s.add.operands[0] for s in steps]
    firsts = [t for t in targets if t.owner not in adds]
    _expect(len(firsts) == 1, "expert outputs added into more than one tensor")
    zeros, args, _ = _call_of(firsts[0], ("aten.zeros_like.default",), "a zero tensor the experts add into")
    _expect(args == [x], "experts added into a tensor unlike their tokens")
    for t in targets:
        _expect(t.has_one_use(), "an accumulator read between experts")
    lasts = [s.add for s in steps if not any(u.operation in adds for u in s.add.results[0].uses)]
    _expect(len(lasts) == 1, "expert outputs not added in one chain")
    steps[0].ops.append(zeros)
    return lasts[0]


# ---------------------------------------------------------------- shared expert


@dataclass
class SharedExpert:
    gate: SSAValue
    """[Is, H] gate projection weight."""
    up: SSAValue
    down: SSAValue
    """[H, Is]."""
    gate_logits: SSAValue | None
    """[tokens, 1]: the logits of its sigmoid gate."""
    result: SSAValue
    """`out + shared`: the value the `ad.moe` with the shared expert replaces."""
    ops: list[Operation] = field(default_factory=list)


def match_shared(experts: Experts, weights: set[SSAValue]) -> SharedExpert | None:
    """The shared expert added to the experts' result, or None when there is none (the reason
    is logged when there is one that cannot join)."""
    add = sole_user(experts.result, ad.AddOp)
    if add is None or not plain_binary(add, ad.AddOp):
        return None
    term = other_operand(add, experts.result)
    gate_logits, gate_ops = None, []
    if isinstance(mul := term.owner, ad.MulOp):
        for value in mul.operands:
            sigmoid = producer(value, ad.SigmoidOp)
            gate = producer(sigmoid.input, ad.LinearOp) if sigmoid is not None else None
            if gate is not None and gate.input is experts.input and gate.bias is None and _shape(gate.result)[1:] == (1,):
                gate_logits, gate_ops, term = gate.result, [mul, sigmoid], other_operand(mul, value)
                break
    try:
        gate_w, up_w, down_w, mlp_ops = _gated_mlp(term, experts.input)
    except NotMoe:
        return None
    inter = _expert_sizes(experts)[1]
    if gate_w.type.get_shape()[0] % inter or not {gate_w, up_w, down_w} <= weights:
        log.info("match-moe: the shared expert at %s stays outside ad.moe: its intermediate size %d is not a "
                 "multiple of the experts' %d, or its weights are not weights", add.location,
                 gate_w.type.get_shape()[0], inter)
        return None
    return SharedExpert(gate_w, up_w, down_w, gate_logits, add.result, [add, *gate_ops, *mlp_ops])


def _expert_sizes(experts: Experts) -> tuple[int, int]:
    """(hidden, intermediate) of the experts."""
    down = experts.down if isinstance(experts.down, SSAValue) else experts.down[0]
    shape = down.type.get_shape()
    return shape[-2], shape[-1]


# ------------------------------------------------------------------- the rewrite


def _tensor(element: Attribute, shape: Sequence[int]) -> TensorType:
    return TensorType(element, list(shape))


def _cat(values: Sequence[SSAValue], dim: int) -> ad.CatOp:
    shapes = [v.type.get_shape() for v in values]
    shape = list(shapes[0])
    shape[dim] = sum(s[dim] for s in shapes)
    return ad.CatOp.build(operands=[list(values)], properties={"dim": IntegerAttr(dim, i64)},
                          result_types=[_tensor(values[0].type.element_type, shape)])


def _reshape(value: SSAValue, shape: Sequence[int]) -> ad.ReshapeOp:
    return ad.ReshapeOp.build(operands=[value, []], properties={"static_sizes": DenseArrayBase.from_list(i64, shape)},
                              result_types=[_tensor(value.type.element_type, shape)])


def _permute(value: SSAValue, dims: Sequence[int]) -> ad.PermuteOp:
    shape = [value.type.get_shape()[d] for d in dims]
    return ad.PermuteOp.build(operands=[value], properties={"dims": DenseArrayBase.from_list(i64, dims)},
                              result_types=[_tensor(value.type.element_type, shape)])


class _Stacking:
    """Weight-only ops that stack expert weights into `ad.moe`'s layout (run once, at compile time)."""

    def __init__(self) -> None:
        self.ops: list[Operation] = []

    def add(self, op: Operation) -> SSAValue:
        self.ops.append(op)
        return op.results[0]

    def experts(self, parts: SSAValue | list[SSAValue], rows: int) -> SSAValue:
        """[E, rows, cols] from a stacked value, or from E * (rows / parts) row blocks of [., cols]."""
        if isinstance(parts, SSAValue):
            return parts
        cols = parts[0].type.get_shape()[1]
        flat = self.add(_cat(parts, 0))
        return self.add(_reshape(flat, [flat.type.get_shape()[0] // rows, rows, cols]))

    def with_shared(self, gate_up: SSAValue, down: SSAValue, shared: SharedExpert) -> tuple[SSAValue, SSAValue, int]:
        """The shared expert appended as S virtual experts of the routed experts' size I."""
        _, two_inter, hidden = gate_up.type.get_shape()
        inter = two_inter // 2
        slices = shared.gate.type.get_shape()[0] // inter
        gate = self.add(_reshape(shared.gate, [slices, inter, hidden]))
        up = self.add(_reshape(shared.up, [slices, inter, hidden]))
        shared_gate_up = self.add(_cat([gate, up], 1))
        shared_down = self.add(_permute(self.add(_reshape(shared.down, [hidden, slices, inter])), [1, 0, 2]))
        return self.add(_cat([gate_up, shared_gate_up], 0)), self.add(_cat([down, shared_down], 0)), slices


def build_moe(r: Routing, experts: Experts, shared: SharedExpert | None) -> list[Operation]:
    """The stacking ops and the `ad.moe` (last) for a matched block."""
    stacking = _Stacking()
    hidden, inter = _expert_sizes(experts)
    gate_up = stacking.experts(experts.gate_up, 2 * inter)
    down = stacking.experts(experts.down, hidden)
    properties: dict[str, Attribute] = {"top_k": IntegerAttr(r.top_k, i64)}
    gate = []
    if shared is not None:
        gate_up, down, slices = stacking.with_shared(gate_up, down, shared)
        properties["shared_experts"] = IntegerAttr(slices, i64)
        gate = [shared.gate_logits] if shared.gate_logits is not None else []
    if r.normalize:
        properties["normalize"] = UnitAttr()
    if r.rounded_to is not None:
        properties["round_weights"] = UnitAttr()
    moe = ad.MoeOp.build(operands=[experts.input, r.logits, gate_up, down, gate], properties=properties,
                         result_types=[experts.input.type])
    return [*stacking.ops, moe]


def _check_types(r: Routing, experts: Experts, weights: set[SSAValue]) -> None:
    x = experts.input
    _expect(len(_shape(x)) == 2, "tokens that are not [tokens, hidden]")
    _expect(experts.result.type == x.type, "a result of another type than the tokens'")
    _expect(r.rounded_to in (None, x.type.element_type), "routing weights rounded to another dtype than the tokens'")
    parts = [experts.gate_up, experts.down]
    values = [v for p in parts for v in ([p] if isinstance(p, SSAValue) else p)]
    _expect(all(v.type.element_type == x.type.element_type for v in values), "expert weights of another dtype")
    _expect(all(v in weights for v in values), "expert weights computed at run time (not stacked once)")


def _erase_unused(rewriter: PatternRewriter, ops: Sequence[Operation]) -> None:
    """Erase the ops of `ops` that have no use left, until none is left to erase (the asserts
    of the loop form have no results: they go with what they check)."""
    pending = list(dict.fromkeys(ops))
    while True:
        dead = [op for op in pending if op.parent is not None and all(not r.uses for r in op.results)]
        if not dead:
            return
        for op in dead:
            rewriter.erase(op)
        pending = [op for op in pending if op.parent is not None]


class MatchMoe(RewritePattern):
    def __init__(self, weights: set[SSAValue]) -> None:
        self.weights = weights
        self.matches = 0

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.TorchOp, rewriter: PatternRewriter) -> None:
        if op.target.data != "aten.topk.default":
            return
        try:
            r = match_routing(op)
            form = match_loop if _is_loop(r) else match_grouped
            experts = form(r)
            _check_types(r, experts, self.weights)
        except NotMoe as e:
            log.info("match-moe: the topk at %s is not an MoE block this pass knows: %s", op.location, e)
            return
        shared = match_shared(experts, self.weights)
        result = shared.result if shared is not None else experts.result
        new_ops = build_moe(r, experts, shared)
        moe = new_ops[-1]
        try:
            moe.verify()
        except VerifyException as e:  # e.g. router logits of another token count
            log.info("match-moe: the MoE block at %s stays as it is: %s", op.location, e)
            for new in reversed(new_ops):
                new.erase()
            return
        moe.location = result.owner.location
        rewriter.insert(new_ops, InsertPoint.before(result.owner))
        rewriter.replace_all_uses_with(result, moe.results[0])
        _erase_unused(rewriter, [*(shared.ops if shared else []), *experts.ops, *r.ops])
        self.matches += 1


def _is_loop(r: Routing) -> bool:
    """The per-expert loop form starts with a one-hot mask of the chosen experts."""
    user = sole_user(r.experts, ad.TorchOp)
    return user is not None and user.target.data == "aten.one_hot.default"


@dataclass(frozen=True)
class MatchMoePass(ModulePass):
    """MoE blocks -> `ad.moe` (see the module docstring)."""

    name = "match-moe"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        matches = 0
        for fn in op.ops:
            if isinstance(fn, FuncOp) and fn.body.blocks:
                pattern = MatchMoe(weight_only_values(fn))
                PatternRewriteWalker(pattern, apply_recursively=False).rewrite_region(fn.body)
                matches += pattern.matches
        log.info("match-moe: %d MoE blocks matched", matches)
