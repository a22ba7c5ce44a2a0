"""`shard`: tensor parallelism (Megatron style) for the decoder layers of a graph.

A *block* is a set of opening linears whose results reach exactly one closing linear, and
nothing else, through ops that keep a split of heads or features: elementwise ops, views,
RoPE's slices, attention. Q/K/V -> o_proj and gate/up -> down_proj are blocks. Detection
follows, for each linear whose weight is a function argument (in program order), the uses of
its result up to the linears whose input they reach; a linear that reaches one linear only
opens that linear's block.

Each block is rewritten for `world-size` ranks, or left whole with the reason in the log:
- opening linears column-wise: their weight (and bias) arguments get `ad.shard_dim = 0` and
  the local type `[out / W, in]`;
- every value between them keeps one dim split: its type gets the local size there, and the
  reshape/expand sizes that name that dim (head counts) are divided by W;
- the closing linear row-wise: its weight gets `ad.shard_dim = 1`, `[out, in / W]`; its result
  is each rank's partial sum, so `ad.all_reduce "sum"` + `ad.wait_tensor` follow it, or follow
  the add where two blocks' partial sums meet (parallel attention + MLP: one all_reduce per
  layer); a closing bias is added once, after the reduction (Phi's two biased closers: both
  after the one reduction of their sum).
The IR stays the same for every rank: the exporter gives rank r its slice of each sharded
weight (`fx_import.rank_weight`).

Quantized linears (`ad.linear_fp8_block`, `ad.linear_fp8`, `ad.linear_int4`, `ad.linear_nvfp4`)
open and close blocks too: each scale tensor that follows the weight's out-features N (column-wise)
or in-features K (row-wise) is cut with it (`_cuts`), the others stay whole. A rank's share must
hold whole scale blocks or groups (`check_shares`), and an act-order int4 linear (`g_idx`) is not
cut row-wise; else the block stays whole, logged. A closing FP8 linear's per-token activation
scale is computed on the rank's share of the row (`_quantize_dynamic`).

Everything outside blocks is replicated: the embedding and lm_head (whose result is the
graph's output) are held whole by every rank, as are the norms. A world size must divide the
query and the key/value head counts: replicating K/V heads when there are fewer K/V heads than
ranks is not supported, and is refused with an error naming the layer and the numbers.

An `ad.moe` (`match-moe` must run before `shard`: on HF's grouped form the experts stay
replicated) is cut like an MLP block, as an "mlp" layer: every expert's gate and up rows
column-wise over its intermediate size I, its down row-wise, and one all_reduce after the op
(its combine is linear in the experts' outputs; the routing is computed alike on every rank).
The stacked gate_up [E, 2I, H] holds two chunks, gate and up, cut alike (`ad.shard_chunks`); the
weight-only ops `match-moe` stacks the experts with (per-expert linears, a shared expert cut in
virtual experts) keep the split, their sizes made local.

Hints override detection: `ad.shard = "colwise" | "rowwise" | "replicated"` on an `ad.linear`
(in its attribute dictionary). A replicated linear takes no part in a block; a colwise one opens
the block of the linear it reaches; a rowwise one closes only the block of linears that reach
it. A hinted block that cannot be sharded is an error, not a log line.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    ArrayAttr,
    DenseArrayBase,
    DictionaryAttr,
    IntegerAttr,
    ModuleOp,
    NameLoc,
    StringAttr,
    TensorType,
    i64,
)
from xdsl.ir import Block, BlockArgument, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.utils.exceptions import PassFailedException

from ad_mlir.dialects import ad
from ad_mlir.dialects.weights import weight_arguments

log = logging.getLogger(__name__)

SHARD_HINT_ATTR = "ad.shard"
"""On an `ad.linear`: "colwise", "rowwise" or "replicated", overriding detection."""
HINTS = ("colwise", "rowwise", "replicated")
LAYER_KINDS = ("attention", "mlp")
WORLD_GROUP = "0"
"""The name torch gives the default process group (`dist.group.WORLD.group_name`)."""

Gemm = ad.LINEAR_OPS
"""The linears a block opens and closes with: float, and the quantized ones of checkpoints."""


class ShardConfigError(PassFailedException, ValueError):
    """A world size, option or hint the graph cannot be sharded with."""


class _NotShardable(Exception):
    """Why a block stays whole (logged)."""


# ------------------------------------------------------------------------- detection


@dataclass
class _Block:
    openers: list[Gemm]
    closer: Gemm
    ops: set[Operation] = field(default_factory=set)

    @property
    def hinted(self) -> bool:
        return any(_hint(op) is not None for op in (*self.openers, self.closer))

    @property
    def layer(self) -> str:
        """The HF module holding the closing linear (`model.layers.0.self_attn`)."""
        path = _op_name(self.closer)
        return path.rsplit(".", 1)[0] if "." in path else path

    @property
    def kind(self) -> str:
        attends = (ad.AttentionOp, ad.SoftmaxOp, ad.MatmulOp, ad.BmmOp)
        return "attention" if any(isinstance(op, attends) for op in self.ops) else "mlp"

    def describe(self) -> str:
        opening = ", ".join(_short_name(op) for op in self.openers)
        return f"{opening} column-wise, {_short_name(self.closer)} row-wise"


def _op_name(op: Operation) -> str:
    if isinstance(op.location, NameLoc):
        return op.location.desc.data
    return f"%{op.results[0].name_hint}" if op.results and op.results[0].name_hint else op.name


def _short_name(op: Operation) -> str:
    return _op_name(op).rsplit(".", 1)[-1]


def _hint(op: Gemm) -> str | None:
    hint = op.attributes.get(SHARD_HINT_ATTR)
    if hint is None:
        return None
    if not isinstance(hint, StringAttr) or hint.data not in HINTS:
        raise ShardConfigError(f"{_op_name(op)}: {SHARD_HINT_ATTR} must be one of {', '.join(HINTS)}, got {hint}")
    return hint.data


def _shardable(op: Gemm, weights: set[SSAValue]) -> bool:
    """The tensors a split would cut (weight, bias, block scales, ...) are unsharded weight
    arguments that only it reads."""
    return all(
        v in weights and v.has_one_use() and ad.SHARD_DIM_ATTR not in _arg_attrs(v).data
        for v, _ in (*_cuts(op, row=False), *_cuts(op, row=True))
    )


# ------------------------------------------------------- how each kind of linear is cut


def _bias_cut(op: Gemm) -> list[tuple[SSAValue, int]]:
    return [(op.bias, 0)] if op.bias is not None else []


def _per_channel(op: ad.LinearFp8Op) -> bool:
    return tuple(op.weight_scale.type.get_shape()) == (op.weight.type.get_shape()[0], 1)


def _nvfp4_global_rows(op: ad.LinearNvfp4Op) -> bool:
    """Its global scale is one value per output row ([N], `fuse-gemms`' folded parts)."""
    n = op.weight.type.get_shape()[0]
    return n > 1 and tuple(op.weight_scale_2.type.get_shape()) == (n,)


def _int4_groups(op: ad.LinearInt4Op) -> int:
    return op.scales.type.get_shape()[0]


def _cuts(op: Gemm, row: bool) -> list[tuple[SSAValue, int]]:
    """The weight arguments of `op` a split cuts, each with its dim: column-wise (`row` False)
    along the out-features N, with the bias; row-wise along the in-features K (a closing bias
    is added once, after the reduction). Scales that follow N or K are cut with the weight;
    those along the other dim, and one-value scales, stay whole."""
    if isinstance(op, ad.LinearInt4Op):  # [K / 8, N] words, [G, N / 8] zero points, [G, N] scales
        tensors = (op.qweight, op.qzeros, op.scales)
        if row:  # one group (GPTQ's group_size -1) is every rank's: its zero points and scales stay whole
            return [(v, 0) for v in (tensors if _int4_groups(op) > 1 else tensors[:1])]
        return [*((v, 1) for v in tensors), *_bias_cut(op)]
    scales: tuple[SSAValue, ...] = ()
    if isinstance(op, ad.LinearFp8BlockOp):
        scales = (op.weight_scale_inv,)  # [N / bn, K / bk]: cut along N and K alike
    elif isinstance(op, ad.LinearNvfp4Op):
        scales = (op.weight_scale,)  # [N, K / 16]
        if not row and _nvfp4_global_rows(op):
            scales += (op.weight_scale_2,)
    elif isinstance(op, ad.LinearFp8Op) and not row and _per_channel(op):
        scales = (op.weight_scale,)  # [N, 1]
    dim = 1 if row else 0
    return [(op.weight, dim), *((v, dim) for v in scales), *([] if row else _bias_cut(op))]


def _whole_shares(op: Gemm, what: str, size: int, world: int, unit: int, units: str) -> None:
    if size % (world * unit):
        raise _NotShardable(f"{_op_name(op)} ({op.name}): its {what} {size} do not split in {world} shares of "
                            f"whole {units} of {unit}")


def check_shares(op: Gemm, row: bool, world: int) -> None:
    """A rank's share of a quantized weight must hold whole blocks/groups of its scales, so that
    each rank's scales are a slice of the whole ones; else `_NotShardable` says why."""
    what = "in-features" if row else "out-features"
    if isinstance(op, ad.LinearFp8BlockOp):
        n, k = op.weight.type.get_shape()
        bn, bk = op.blocks()
        _whole_shares(op, what, k if row else n, world, bk if row else bn, "scale blocks")
    elif isinstance(op, ad.LinearFp8Op):
        if not _per_channel(op) and op.weight_scale.type.get_shape() not in ((), (1,)):
            raise _NotShardable(f"{_op_name(op)} (ad.linear_fp8): a weight scale of shape "
                                f"{_fmt(op.weight_scale.type)} is neither per channel nor per tensor")
    elif isinstance(op, ad.LinearNvfp4Op) and row:
        _whole_shares(op, what, op.in_features(), world, ad.NVFP4_GROUP, "scale groups")
    elif isinstance(op, ad.LinearInt4Op):
        n, k = op.features()
        if not row:
            _whole_shares(op, what, n, world, 8, "zero-point words")
            return
        if op.g_idx is not None:
            raise _NotShardable(f"{_op_name(op)} (ad.linear_int4): its act-order g_idx gives a rank's rows groups "
                                "from the whole of K, whose scales a row split would not keep")
        if _int4_groups(op) == 1:
            _whole_shares(op, what, k, world, 8, "words")
        else:
            _whole_shares(op, what, k, world, math.lcm(op.group_size.value.data, 8), "groups (and words)")


def _reads_as_input(user: Gemm, operand: SSAValue) -> bool:
    """`operand` is the activation of `user`: its input, or an FP8 input's scale."""
    return operand is user.input or (isinstance(user, ad.LinearFp8Op) and operand is user.input_scale)


def _forward_region(linear: Gemm) -> tuple[set[Operation], list[Gemm]]:
    """The ops reading `linear`'s result, directly or through others, up to the linears whose
    input it reaches (returned too, in the order found)."""
    region: set[Operation] = set()
    ends: dict[Gemm, None] = {}
    work = [linear.result]
    while work:
        for use in work.pop().uses:
            user = use.operation
            if isinstance(user, Gemm):
                if not _reads_as_input(user, user.operands[use.index]):
                    raise _NotShardable(f"its result is the weight or bias of {_op_name(user)}")
                ends[user] = None
                if len(ends) > 1:
                    raise _NotShardable(f"its result reaches {len(ends)} linears ({', '.join(map(_op_name, ends))})")
            elif isinstance(user, func.ReturnOp):
                raise _NotShardable("its result reaches the function's results")
            elif user.parent_block() is not linear.parent_block():
                raise _NotShardable(f"{user.name} in a nested region reads it")
            elif user not in region:
                region.add(user)
                if not isinstance(user, ad.SymSizeOp):  # a size is the same on every rank
                    work.extend(user.results)
    return region, list(ends)


def find_blocks(entry: Block, weights: set[SSAValue]) -> list[_Block]:
    """The tensor-parallel blocks of `entry`, by closing linear, in program order."""
    linears = [op for op in entry.ops if isinstance(op, Gemm) and _shardable(op, weights)]
    candidates = set(linears)
    blocks: dict[Gemm, _Block] = {}
    for linear in linears:
        hint = _hint(linear)
        if linear in blocks or hint in ("rowwise", "replicated"):
            continue
        try:
            region, ends = _forward_region(linear)
            if not ends:
                raise _NotShardable("its result reaches no linear")
            (closer,) = ends
            if closer not in candidates or _hint(closer) in ("colwise", "replicated"):
                raise _NotShardable(f"the linear it reaches, {_op_name(closer)}, cannot be row-wise")
        except _NotShardable as e:
            if hint == "colwise":
                raise ShardConfigError(f"{_op_name(linear)} is marked colwise, but {e}") from None
            log.info("shard: %s stays replicated: %s", _op_name(linear), e)
            continue
        block = blocks.setdefault(closer, _Block([], closer))
        block.openers.append(linear)
        block.ops |= region
    for linear in linears:
        if _hint(linear) == "rowwise" and linear not in blocks:
            raise ShardConfigError(f"{_op_name(linear)} is marked rowwise, but no column-wise linear reaches it")
    return list(blocks.values())


# ----------------------------------------------------------------------- propagation


@dataclass
class _Plan:
    """How a block is split: the split dim of each value, and the new sizes of views."""

    block: _Block
    world: int
    split: dict[SSAValue, int] = field(default_factory=dict)
    sizes: dict[Operation, list[int]] = field(default_factory=dict)
    types: dict[SSAValue, TensorType] = field(default_factory=dict)

    def local_type(self, value: SSAValue) -> TensorType:
        shape = list(value.type.get_shape())
        d = self.split[value]
        if shape[d] == DYNAMIC_INDEX:
            raise _NotShardable(f"%{value.name_hint} is split along a dynamic dim")
        if shape[d] % self.world:
            raise ShardConfigError(
                f"{self.block.layer}: %{value.name_hint} ({_fmt(value.type)}) has {shape[d]} along dim {d}, "
                f"which {self.world} ranks cannot split"
            )
        shape[d] //= self.world
        return TensorType(value.type.element_type, shape)

    def divide_size(self, op: Operation, sizes: list[int], dim: int) -> None:
        """The view's target size at `dim` (the split dim) becomes the local one."""
        if sizes[dim] == DYNAMIC_INDEX:
            raise _NotShardable(f"{op.name} %{op.results[0].name_hint} sizes the split dim with a value")
        if sizes[dim] > 0:
            sizes[dim] //= self.world
        self.sizes[op] = sizes


def _fmt(t: TensorType) -> str:
    return "x".join("?" if d == DYNAMIC_INDEX else str(d) for d in t.get_shape())


def _rank(v: SSAValue) -> int:
    return len(v.type.get_shape())


def _tensors(op: Operation) -> list[SSAValue]:
    return [v for v in op.operands if isinstance(v.type, TensorType)]


def _aligned(plan: _Plan, op: Operation, operands: Iterable[SSAValue], out_rank: int) -> int:
    """The result's split dim for operands that broadcast into a rank-`out_rank` result: every
    split operand agrees on it, and the others have size 1 (or no dim) there."""
    operands = list(operands)
    dims = {plan.split[v] + out_rank - _rank(v) for v in operands if v in plan.split}
    if len(dims) != 1:
        raise _NotShardable(f"{op.name} combines values split along dims {sorted(dims)}")
    (d,) = dims
    for v in operands:
        local = d - (out_rank - _rank(v))
        if v not in plan.split and local >= 0 and v.type.get_shape()[local] != 1:
            raise _NotShardable(f"{op.name} reads %{v.name_hint} whole along the split dim")
    return d


def _broadcast(plan: _Plan, op: Operation) -> list[int]:
    """Elementwise ops, casts, copies: the split follows broadcasting."""
    return [_aligned(plan, op, _tensors(op), _rank(op.results[0]))] * len(op.results)


def _reshape(plan: _Plan, op: ad.ReshapeOp) -> list[int]:
    """Features split into heads ([s, H*D] -> [s, H, D]) or merged back: the split moves to the
    outermost dim of its group (the heads), which must hold a multiple of W. An explicit size-1
    dim before the group is an inserted one; an inferred (-1) one is a single head."""
    src, dst = op.input.type.get_shape(), op.result.type.get_shape()
    sizes = list(op.static_sizes.get_values())
    d = plan.split[op.input]
    before = _prefix(src[:d])
    j = next((j for j in range(len(dst)) if _prefix(dst[:j]) == before and (dst[j] != 1 or sizes[j] == -1)), None)
    if j is None or DYNAMIC_INDEX in (src[d], dst[j]) or (src[d] % dst[j] and dst[j] % src[d]):
        raise _NotShardable(f"ad.reshape %{op.result.name_hint} moves the split dim {d} of {_fmt(op.input.type)}")
    if dst[j] % plan.world:
        raise ShardConfigError(
            f"{plan.block.layer}: ad.reshape {_fmt(op.input.type)} -> {_fmt(op.result.type)} splits {src[d]} features "
            f"into {dst[j]} heads, which {plan.world} ranks cannot split: the world size must divide the query and the "
            "key/value head counts (replicating K/V heads is not supported)"
        )
    plan.divide_size(op, sizes, j)
    return [j]


def _prefix(shape: Iterable[int]) -> tuple[int, int]:
    """(product of the static sizes, count of dynamic ones) of the dims before a split."""
    static, dynamic = 1, 0
    for s in shape:
        if s == DYNAMIC_INDEX:
            dynamic += 1
        else:
            static *= s
    return static, dynamic


def _expand(plan: _Plan, op: ad.ExpandOp) -> list[int]:
    d = plan.split[op.input] + _rank(op.result) - _rank(op.input)
    if op.input.type.get_shape()[plan.split[op.input]] != op.result.type.get_shape()[d]:
        raise _NotShardable(f"ad.expand %{op.result.name_hint} broadcasts the split dim")
    plan.divide_size(op, list(op.static_sizes.get_values()), d)
    return [d]


def _transpose(plan: _Plan, op: ad.TransposeOp) -> list[int]:
    rank = _rank(op.input)
    a, b = (ad.normalize_dim(x.value.data, rank) for x in (op.dim0, op.dim1))
    d = plan.split[op.input]
    return [b if d == a else a if d == b else d]


def _permute(plan: _Plan, op: ad.PermuteOp) -> list[int]:
    dims = [ad.normalize_dim(x, _rank(op.input)) for x in op.dims.get_values()]
    return [dims.index(plan.split[op.input])]


def _unsqueeze(plan: _Plan, op: ad.UnsqueezeOp) -> list[int]:
    u = ad.normalize_dim(op.dim.value.data, _rank(op.input) + 1)
    d = plan.split[op.input]
    return [d + 1 if u <= d else d]


def _squeeze(plan: _Plan, op: ad.SqueezeOp) -> list[int]:
    shape = op.input.type.get_shape()
    gone = {ad.normalize_dim(x, len(shape)) for x in op.dim.get_values()}
    d = plan.split[op.input]
    return [d - sum(1 for g in gone if g < d and shape[g] == 1)]


def _not_along_split(dims: Iterable[int], split: int, op: Operation) -> None:
    if split in dims:
        raise _NotShardable(f"{op.name} %{op.results[0].name_hint} works along the split dim")


def _slice(plan: _Plan, op: ad.SliceOp) -> list[int]:
    d = plan.split[op.input]
    _not_along_split([ad.normalize_dim(op.dim.value.data, _rank(op.input))], d, op)
    return [d]


def _along_dim(op: ad.CatOp | ad.SplitOp, rank: int) -> int:
    return ad.normalize_dim(op.dim.value.data if op.dim is not None else 0, rank)


def _cat(plan: _Plan, op: ad.CatOp) -> list[int]:
    if any(v not in plan.split for v in op.tensors):
        raise _NotShardable(f"ad.cat %{op.result.name_hint} joins split and whole values")
    d = _aligned(plan, op, op.tensors, _rank(op.result))
    _not_along_split([_along_dim(op, _rank(op.result))], d, op)
    return [d]


def _split(plan: _Plan, op: ad.SplitOp) -> list[int]:
    d = plan.split[op.input]
    _not_along_split([_along_dim(op, _rank(op.input))], d, op)
    return [d] * len(op.outputs)


def _reduction(plan: _Plan, op: ad.ReductionOp) -> list[int]:
    d = plan.split[op.input]
    reduced = op.reduced_dims()
    _not_along_split(reduced, d, op)
    return [d if op.keepdim is not None else d - sum(1 for r in reduced if r < d)]


def _softmax(plan: _Plan, op: ad.SoftmaxOp) -> list[int]:
    d = plan.split[op.input]
    _not_along_split([ad.normalize_dim(op.dim.value.data, _rank(op.input))], d, op)
    return [d]


def _attention(plan: _Plan, op: ad.AttentionOp) -> list[int]:
    """Heads (dim -3) split alike in query, key and value; the mask broadcasts over heads."""
    heads = _rank(op.query) - 3
    if any(plan.split.get(v) != heads for v in (op.query, op.key, op.value)):
        raise _NotShardable("attention's query, key and value are not all split by heads")
    return [_aligned(plan, op, _tensors(op), _rank(op.result))]


def _matmul(plan: _Plan, op: ad.MatmulOp | ad.BmmOp) -> list[int]:
    """Batched matmul (eager attention's scores and output): both split along a batch dim."""
    rank = _rank(op.result)
    operands = _tensors(op)
    if any(v not in plan.split for v in operands):
        raise _NotShardable(f"{op.name} %{op.result.name_hint} multiplies a split value by a whole one")
    d = _aligned(plan, op, operands, rank)
    if d >= rank - 2:
        raise _NotShardable(f"{op.name} %{op.result.name_hint} contracts or spans the split dim")
    return [d]


def _quantize_dynamic(plan: _Plan, op: ad.QuantizeFp8DynamicOp) -> list[int | None]:
    """Per token, the values keep the split; the scale is one per token ([..., 1]). Split along
    the features (a closing FP8 linear's input), each rank's scale is the amax of its own share
    of the row (as vLLM's row-parallel FP8 linears quantize): not the whole row's, so the
    quantized values differ from one unsharded process's by FP8 rounding. Per tensor, the scale
    would be each rank's amax of another tensor: refused."""
    d = plan.split[op.input]
    if op.per_token is None:
        raise _NotShardable(f"ad.quantize_fp8_dynamic %{op.result.name_hint} scales the whole tensor, of which a "
                            "rank holds a share")
    return [d, None] if d == _rank(op.input) - 1 else [d, d]


def _sym_size(plan: _Plan, op: ad.SymSizeOp) -> list[int | None]:
    _not_along_split([ad.normalize_dim(op.dim.value.data, _rank(op.input))], plan.split[op.input], op)
    return [None]


_RULES: dict[type[Operation], Callable[[_Plan, Operation], list[int | None]]] = {
    ad.CastOp: _broadcast,
    ad.AliasOp: _broadcast,
    ad.CloneOp: _broadcast,
    ad.ReshapeOp: _reshape,
    ad.ExpandOp: _expand,
    ad.TransposeOp: _transpose,
    ad.PermuteOp: _permute,
    ad.UnsqueezeOp: _unsqueeze,
    ad.SqueezeOp: _squeeze,
    ad.SliceOp: _slice,
    ad.CatOp: _cat,
    ad.SplitOp: _split,
    ad.SoftmaxOp: _softmax,
    ad.AttentionOp: _attention,
    ad.MatmulOp: _matmul,
    ad.BmmOp: _matmul,
    ad.SymSizeOp: _sym_size,
    ad.QuantizeFp8Op: _broadcast,
    ad.DequantizeFp8Op: _broadcast,
    ad.QuantizeFp8DynamicOp: _quantize_dynamic,
}
"""How each op moves the split of its operands to its results (by exact type; `_rule` also takes
every elementwise op and reduction)."""


def _rule(op: Operation) -> Callable[[_Plan, Operation], list[int | None]]:
    if isinstance(op, ad.ElementwiseOp):
        return _broadcast
    if isinstance(op, ad.ReductionOp):
        return _reduction
    rule = _RULES.get(type(op))
    if rule is None:
        what = f"{op.name} {op.target.data}" if isinstance(op, ad.TorchOp) else op.name
        raise _NotShardable(f"{what} is not known to keep a split (canonicalize drops no-op ones)")
    return rule


def plan_block(block: _Block, world: int, order: dict[Operation, int]) -> _Plan:
    """Propagate the opening linears' split (their last dim) to the closing linear's input."""
    plan = _Plan(block, world)
    for opener in block.openers:
        check_shares(opener, False, world)
        plan.split[opener.result] = _rank(opener.result) - 1
    check_shares(block.closer, True, world)
    for op in sorted(block.ops, key=order.__getitem__):
        for result, dim in zip(op.results, _rule(op)(plan, op), strict=True):
            if dim is not None:
                plan.split[result] = dim
    last = _rank(block.closer.input) - 1
    if plan.split.get(block.closer.input) != last:
        raise _NotShardable(f"{_op_name(block.closer)} does not read a value split along its features")
    plan.types = {v: plan.local_type(v) for v in plan.split}
    return plan


# ---------------------------------------------------------------------------- rewrite


def _arg_attrs(arg: SSAValue) -> DictionaryAttr:
    assert isinstance(arg, BlockArgument)
    fn = arg.block.parent_op()
    return fn.arg_attrs.data[arg.index]


def _shard_argument(fn: func.FuncOp, arg: SSAValue, dim: int, world: int) -> None:
    shape = list(arg.type.get_shape())
    shape[dim] //= world
    attrs = list(fn.arg_attrs.data)
    attrs[arg.index] = DictionaryAttr({**attrs[arg.index].data, ad.SHARD_DIM_ATTR: IntegerAttr(dim, i64)})
    fn.arg_attrs = ArrayAttr(attrs)
    Rewriter.replace_value_with_new_type(arg, TensorType(arg.type.element_type, shape))


def apply_plan(fn: func.FuncOp, plan: _Plan) -> None:
    """Rewrite the block's types, view sizes and weight arguments; the closing linear's result
    is then a partial sum (reduced by `insert_reductions`)."""
    world = plan.world
    for value, local in plan.types.items():
        Rewriter.replace_value_with_new_type(value, local)
    for op, sizes in plan.sizes.items():
        op.properties["static_sizes"] = DenseArrayBase.from_list(i64, sizes)
    for linear, row in (*((opener, False) for opener in plan.block.openers), (plan.block.closer, True)):
        for arg, dim in _cuts(linear, row):
            _shard_argument(fn, arg, dim, world)


def _without_bias(closer: Gemm) -> tuple[Gemm, SSAValue | None]:
    """A closing bias must be added once, after the reduction, not on every rank."""
    if closer.bias is None:
        return closer, None
    bias = closer.bias
    kept = (getattr(closer, name) for name, _ in closer.get_irdl_definition().operands)
    operands = [[] if v is None or v is bias else v for v in kept]
    properties = {k: v for k, v in closer.properties.items() if k != "operandSegmentSizes"}
    new = type(closer).build(operands=operands, result_types=[closer.result.type], properties=properties,
                             attributes=dict(closer.attributes))
    new.location = closer.location
    Rewriter.replace_op(closer, new)
    return new, bias


def insert_reductions(closers: list[Gemm], group: str) -> int:
    """One all_reduce (+ wait) for each partial sum, after the add where two blocks' partial
    sums meet; returns how many."""
    partials: dict[SSAValue, tuple[Operation, tuple[SSAValue, ...]]] = {}
    for closer in closers:
        linear, bias = _without_bias(closer)
        partials[linear.result] = (linear, (bias,) if bias is not None else ())
    pending = list(partials)
    while pending:
        if (merged := _merge_partials(pending.pop(0), partials)) is not None:
            pending.append(merged)
    for point, (owner, biases) in partials.items():
        _reduce_after(point, owner, biases, group)
    return len(partials)


def _merge_partials(
    value: SSAValue, partials: dict[SSAValue, tuple[Operation, tuple[SSAValue, ...]]]
) -> SSAValue | None:
    """`value + other` where both are partial sums read only there: the sum becomes the partial
    sum in their place (reduced once, then both closing biases added), and is returned."""
    def lone_partial(v: SSAValue) -> bool:
        return v in partials and v.has_one_use()

    if not lone_partial(value):
        return None
    add = value.get_user_of_unique_use()
    if not isinstance(add, ad.AddOp) or add.alpha is not None or add.result.type != value.type:
        return None
    other = add.other if add.input == value else add.input
    if other == value or not lone_partial(other):
        return None
    biases = partials.pop(value)[1] + partials.pop(other)[1]
    partials[add.result] = (add, biases)
    return add.result


def _reduce_after(value: SSAValue, owner: Operation, biases: tuple[SSAValue, ...], group: str) -> None:
    reduce = ad.AllReduceOp.build(
        operands=[value], result_types=[value.type],
        properties={"reduce_op": StringAttr("sum"), "group_name": StringAttr(group)},
    )
    wait = ad.WaitTensorOp.build(operands=[reduce.result], result_types=[value.type])
    reduce.result.name_hint, wait.result.name_hint = "all_reduce", "reduced"
    new_ops: list[Operation] = [reduce, wait]
    for bias in biases:
        new_ops.append(ad.AddOp.build(operands=[new_ops[-1].results[0], bias], result_types=[value.type]))
    for new in new_ops:
        new.location = owner.location
    value.replace_uses_with_if(new_ops[-1].results[0], lambda use: use.operation is not reduce)
    Rewriter.insert_op(new_ops, InsertPoint.after(owner))


# ------------------------------------------------------------------------ MoE experts


@dataclass
class _ExpertSplit:
    """An `ad.moe` cut like the dense MLP, each expert's intermediate size I over the ranks: the
    stacked gate_up [E, 2I, H] along dim 1 (gate and up rows alike), down [E, H, I] along dim 2.
    The weight arguments behind them, and the weight-only ops stacking those into the op's layout
    (`match-moe`'s cat/reshape/permute), keep the split on the dim that holds the I's."""

    moe: ad.MoeOp
    args: dict[SSAValue, tuple[int, int]] = field(default_factory=dict)
    """Weight argument -> (its split dim, how many chunks of I's that dim holds)."""
    values: dict[SSAValue, int] = field(default_factory=dict)
    """Stacking op result -> its split dim."""

    @property
    def layer(self) -> str:
        return _op_name(self.moe)


def _product(dims: Iterable[int]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _reshape_source(op: ad.ReshapeOp, dim: int, chunks: int) -> tuple[int, int]:
    """The input dim holding the result's split `dim` (merged with the dims just before it, each
    merged dim multiplying the chunks) and its chunk count."""
    src, dst = op.input.type.get_shape(), op.result.type.get_shape()
    for start in range(dim, -1, -1):
        for d in range(len(src)):
            if (_product(src[:d]) == _product(dst[:start]) and src[d] == _product(dst[start:dim + 1])
                    and tuple(src[d + 1:]) == tuple(dst[dim + 1:])):
                return d, chunks * _product(dst[start:dim])
    raise _NotShardable(f"ad.reshape {_fmt(op.input.type)} -> {_fmt(op.result.type)} moves the experts' I")


def _trace_experts(split: _ExpertSplit, value: SSAValue, dim: int, chunks: int, weights: set[SSAValue]) -> None:
    """Follow the split of `value` (along `dim`, of `chunks` chunks) back to weight arguments."""
    if value.type.get_shape()[dim] % chunks:
        raise _NotShardable(f"%{value.name_hint} does not hold {chunks} chunks along dim {dim}")
    if isinstance(value, BlockArgument):
        if value not in weights or not value.has_one_use() or ad.SHARD_DIM_ATTR in _arg_attrs(value).data:
            raise _NotShardable(f"%{value.name_hint} is not a weight argument that only the experts read")
        split.args[value] = (dim, chunks)
        return
    op = value.owner
    if not value.has_one_use():
        raise _NotShardable(f"%{value.name_hint} is read elsewhere")
    split.values[value] = dim
    if isinstance(op, ad.ReshapeOp) and not op.sizes:
        _trace_experts(split, op.input, *_reshape_source(op, dim, chunks), weights)
    elif isinstance(op, ad.PermuteOp):
        _trace_experts(split, op.input, ad.normalize_dim(op.dims.get_values()[dim], _rank(op.input)), chunks, weights)
    elif isinstance(op, ad.CatOp) and _along_dim(op, _rank(value)) != dim:
        for piece in op.tensors:
            _trace_experts(split, piece, dim, chunks, weights)
    elif isinstance(op, ad.CatOp) and chunks % len(op.tensors) == 0 and len({v.type for v in op.tensors}) == 1:
        for piece in op.tensors:  # whole chunks side by side (gate rows, then up rows)
            _trace_experts(split, piece, dim, chunks // len(op.tensors), weights)
    else:
        raise _NotShardable(f"{op.name} %{value.name_hint} stacks the experts in a way shard does not follow")


def plan_experts(moe: ad.MoeOp, world: int, weights: set[SSAValue]) -> _ExpertSplit:
    split = _ExpertSplit(moe)
    _trace_experts(split, moe.gate_up, 1, 2, weights)
    _trace_experts(split, moe.down, 2, 1, weights)
    inter = moe.down.type.get_shape()[2]
    if inter % world:
        raise _NotShardable(f"the experts' intermediate size {inter} does not split in {world} parts")
    return split


def apply_experts(fn: func.FuncOp, split: _ExpertSplit, world: int) -> None:
    """Local types for the stacking ops and the op's weights, their reshapes' sizes divided,
    the weight arguments marked; the op's result is then each rank's partial sum."""
    for value, dim in split.values.items():
        shape = list(value.type.get_shape())
        shape[dim] //= world
        op = value.owner
        if isinstance(op, ad.ReshapeOp):
            sizes = list(op.static_sizes.get_values())
            sizes[dim] = shape[dim]
            op.properties["static_sizes"] = DenseArrayBase.from_list(i64, sizes)
        Rewriter.replace_value_with_new_type(value, TensorType(value.type.element_type, shape))
    for arg, (dim, chunks) in split.args.items():
        _shard_argument(fn, arg, dim, world)
        if chunks > 1:
            attrs = list(fn.arg_attrs.data)
            attrs[arg.index] = DictionaryAttr({**attrs[arg.index].data, ad.SHARD_CHUNKS_ATTR: IntegerAttr(chunks, i64)})
            fn.arg_attrs = ArrayAttr(attrs)


# ------------------------------------------------------------------------------- pass


@dataclass(frozen=True)
class ShardPass(ModulePass):
    """Tensor-parallel sharding over `world-size` ranks (see the module docstring).
    `shard-layers` picks the kinds of block to shard (attention, mlp); `group` names the
    process group of the all_reduces (torch's default group is "0")."""

    name = "shard"

    world_size: int = 1
    shard_layers: tuple[str, ...] = LAYER_KINDS
    group: str = WORLD_GROUP

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.world_size < 1:
            raise ShardConfigError(f"shard: world-size must be at least 1, got {self.world_size}")
        unknown = sorted(set(self.shard_layers) - set(LAYER_KINDS))
        if unknown:
            raise ShardConfigError(f"shard: unknown shard-layers {unknown} (known: {', '.join(LAYER_KINDS)})")
        if self.world_size == 1:
            return
        for fn in [f for f in op.walk() if isinstance(f, func.FuncOp) and f.body.blocks]:
            self._shard_function(fn)

    def _shard_function(self, fn: func.FuncOp) -> None:
        entry = fn.body.block
        order = {op: i for i, op in enumerate(entry.ops)}
        blocks = find_blocks(entry, weight_arguments(fn))
        plans = [plan for block in blocks if (plan := self._plan(block, order)) is not None]
        for plan in plans:
            apply_plan(fn, plan)
            log.info("shard: %s: %s", plan.block.layer, plan.block.describe())
        reductions = insert_reductions([plan.block.closer for plan in plans], self.group)
        for split in self._expert_splits(fn):
            apply_experts(fn, split, self.world_size)
            _reduce_after(split.moe.result, split.moe, (), self.group)
            log.info("shard: %s: each expert's gate/up column-wise, down row-wise", split.layer)
            reductions += 1
        fn.update_function_type()
        log.info("shard: %d of %d blocks sharded over %d ranks, %d all_reduce", len(plans), len(blocks),
                 self.world_size, reductions)

    def _expert_splits(self, fn: func.FuncOp) -> list[_ExpertSplit]:
        """The `ad.moe` ops to cut (MoE layers are "mlp" layers), each planned before any is cut."""
        moes = [op for op in fn.body.block.ops if isinstance(op, ad.MoeOp)]
        if "mlp" not in self.shard_layers:
            return []
        weights, splits = weight_arguments(fn), []
        for moe in moes:
            try:
                splits.append(plan_experts(moe, self.world_size, weights))
            except _NotShardable as e:
                log.info("shard: the experts at %s stay replicated: %s", _op_name(moe), e)
        return splits

    def _plan(self, block: _Block, order: dict[Operation, int]) -> _Plan | None:
        if block.kind not in self.shard_layers and not block.hinted:
            log.info("shard: %s (%s) stays replicated: not in shard-layers", block.layer, block.kind)
            return None
        try:
            return plan_block(block, self.world_size, order)
        except _NotShardable as e:
            if block.hinted:
                raise ShardConfigError(f"{block.layer}: the hinted block ({block.describe()}) cannot be sharded: {e}") from None
            log.info("shard: %s stays replicated: %s", block.layer, e)
            return None
