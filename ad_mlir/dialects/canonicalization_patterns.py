"""Canonicalization patterns of the `ad` dialect, attached to the ops through
`HasCanonicalizationPatternsTrait` (so xDSL's `canonicalize`, in ad-opt or xdsl-opt, applies
them). Each pattern removes an op whose result equals one of its operands, or shortens a chain,
and never changes a value (bit for bit, up to the sign of a zero)."""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    BFloat16Type,
    DenseArrayBase,
    Float8E4M3FNType,
    Float16Type,
    Float32Type,
    Float64Type,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    TensorType,
    UnitAttr,
    i64,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.pattern_rewriter import PatternRewriter, RewritePattern, op_type_rewrite_pattern
from xdsl.rewriter import InsertPoint

from ad_mlir.dialects import ad

INT64_MAX = 2**63 - 1

# Element types each type converts into exactly (every value, including inf/nan).
_EXACT_WIDENINGS: dict[Attribute, tuple[Attribute, ...]] = {
    Float8E4M3FNType(): (Float16Type(), BFloat16Type(), Float32Type(), Float64Type()),
    Float16Type(): (Float32Type(), Float64Type()),
    BFloat16Type(): (Float32Type(), Float64Type()),
    Float32Type(): (Float64Type(),),
    IntegerType(1): (IntegerType(8), IntegerType(32), IntegerType(64)),
    IntegerType(8): (IntegerType(32), IntegerType(64)),
    IntegerType(32): (IntegerType(64), Float64Type()),
}

NO_VALUE_TARGETS = frozenset({"aten._assert_tensor_metadata.default"})
"""Opaque ops that compute nothing (metadata checks torch.export inserts)."""


def _element(value: SSAValue) -> Attribute:
    assert isinstance(value.type, TensorType)
    return value.type.element_type


def _replace_by(rewriter: PatternRewriter, op: Operation, value: SSAValue) -> None:
    """Drop `op`, whose single result is known to equal `value` (same type)."""
    if op.results[0].type != value.type:
        return
    rewriter.replace(op, [], [value])


def _located_like(old: Operation, new: Operation) -> Operation:
    new.location = old.location
    return new


# ------------------------------------------------------------------------- casts


class RemoveIdentityCast(RewritePattern):
    """cast to the same dtype (every spelling: to.dtype, _to_copy, convert_element_type)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.CastOp, rewriter: PatternRewriter) -> None:
        _replace_by(rewriter, op, op.input)


def _int_to_float_to_other_int(source: Attribute, middle: Attribute, target: Attribute) -> bool:
    ints = (isinstance(source, IntegerType), isinstance(middle, IntegerType), isinstance(target, IntegerType))
    return ints == (True, False, True) and source != target


class FoldCastAfterExactCast(RewritePattern):
    """cast(cast(x: A -> B) -> C) with A -> B exact is cast(x -> C): both round the same
    value once. With C == A the pair disappears (f16 -> f32 -> f16)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.CastOp, rewriter: PatternRewriter) -> None:
        inner = op.input.owner
        if not isinstance(inner, ad.CastOp):
            return
        source, middle, target = _element(inner.input), _element(inner.result), _element(op.result)
        if middle not in _EXACT_WIDENINGS.get(source, ()):
            return
        if _int_to_float_to_other_int(source, middle, target):
            return  # float -> int of an out-of-range value is not int -> int wrap-around
        if inner.input.type == op.result.type:
            rewriter.replace(op, [], [inner.input])
        else:
            rewriter.replace(op, _located_like(op, ad.CastOp(inner.input, op.result.type)))


# -------------------------------------------------------------------- arithmetic


def _scalar_constant(value: SSAValue) -> int | float | None:
    if isinstance(value.owner, ad.ConstantOp) and isinstance(value.owner.value, IntegerAttr | FloatAttr):
        return value.owner.value.value.data
    return None


def _has_unit_alpha(op: ad.AlphaBinaryOp) -> bool:
    return op.alpha is None or op.alpha.value.data == 1


class RemoveAddZero(RewritePattern):
    """x + 0, x - 0 (any alpha), 0 + x (alpha 1), when the result keeps x's type."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.AddOp | ad.SubOp, rewriter: PatternRewriter) -> None:
        if _scalar_constant(op.other) == 0:
            _replace_by(rewriter, op, op.input)
        elif isinstance(op, ad.AddOp) and _scalar_constant(op.input) == 0 and _has_unit_alpha(op):
            _replace_by(rewriter, op, op.other)


class RemoveMulOne(RewritePattern):
    """x * 1 and 1 * x, when the result keeps x's type."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.MulOp, rewriter: PatternRewriter) -> None:
        if _scalar_constant(op.other) == 1:
            _replace_by(rewriter, op, op.input)
        elif _scalar_constant(op.input) == 1:
            _replace_by(rewriter, op, op.other)


class RemoveDivOne(RewritePattern):
    """x / 1 (any rounding mode), when the result keeps x's type (true division of an
    integer tensor is float and stays)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.DivOp, rewriter: PatternRewriter) -> None:
        if _scalar_constant(op.other) == 1:
            _replace_by(rewriter, op, op.input)


class RemoveDoubleNeg(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.NegOp, rewriter: PatternRewriter) -> None:
        if isinstance(op.input.owner, ad.NegOp):
            _replace_by(rewriter, op, op.input.owner.input)


# ------------------------------------------------------------------------- views


def _static_shape_known_equal(op: Operation, value: SSAValue) -> bool:
    """Same type with at most one dynamic dim: element counts match, so shapes do too."""
    return op.results[0].type == value.type and value.type.get_shape().count(DYNAMIC_INDEX) <= 1


class RemoveNoOpReshape(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.ReshapeOp, rewriter: PatternRewriter) -> None:
        if _static_shape_known_equal(op, op.input):
            _replace_by(rewriter, op, op.input)


class FoldReshapeOfReshape(RewritePattern):
    """reshape(reshape(x)) is one reshape of x."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.ReshapeOp, rewriter: PatternRewriter) -> None:
        inner = op.input.owner
        if isinstance(inner, ad.ReshapeOp):
            reshape = ad.ReshapeOp.build(
                operands=[inner.input, op.sizes],
                properties={"static_sizes": op.static_sizes},
                result_types=[op.result.type],
            )
            rewriter.replace(op, _located_like(op, reshape))


class RemoveNoOpExpand(RewritePattern):
    """expand keeping every dim: each size is -1 or the input's static size."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.ExpandOp, rewriter: PatternRewriter) -> None:
        shape = op.input.type.get_shape()
        sizes = op.static_sizes.get_values()
        if len(sizes) == len(shape) and all(s == -1 or (s == d and d != DYNAMIC_INDEX) for s, d in zip(sizes, shape, strict=True)):
            _replace_by(rewriter, op, op.input)


class RemoveIdentityPermute(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.PermuteOp, rewriter: PatternRewriter) -> None:
        rank = len(op.input.type.get_shape())
        if [ad.normalize_dim(d, rank) for d in op.dims.get_values()] == list(range(rank)):
            _replace_by(rewriter, op, op.input)


class RemoveIdentityTranspose(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.TransposeOp, rewriter: PatternRewriter) -> None:
        rank = len(op.input.type.get_shape())
        if ad.normalize_dim(op.dim0.value.data, rank) == ad.normalize_dim(op.dim1.value.data, rank):
            _replace_by(rewriter, op, op.input)


class RemoveFullSlice(RewritePattern):
    """x[..., 0:end:1, ...] with end past the dim's size (INT64_MAX, or >= a static size)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.SliceOp, rewriter: PatternRewriter) -> None:
        start, end, step = op.static_bounds.get_values()
        shape = op.input.type.get_shape()
        size = shape[ad.normalize_dim(op.dim.value.data, len(shape))]
        covers = end == INT64_MAX or (size != DYNAMIC_INDEX and end != DYNAMIC_INDEX and end >= size)
        if start == 0 and step == 1 and covers:
            _replace_by(rewriter, op, op.input)


class RemoveNoOpSqueeze(RewritePattern):
    """squeeze of dims that are not 1 (the type is unchanged)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.SqueezeOp, rewriter: PatternRewriter) -> None:
        if _static_shape_known_equal(op, op.input):
            _replace_by(rewriter, op, op.input)


class RemoveAlias(RewritePattern):
    """aten.alias: in a functional graph a value and its alias are the same value."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.AliasOp, rewriter: PatternRewriter) -> None:
        _replace_by(rewriter, op, op.input)


# --------------------------------------------------------------------- opaque ops


class RemoveNoValueTorchOp(RewritePattern):
    """Metadata assertions (`_assert_tensor_metadata`) compute nothing at inference."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.TorchOp, rewriter: PatternRewriter) -> None:
        if op.target.data in NO_VALUE_TARGETS and not op.results:
            rewriter.erase(op)


class RemoveEvalDropout(RewritePattern):
    """`aten.dropout(x, p, train=False)` is x."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.TorchOp, rewriter: PatternRewriter) -> None:
        if op.target.data != "aten.dropout.default" or len(op.results) != 1 or len(op.operands) != 1:
            return
        args = op.args.data
        train = args[2] if len(args) == 3 else op.kwargs.data.get("train")
        if isinstance(args[0], ad.OperandRefAttr) and isinstance(train, IntegerAttr) and train.value.data == 0:
            _replace_by(rewriter, op, op.operands[0])


OPERANDS_0_1 = (ad.OperandRefAttr(0), ad.OperandRefAttr(1))
"""A torch op's args when they are its two operands, in order."""


class ReshapeAsToReshape(RewritePattern):
    """`x.reshape_as(y)` / `x.view_as(y)` (torch.export keeps them; AOTAutograd writes a view) is
    `reshape(x, y's shape)`: y's sizes, at most one of them unknown here (-1, which the element
    count determines)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.TorchOp, rewriter: PatternRewriter) -> None:
        if op.target.data not in ("aten.reshape_as.default", "aten.view_as.default") or op.kwargs.data \
                or len(op.operands) != 2 or len(op.results) != 1:
            return
        shape = op.results[0].type.get_shape()
        if op.args.data != OPERANDS_0_1 or sum(d == DYNAMIC_INDEX for d in shape) > 1:
            return
        view = _view(op.operands[0], [-1 if d == DYNAMIC_INDEX else d for d in shape], [None] * len(shape), shape)
        rewriter.replace(op, _located_like(op, view))


IN_PLACE_BINARY: dict[str, type[ad.BinaryOp]] = {
    "aten.add_.Tensor": ad.AddOp, "aten.sub_.Tensor": ad.SubOp, "aten.mul_.Tensor": ad.MulOp, "aten.div_.Tensor": ad.DivOp,
}
"""In-place binary ops torch.export keeps (`x += y` on an intermediate: BigBird's and GIT's
embeddings, Gemma 3n's AltUp) and their functional ops."""

FRESH_TENSOR_OPS = (ad.ElementwiseOp, ad.LinearOp, ad.MatmulOp, ad.EmbeddingOp)
"""Ops whose result is a tensor of its own (no view of an operand): writing into it in place
changes no other value."""


class InPlaceBinaryOnFreshValue(RewritePattern):
    """`x.add_(y)` (sub_, mul_, div_) where nothing else reads x, which an op computed as a tensor
    of its own (`FRESH_TENSOR_OPS`: no view of a weight or an input, which the write would
    change), and y has x's element type (the result keeps x's type, as the functional op's
    does then), is `add(x, y)`: the value the write leaves in x, read by the op's users only. So
    the fusions see it as through torch.compile, whose functionalization makes it so."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.TorchOp, rewriter: PatternRewriter) -> None:
        functional = IN_PLACE_BINARY.get(op.target.data)
        if functional is None or op.kwargs.data or len(op.operands) != 2 or len(op.results) != 1:
            return
        x, y = op.operands
        if op.args.data != OPERANDS_0_1 or not isinstance(x.owner, FRESH_TENSOR_OPS) or not x.has_one_use() \
                or not isinstance(y.type, TensorType) or _element(y) != _element(x) or op.results[0].type != x.type:
            return
        rewriter.replace(op, _located_like(op, functional(x, y, x.type)))


# ----------------------------------------------------------------------- matmuls

TRANSPOSE_TARGETS = frozenset({"aten.numpy_T.default", "aten.t.default"})
"""Opaque transposes of a matrix (`w.T`, `w.t()`)."""


def _transposed_matrix(value: SSAValue) -> tuple[SSAValue, Operation] | None:
    """(w, the transpose) when `value` is `w` 2-D transposed: `w.T`/`w.t()` (opaque),
    `transpose(w, 0, 1)` or `permute(w, [1, 0])`."""
    op = value.owner
    if isinstance(op, ad.TorchOp) and op.target.data in TRANSPOSE_TARGETS and len(op.operands) == 1:
        w = op.operands[0]
    elif isinstance(op, ad.TransposeOp | ad.PermuteOp):
        w = op.input
    else:
        return None
    shape = w.type.get_shape() if isinstance(w.type, TensorType) else ()
    if len(shape) != 2 or value.type != TensorType(w.type.element_type, shape[::-1]):
        return None
    return w, op


class MatmulOfTransposedMatrixToLinear(RewritePattern):
    """`x @ w.T` is `linear(x, w)` (torch computes `linear` without a bias as that matmul):
    Falcon's FalconLinear, so that fuse-gemms and shard see its projections as linears. A
    transpose left unread goes (an opaque one is not known to be pure, so DCE keeps it)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.MatmulOp, rewriter: PatternRewriter) -> None:
        if (found := _transposed_matrix(op.other)) is None or len(op.input.type.get_shape()) < 2:
            return
        w, transpose = found
        linear = ad.LinearOp.build(operands=[op.input, w, []], result_types=[op.result.type])
        rewriter.replace(op, _located_like(op, linear))
        if isinstance(transpose, ad.TorchOp) and not transpose.results[0].uses:
            rewriter.erase(transpose)



def _plain_addmm(op: ad.AddmmOp) -> bool:
    """beta = alpha = 1 (as `linear` adds its bias)."""
    return all(attr is None or attr.value.data == 1 for attr in (op.beta, op.alpha))


class MmOfTransposedMatrixToLinear(RewritePattern):
    """`mm(x, w.t())` is `linear(x, w)` and `addmm(b, x, w.t())` is `linear(x, w, b)`: torch
    computes a 2-D `linear` as exactly these, and AOTAutograd (`torch.compile`) leaves linears in
    that form."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.MmOp | ad.AddmmOp, rewriter: PatternRewriter) -> None:
        other = op.mat2
        if (found := _transposed_matrix(other)) is None:
            return
        w, transpose = found
        bias: list[SSAValue] = []
        if isinstance(op, ad.AddmmOp):
            if not _plain_addmm(op) or op.input.type.get_shape() != (w.type.get_shape()[0],):
                return
            bias = [op.input]
        x = op.input if isinstance(op, ad.MmOp) else op.mat1
        linear = ad.LinearOp.build(operands=[x, w, bias], result_types=[op.result.type])
        rewriter.replace(op, _located_like(op, linear))
        if isinstance(transpose, ad.TorchOp) and not transpose.results[0].uses:
            rewriter.erase(transpose)


class LinearOfFlattenedRows(RewritePattern):
    """`linear(x.view(-1, h), w).view(b, s, ...)` is `linear(x, w).view(...)`: a linear acts on
    each row, so it commutes with merging the leading dims (torch's own N-D linear flattens them
    so). The two views then fold, as in a torch.export graph, where the projections take
    [batch, seq, h]. Rows that stay flat after the linear are left as they are."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.LinearOp, rewriter: PatternRewriter) -> None:
        flatten = op.input.owner
        if not isinstance(flatten, ad.ReshapeOp) or not isinstance(flatten.input.type, TensorType):
            return
        rows = flatten.input.type.get_shape()
        flat = op.input.type.get_shape()
        if len(rows) < 3 or len(flat) != 2 or rows[-1] != flat[1] or rows[-1] == DYNAMIC_INDEX:
            return
        unflatten = op.result.get_user_of_unique_use() if op.result.has_one_use() else None
        if not isinstance(unflatten, ad.ReshapeOp) or len(unflatten.result.type.get_shape()) < 3:
            return  # rows used flat (an MoE block's tokens) stay as the graph has them
        out = op.result.type.get_shape()[-1]
        linear = ad.LinearOp.build(operands=[flatten.input, op.weight, [op.bias] if op.bias else []],
                                   result_types=[TensorType(op.result.type.element_type, (*rows[:-1], out))])
        view = ad.ReshapeOp.build(operands=[linear.result, []],
                                  properties={"static_sizes": DenseArrayBase.from_list(i64, [-1, out])},
                                  result_types=[op.result.type])
        rewriter.replace(op, [_located_like(op, linear), view])


SDPA_BACKEND_ARGS: dict[str, tuple[str, ...]] = {
    "aten._scaled_dot_product_flash_attention_for_cpu.default": (
        "query", "key", "value", "dropout_p", "is_causal", "attn_mask", "scale"),
    "aten._scaled_dot_product_flash_attention.default": (
        "query", "key", "value", "dropout_p", "is_causal", "return_debug_mask", "scale"),
    "aten._scaled_dot_product_efficient_attention.default": (
        "query", "key", "value", "attn_mask", "compute_log_sumexp", "dropout_p", "is_causal", "scale"),
    "aten._scaled_dot_product_cudnn_attention.default": (
        "query", "key", "value", "attn_mask", "compute_log_sumexp", "dropout_p", "is_causal", "return_debug_mask",
        "scale"),
    "aten._scaled_dot_product_attention_math.default": (
        "query", "key", "value", "attn_mask", "dropout_p", "is_causal", "dropout_mask", "scale", "enable_gqa"),
}
"""The argument names, in schema order, of the SDPA backend ops that `scaled_dot_product_attention`
becomes after AOTAutograd's decompositions (keyword-only ones last, as a kwargs dict holds them)."""


class SdpaBackendToAttention(RewritePattern):
    """A backend's SDPA op (`_scaled_dot_product_flash_attention_for_cpu`, flash, efficient,
    cuDNN, math), whose extra results (log-sum-exp, debug masks, probabilities) nothing reads, is
    `ad.attention` with its mask, causal flag and scale: so the torch.compile path's graphs meet
    the attention fusions and the cache as the torch.export path's do. The value is the same
    attention, though torch may compute it through another backend. A fused backend's op takes
    key/value heads fewer than the query's as grouped-query attention (SDPA's `enable_gqa`,
    which it then is). A boolean mask, which
    torch turns into `where(mask, 0, -inf)` for the backend op, is given as the boolean mask
    again (SDPA turns it into the same), as in a torch.export graph (where the fusions read
    causal and sliding-window masks)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.TorchOp, rewriter: PatternRewriter) -> None:
        names = SDPA_BACKEND_ARGS.get(op.target.data)
        if names is None or any(r.uses for r in op.results[1:]):
            return
        args = {**dict(zip(names, op.args.data, strict=False)), **op.kwargs.data}
        operand = {n: op.operands[a.index.data] for n, a in args.items() if isinstance(a, ad.OperandRefAttr)}
        if any(n not in operand for n in ("query", "key", "value")) or set(operand) - {"query", "key", "value",
                                                                                        "attn_mask"}:
            return
        if _number(args.get("dropout_p")) not in (None, 0.0):
            return
        scale = _number(args.get("scale"))
        properties: dict[str, Attribute] = {}
        if _number(args.get("is_causal")):
            properties["is_causal"] = UnitAttr()
        if scale is not None:
            properties["scale"] = FloatAttr(scale, Float64Type())
        if _number(args.get("enable_gqa")) or _fewer_key_heads(operand["query"], operand["key"]):
            properties["enable_gqa"] = UnitAttr()  # the fused backends take grouped K/V heads as they are
        mask, fills = operand.get("attn_mask"), []
        if mask is not None and (boolean := _boolean_mask(mask)) is not None:
            mask, fills = boolean
        attention = ad.AttentionOp.build(
            operands=[operand["query"], operand["key"], operand["value"], [mask] if mask is not None else []],
            properties=properties, result_types=[op.results[0].type])
        rewriter.insert(_located_like(op, attention), InsertPoint.before(op))
        rewriter.replace_all_uses_with(op.results[0], attention.result)
        rewriter.erase(op)
        for dead in fills:  # the opaque fills DCE would keep
            if not any(r.uses for r in dead.results):
                rewriter.erase(dead)


def _fewer_key_heads(query: SSAValue, key: SSAValue) -> bool:
    """The key has fewer heads than the query (grouped-query attention, [..., heads, seq, head_dim])."""
    q, k = query.type.get_shape(), key.type.get_shape()
    return len(q) >= 3 and len(k) == len(q) and DYNAMIC_INDEX not in (q[-3], k[-3]) and k[-3] < q[-3]


def _number(attr: Attribute | None) -> float | None:
    """An IntegerAttr / FloatAttr argument's value; None for none or a missing argument."""
    return attr.value.data if isinstance(attr, IntegerAttr | FloatAttr) else None


SAFE_SOFTMAX = "aten._safe_softmax.default"
"""The softmax of SDPA's math backend: 0 (not NaN) in a row whose every input is -inf."""


class MathSdpaToAttention(RewritePattern):
    """`scaled_dot_product_attention` written out as torch's math backend computes it
    (`_scaled_dot_product_attention_math`, which AOTAutograd decomposes where no fused backend
    takes the call: Falcon's one key/value head broadcast over the query heads) is
    `ad.attention(q, k, v, mask, scale)`:
        s   = sqrt(scale)
        out = matmul(_safe_softmax(matmul(q * s, transpose(k, -2, -1) * s) + mask, -1), v)
    the mask added or absent, a boolean mask as `where(mask, 0, -inf)`; the matmuls broadcast k
    and v over the batch and heads (an expand of size-1 dims); f16/bf16 q, k, v cast to f32 and
    the output cast back. That is torch's own definition of the attention (its value through
    any backend, as for `SdpaBackendToAttention`); in a row whose every key is masked
    `_safe_softmax` gives 0 and so the output 0, as `ad.attention` (torch's SDPA and our kernels)
    gives."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.TorchOp, rewriter: PatternRewriter) -> None:
        if (found := _math_sdpa(op)) is None:
            return
        output, (query, key, value), mask, scale, chain = found
        properties: dict[str, Attribute] = {}
        default = query.type.get_shape()[-1] ** -0.5
        if abs(scale - default) > 1e-12 * default:  # s * s is the scale torch took the root of, to an ulp
            properties["scale"] = FloatAttr(scale, Float64Type())
        attention = ad.AttentionOp.build(operands=[query, key, value, [mask] if mask is not None else []],
                                         properties=properties, result_types=[output.results[0].type])
        rewriter.replace(output, _located_like(output, attention))
        for dead in chain:  # users first; the opaque ones (the softmax, the fills) DCE would keep
            if not any(r.uses for r in dead.results):
                rewriter.erase(dead)


MathSdpa = tuple[Operation, tuple[SSAValue, SSAValue, SSAValue], SSAValue | None, float, list[Operation]]
"""(the op whose result is the attention's, (q, k, v), the mask, the scale, the ops from the
weighting matmul to the mask's fills, users first)."""


def _math_sdpa(softmax: ad.TorchOp) -> MathSdpa | None:
    """The math backend's attention around `softmax` (`MathSdpaToAttention`), or None."""
    args = softmax.args.data
    if softmax.target.data != SAFE_SOFTMAX or len(softmax.operands) != 1 or softmax.kwargs.data \
            or len(args) != 2 or not softmax.results[0].has_one_use():
        return None
    probs, logits = softmax.results[0], softmax.operands[0]
    rank = len(logits.type.get_shape())
    weighted = probs.get_user_of_unique_use()
    if rank != 4 or _number(args[1]) not in (-1, rank - 1) or not isinstance(weighted, ad.MatmulOp) \
            or weighted.input != probs or not logits.has_one_use():
        return None
    scores, mask, chain = logits, None, [weighted, softmax]
    if isinstance(add := logits.owner, ad.AddOp) and _has_unit_alpha(add):
        scores, mask = add.input, add.other  # torch adds the mask to the scores
        chain.append(add)
    qk = scores.owner
    if not isinstance(qk, ad.MatmulOp) or not scores.has_one_use():
        return None
    query, root = _times_constant(_broadcast_source(qk.input))
    key_t, key_root = _times_constant(_broadcast_source(qk.other))
    transpose = key_t.owner
    if root is None or root != key_root or root <= 0 or not isinstance(transpose, ad.TransposeOp) \
            or {ad.normalize_dim(d.value.data, rank) for d in (transpose.dim0, transpose.dim1)} != {rank - 2, rank - 1}:
        return None
    found = _uncast((query, transpose.input, _broadcast_source(weighted.other)), weighted)
    if found is None:
        return None
    output, qkv = found
    if mask is not None and (boolean := _boolean_mask(mask)) is not None:
        mask, fills = boolean
        chain += fills
    return output, qkv, mask, root * root, chain


def _broadcast_source(value: SSAValue) -> SSAValue:
    """`x` when `value` is `expand(x)` over size-1 leading dims of x (a matmul's broadcast of its batch dims)."""
    expand = value.owner
    if not isinstance(expand, ad.ExpandOp):
        return value
    source, shape = expand.input.type.get_shape(), value.type.get_shape()
    if len(source) != len(shape) or source[-2:] != shape[-2:] \
            or any(a not in (b, 1) or a == DYNAMIC_INDEX for a, b in zip(source[:-2], shape[:-2], strict=True)):
        return value
    return expand.input


def _times_constant(value: SSAValue) -> tuple[SSAValue, float | None]:
    """(x, c) when `value` is `x * c` for a number c; (value, None) otherwise."""
    mul = value.owner
    if isinstance(mul, ad.MulOp) and (c := _scalar_constant(mul.other)) is not None:
        return mul.input, float(c)
    return value, None


def _uncast(qkv: tuple[SSAValue, SSAValue, SSAValue],
            weighted: ad.MatmulOp) -> tuple[Operation, tuple[SSAValue, SSAValue, SSAValue]] | None:
    """(the op computing the attention's output, q, k, v): `weighted` and `qkv` themselves, or,
    where q, k and v are all cast from one 16-bit float type to f32 and the output cast back to
    it (the math backend's f32 accumulation), the cast of the output and their uncast values."""
    casts = [x.owner for x in qkv]
    if not all(isinstance(c, ad.CastOp) for c in casts):
        return weighted, qkv
    sources = {_element(c.input) for c in casts}
    back = weighted.result.get_user_of_unique_use() if weighted.result.has_one_use() else None
    if len(sources) != 1 or not isinstance(back, ad.CastOp) or _element(back.result) not in sources \
            or not all(_element(c.result) == Float32Type() for c in casts):
        return None
    return back, tuple(c.input for c in casts)


def _boolean_mask(mask: SSAValue) -> tuple[SSAValue, list[Operation]] | None:
    """(m, the where and its fills) when `mask` is `where(m, 0, -inf)` of a boolean m (how torch
    turns a boolean attention mask into an additive one)."""
    where = mask.owner
    if isinstance(where, ad.WhereOp) and _element(where.condition) == IntegerType(1) \
            and where.condition.type.get_shape() == mask.type.get_shape() \
            and _filled_with(where.input) == 0.0 and _filled_with(where.other) == float("-inf"):
        return where.condition, [where, where.input.owner, where.other.owner]
    return None


def _filled_with(value: SSAValue) -> float | None:
    """The number a scalar constant or a `torch.scalar_tensor` holds."""
    op = value.owner
    if isinstance(op, ad.TorchOp) and op.target.data == "aten.scalar_tensor.default" and len(op.args.data) == 1:
        number = _number(op.args.data[0])
        return None if number is None else float(number)
    number = _scalar_constant(value)
    return None if number is None else float(number)


class RemoveClone(RewritePattern):
    """A clone holds its input's values (in a functional graph nothing writes either), so ops
    read the input: AOTAutograd leaves `repeat_kv`'s reshape as clone + view, which then matches
    as the GQA form the torch.export path has. A clone the function returns stays (the caller
    gets a tensor of its own)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.CloneOp, rewriter: PatternRewriter) -> None:
        if any(isinstance(use.operation, func.ReturnOp) for use in op.result.uses):
            return
        _replace_by(rewriter, op, op.input)


class RemoveEmptyCatOperands(RewritePattern):
    """Operands with no extent along the cat's dim add nothing (a partial rotary's pass-through
    part when the rotary dim is the whole head), nor does a 1-D operand of size 0 whatever the
    result's rank, which torch.cat skips (XLM's empty key/value cache `torch.empty(0)`); a cat
    of one operand is that operand."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.CatOp, rewriter: PatternRewriter) -> None:
        rank = len(op.result.type.get_shape())
        dim = (op.dim.value.data if op.dim is not None else 0) % rank
        kept = [t for t in op.tensors if not _adds_nothing(t.type.get_shape(), dim, rank)]
        if len(kept) == len(op.tensors) or not kept:
            return
        if len(kept) == 1:
            _replace_by(rewriter, op, kept[0])
            return
        cat = ad.CatOp.build(operands=[kept], properties={"dim": op.dim} if op.dim is not None else {},
                             result_types=[op.result.type])
        rewriter.replace(op, _located_like(op, cat))


def _adds_nothing(shape: tuple[int, ...], dim: int, rank: int) -> bool:
    """A cat operand of `shape` adds nothing to a result of `rank` along `dim`: no extent
    there, or torch.cat's legacy empty operand (shape (0,), skipped at any rank)."""
    return shape == (0,) if len(shape) != rank else shape[dim] == 0


class BmmOverMergedBatchToMatmul(RewritePattern):
    """`bmm(a.view(B*H, m, k), b.view(B*H, k, n)).view(B, H, m, n)` is
    `matmul(a.view(B, H, m, k), b.view(B, H, k, n))`: how torch computes a 4-D matmul, which
    AOTAutograd (torch.compile) leaves written out; the views then fold into the operands'
    own (an eager attention's scores and weighted values, as in a torch.export graph)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ad.BmmOp, rewriter: PatternRewriter) -> None:
        if not op.result.has_one_use() or not isinstance(view := op.result.get_user_of_unique_use(), ad.ReshapeOp):
            return
        sizes = list(view.static_sizes.get_values())
        shape = view.result.type.get_shape()
        if len(sizes) < 4 or -1 in sizes or shape[-2:] != op.result.type.get_shape()[-2:]:
            return
        dynamic = iter(view.sizes)
        values = [next(dynamic) if s == DYNAMIC_INDEX else None for s in sizes]
        lhs = _view(op.input, sizes[:-1] + [-1], values[:-1], (*shape[:-1], op.input.type.get_shape()[-1]))
        rhs = _view(op.mat2, sizes[:-2] + [-1, sizes[-1]], [*values[:-2], values[-1]],
                    (*shape[:-2], op.mat2.type.get_shape()[-2], shape[-1]))
        matmul = ad.MatmulOp.build(operands=[lhs.result, rhs.result], result_types=[view.result.type])
        rewriter.insert([lhs, rhs], InsertPoint.before(op))
        rewriter.replace(view, _located_like(view, matmul))
        rewriter.erase(op)


def _view(value: SSAValue, sizes: list[int], operands: list[SSAValue | None], shape: tuple[int, ...]) -> ad.ReshapeOp:
    """`value` viewed as `sizes` (its DYNAMIC_INDEX entries given by `operands`, one -1) of type `shape`."""
    return ad.ReshapeOp.build(operands=[value, [v for v in operands if v is not None]],
                              properties={"static_sizes": DenseArrayBase.from_list(i64, sizes)},
                              result_types=[TensorType(value.type.element_type, shape)])
