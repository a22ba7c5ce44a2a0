"""The ops of a function that mix token positions: a result at one position reads the inputs
at other positions (a convolution or scan over the sequence, a cumulative op, a reduction or a
contraction over it, a shift by slicing or concatenation, a sequence cut into chunks, positions
counted inside the graph).

In a graph compiled for generation, a decode step sees only its new tokens: what a position
needs from earlier ones must come from a cache. `insert-cached-attention` caches attention, HF's
short causal convolution, the export patches' chunked scans and the history that padded
convolutions and shifts read (`ad.cached_token_window`), so any other op that mixes positions
would silently see a one-token sequence. A valid convolution that looks back no further than the
rows a cached token window put before the step's tokens (`token_window.window_lead`) reads only
what the window holds, and is no mixer.
Token axes are told by their type: the export for the cache makes batch and sequence dynamic,
and every axis computed from them stays dynamic (`?`), while model sizes are static.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from xdsl.dialects import func
from xdsl.dialects.builtin import DYNAMIC_INDEX, IndexType, NameLoc, TensorType
from xdsl.ir import BlockArgument, Operation, SSAValue

from ad_mlir.dialects import ad
from ad_mlir.passes.patterns.token_window import window_lead
from ad_mlir.semantics.torch_ops import SEQUENCE_MIXER_OPS

TO_THE_END = 2**63 - 1
"""`ad.slice`'s end bound for "to the end" (torch clamps it)."""

MIXING_TORCH_TARGETS = (
    "aten.conv", "aten._convolution", "aten.cumsum", "aten.cumprod", "aten.logcumsumexp", "aten.cummax",
    "aten.cummin", "aten.flip", "aten.roll", "aten.constant_pad_nd", "aten.pad", "aten.reflection_pad",
    "aten.replication_pad", "aten.diff", "aten.unfold", "aten.avg_pool", "aten.max_pool", "aten.fft_",
    "aten._fft",
)
"""Prefixes of the opaque targets that combine neighbouring elements along an axis
(convolutions, scans, shifts, pads, windows, FFTs): a mixer when an operand has a token axis."""


@dataclass(frozen=True)
class PositionMixer:
    op: Operation
    how: str
    """What the op does across positions, e.g. "aten.conv1d.default over a token axis"."""

    def describe(self) -> str:
        where = self.op.location.desc.data if isinstance(self.op.location, NameLoc) else "an unnamed module"
        return f"{where}: {self.op.name} ({self.how})"


def position_mixers(fn: func.FuncOp) -> list[PositionMixer]:
    """The ops of `fn` that mix token positions and reach its results, in program order (an op
    no result depends on, such as an unused mask that DCE keeps for its opaque ops, changes no
    token)."""
    live = _data_slice(fn.body.block.last_op.operands)
    found = []
    for op in (inner for top in fn.body.block.ops if top in live for inner in top.walk()):
        rule = _RULES.get(type(op))
        how = rule(op) if rule is not None else None
        if how is not None:
            found.append(PositionMixer(op, how))
    return found


def _data_slice(results: Iterable[SSAValue]) -> set[Operation]:
    """The ops whose values the results are computed from. Index operands (sizes, bounds, split
    sizes) carry no token's values, so ops that only size tensors are left out: an MoE block's
    tokens-per-expert count (a sum over tokens) decides how its expert groups are cut, not what
    a token's output is; the ops working on those groups are checked on their own."""
    ops: set[Operation] = set()
    stack = [v for v in results if not isinstance(v.type, IndexType)]
    while stack:
        owner = stack.pop().owner
        if isinstance(owner, Operation) and owner not in ops:
            ops.add(owner)
            stack += [v for v in owner.operands if not isinstance(v.type, IndexType)]
    return ops


def _arange(op: ad.ArangeOp) -> str | None:
    """A range as long as a token axis that becomes positions (embedding indices, or RoPE angles)
    numbers the tokens of this step only: with a cache it restarts at 0 in every decode step
    (positions must come from a `position_ids` input, or be the range added to the cache's
    starts, as `insert-cached-attention` makes them). A range that only indexes or counts rows
    (an MoE block's token bookkeeping) is no position."""
    if not _token_axes(op.result) or not _becomes_positions(op.result):
        return None
    return "counts the tokens of the step (positions not from position_ids)"


def _becomes_positions(value: SSAValue) -> bool:
    seen: set[Operation] = set()
    stack = [value]
    while stack:
        for use in stack.pop().uses:
            user = use.operation
            if (isinstance(user, ad.EmbeddingOp) and use.index == 1) or isinstance(user, ad.CosOp | ad.SinOp):
                return True
            if user not in seen and not _adds_cache_starts(user):
                seen.add(user)
                stack += list(user.results)
    return False


def _adds_cache_starts(op: Operation) -> bool:
    """An add of the function's `ad.cache_starts` argument (each row's cached tokens, possibly
    unsqueezed): what it adds to is counted from each row's real start."""
    if not isinstance(op, ad.AddOp):
        return False
    for value in op.operands:
        while isinstance(value.owner, ad.UnsqueezeOp):
            value = value.owner.input
        fn = value.owner.parent_op() if isinstance(value, BlockArgument) else None
        if isinstance(fn, func.FuncOp) and fn.arg_attrs and ad.CACHE_STARTS_ATTR in fn.arg_attrs.data[value.index].data:
            return True
    return False


def _token_axes(value: SSAValue) -> set[int]:
    if not isinstance(value.type, TensorType):
        return set()
    return {i for i, size in enumerate(value.type.get_shape()) if size == DYNAMIC_INDEX}


def _over(axes: Iterable[int], value: SSAValue, what: str) -> str | None:
    mixed = sorted(set(axes) & _token_axes(value))
    return f"{what} over token axis {mixed[0]}" if mixed else None


def _reduction(op: ad.ReductionOp) -> str | None:
    return _over(op.reduced_dims(), op.input, "reduces")


def _softmax(op: ad.SoftmaxOp) -> str | None:
    rank = len(op.input.type.get_shape())
    return _over({op.dim.value.data % rank}, op.input, "softmax")


def _contraction(lhs: SSAValue) -> str | None:
    rank = len(lhs.type.get_shape())
    return _over({rank - 1}, lhs, "contracts") if rank else None


def _cat(op: ad.CatOp) -> str | None:
    rank = len(op.result.type.get_shape())
    dim = (op.dim.value.data if op.dim is not None else 0) % rank
    how = _over({dim}, op.result, "concatenates")
    return None if how is None or _rejoins_split(op, dim) else how


def _rejoins_split(op: ad.CatOp, dim: int) -> bool:
    """The pieces of one `ad.split` along the same axis, each gone through its own ops, joined
    back in their order (an MoE block's expert groups): every row returns to where it was, and
    an op that moved rows within a piece is a mixer on its own."""
    reads = [_read_values(t) for t in op.tensors]
    return any(_rejoins(split, reads, dim) for split in _data_slice(op.tensors[:1]) if isinstance(split, ad.SplitOp))


def _rejoins(split: ad.SplitOp, reads: list[set[SSAValue]], dim: int) -> bool:
    """`split`'s pieces, in order, are what the cat's operands (reading `reads`) are made of."""
    rank = len(split.input.type.get_shape())
    if (split.dim.value.data if split.dim is not None else 0) % rank != dim or len(split.outputs) != len(reads):
        return False
    return all(piece in read and not any(other in read for other in split.outputs if other is not piece)
               for piece, read in zip(split.outputs, reads, strict=True))


def _read_values(value: SSAValue) -> set[SSAValue]:
    """`value` and every value its computation reads."""
    return {value, *(v for o in _data_slice([value]) for v in o.operands)}


def _slice(op: ad.SliceOp) -> str | None:
    """A slice that shifts or strides a token axis (`x[:, :-1]`, `x[:, 1:]`); one up to a
    dynamic end (the sequence's own length), or from minus a token count to the end (Olmo-Hybrid's
    `x[..., -seq_len:]` after its convolution), keeps positions where they are."""
    rank = len(op.input.type.get_shape())
    if op.dim.value.data % rank not in _token_axes(op.input):
        return None
    start, end, step = op.static_bounds.get_values()
    if start == 0 and step == 1 and end in (TO_THE_END, DYNAMIC_INDEX):
        return None
    if start == DYNAMIC_INDEX and step == 1 and end == TO_THE_END and _minus_a_token_count(op.bounds[0]):
        return None
    return f"slices token axis {op.dim.value.data % rank} by [{_bound(start)}:{_bound(end)}:{_bound(step)}]"


def _minus_a_token_count(bound: SSAValue) -> bool:
    """`-n` with n the size of a token axis (the types carry no symbols to tell which sequence it
    measures, as for a dynamic end)."""
    neg = bound.owner
    if not isinstance(neg, ad.TorchOp) or neg.target.data != "_operator.neg" or len(neg.inputs) != 1:
        return False
    size = neg.inputs[0].owner
    return isinstance(size, ad.SymSizeOp) and size.input.type.get_shape()[size.dim.value.data] == DYNAMIC_INDEX


def _bound(value: int) -> str:
    return "?" if value == DYNAMIC_INDEX else "end" if value == TO_THE_END else str(value)


def _reshape(op: ad.ReshapeOp) -> str | None:
    """A reshape that splits a static extent off a token axis, just inside it, with the rest of
    the axis inferred (-1 where the result has a token axis) or divided out: the sequence cut
    into chunks ([b, s, h] -> [b, s / c, c, h]), so later ops on the extent mix the positions of
    a chunk. Not a split given as counts
    of tokens (an MoE block's flat [tokens * top_k] list back to [tokens, top_k]; Qwen3-Next's
    flat [b * s * heads, v] back to [b, s, -1], the -1 a static extent), nor a static
    extent outside the token axis (Llama-4's [experts * tokens, h] -> [experts, tokens, h])."""
    if not _token_axes(op.input) or _static_numel(op.input) % _static_numel(op.result) == 0:
        return None
    shape = op.result.type.get_shape()
    inferred = any(size == -1 and shape[i] == DYNAMIC_INDEX for i, size in enumerate(op.static_sizes.get_values()))
    if not inferred and not any(_divided(size) for size in op.sizes):
        return None
    carried = Counter(size for size in op.input.type.get_shape() if size != DYNAMIC_INDEX)
    for i, size in enumerate(shape):
        if size == DYNAMIC_INDEX:
            continue
        if carried[size]:  # a size the input had: not split off
            carried[size] -= 1
        elif i > 0 and shape[i - 1] == DYNAMIC_INDEX:
            return "cuts a token axis into chunks"
    return None


def _divided(size: SSAValue) -> bool:
    owner = size.owner
    return isinstance(owner, ad.TorchOp) and owner.target.data.rsplit(".", 1)[-1] in ("floordiv", "truediv", "div")


def _static_numel(value: SSAValue) -> int:
    n = 1
    for size in value.type.get_shape():
        if size != DYNAMIC_INDEX:
            n *= size
    return n


def _torch_op(op: ad.TorchOp) -> str | None:
    target = op.target.data
    if target in SEQUENCE_MIXER_OPS:
        return f"{target}: a scan over the whole sequence whose state is not cached"
    if not target.startswith(MIXING_TORCH_TARGETS) or (op.results and window_lead(op.results[0]) is not None):
        return None
    if any(_token_axes(v) for v in op.inputs):
        return f"{target} on a tensor with a token axis"
    return None


_RULES: dict[type[Operation], Callable[..., str | None]] = {
    ad.SumOp: _reduction,
    ad.MeanOp: _reduction,
    ad.AmaxOp: _reduction,
    ad.AminOp: _reduction,
    ad.SoftmaxOp: _softmax,
    ad.MatmulOp: lambda op: _contraction(op.input),
    ad.MmOp: lambda op: _contraction(op.input),
    ad.BmmOp: lambda op: _contraction(op.input),
    ad.AddmmOp: lambda op: _contraction(op.mat1),
    ad.LinearOp: lambda op: _contraction(op.input),
    ad.CatOp: _cat,
    ad.SliceOp: _slice,
    ad.ReshapeOp: _reshape,
    ad.TorchOp: _torch_op,
    ad.ArangeOp: _arange,
}
