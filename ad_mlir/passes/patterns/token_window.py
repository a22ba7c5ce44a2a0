"""The forms that a cached token window (`ad.cached_token_window`) makes exact in generation: ops
that read, for each token, at most W tokens before it, from the sequence after W rows that hold no
token. A decode step sees its new tokens only; the window puts in front of them the W rows before
(the slot's state, or at a sequence's start the rows the model puts there) and the model's ops run
unchanged on W + seq rows, whose leading rows drop out as they do over the whole sequence.

- A left pad of W zero tokens (`F.pad(x, (W, 0))` of [batch, channels, seq]: ZAYA's CCA
  projection) read by stacked valid convolutions (`conv1d`, stride 1, no padding) whose spans,
  dilation x (kernel - 1) each, add up to W: each output of the last one is its token's, computed
  from the W tokens before it, all of them in the window. The last reader may instead be an
  `unfold(-1, W + 1, 1)` (Inkling2's dynamic short convolution, whose taps each token computes:
  `F.pad(x, (W, 0))[..., -(seq + W):].unfold(-1, W + 1, 1)`): its window t holds token t and
  the W before it, read as a valid convolution reads them; the cut to the last seq + W rows
  first keeps every row of the pad, or of the window.
- A shift by W tokens, `cat([start, x], dim)[:-W]` along a token axis (ZAYA's delayed values, as
  `export_patches` spells HF's `cat([start, x[:, :-1]])`), whose W start rows are computed from no
  token (from weights and sizes: ZAYA's `v_proj_delayed(zeros)`; DeepSeek-V4's CSA overlap at
  compress rate 1, `cat([fill, x], 1)[:, :-1]` with a `new_zeros` or a -inf `new_full` row): the
  window's first seq rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects.builtin import DYNAMIC_INDEX, IndexType, TensorType
from xdsl.ir import BlockArgument, Operation, SSAValue

from ad_mlir.dialects import ad
from ad_mlir.passes.patterns.conv_patterns import valid_conv
from ad_mlir.semantics.op_table import attr_to_value, bound_arguments

PAD_TARGETS = ("aten.pad.default", "aten.constant_pad_nd.default")
TO_THE_END = 2**63 - 1
"""`ad.slice`'s end bound for "to the end" (torch clamps it)."""
SHAPE_ONLY_TARGETS = ("aten.new_zeros.default", "aten.new_ones.default", "aten.new_full.default")
"""Ops that read only the dtype and device of their tensor operand: no token's value."""


@dataclass(frozen=True)
class PaddedConvs:
    """`pad` puts `width` zero rows before `input`'s tokens along axis `dim`, which valid
    convolutions looking back `width` tokens in all read."""

    pad: ad.TorchOp
    input: SSAValue
    width: int
    dim: int
    cut: ad.SliceOp | None = None
    """`[..., -(seq + width):]` of the pad, which keeps all of its rows (and of the window's)."""


@dataclass(frozen=True)
class Shift:
    """`cut` of `cat` is `input` shifted by `width` tokens along `dim`, `initial` before its first."""

    cat: ad.CatOp
    cut: ad.SliceOp
    input: SSAValue
    initial: SSAValue
    width: int
    dim: int


def window_lead(value: SSAValue) -> int | None:
    """How many rows of a cached token window `value` still has before the step's tokens: the
    window's width for its result, less the span of each valid convolution or unfold it went
    through since (`window_reader`); None for a value that is no such window (or a reader that
    reached past it)."""
    owner = value.owner
    if isinstance(owner, ad.CachedTokenWindowOp):
        return owner.width()
    read = window_reader(owner) if isinstance(owner, Operation) else None
    lead = window_lead(read[0]) if read is not None else None
    return lead - read[1] if lead is not None and lead >= read[1] else None


def window_reader(op: Operation) -> tuple[SSAValue, int] | None:
    """The input of `op` and how many tokens before its own each output reads, when `op` is a
    valid convolution of [batch, channels, seq] (`valid_conv`) or an `unfold` of its tokens in
    steps of one (window t: rows t .. t + size - 1, ending at its token); else None."""
    if not isinstance(op, ad.TorchOp) or op.target.data != "aten.unfold.default":
        return valid_conv(op)
    args = bound_arguments(op.target.data, attr_to_value(op.args, op.inputs), attr_to_value(op.kwargs, op.inputs))
    x, dim, size, step = args["self"], args["dimension"], args["size"], args["step"]
    shape = x.type.get_shape()
    if len(shape) != 3 or dim % 3 != 2 or step != 1 or not isinstance(size, int) or size < 1:
        return None
    return x, size - 1


def match_left_pad(op: ad.TorchOp) -> PaddedConvs | str | None:
    """The left pad of tokens `op` is, read by valid convolutions or unfolds that use up its
    width (after a cut that keeps all its rows); None
    when `op` is no constant pad of a token axis, else why it is not one."""
    if op.target.data not in PAD_TARGETS:
        return None
    args = bound_arguments(op.target.data, attr_to_value(op.args, op.inputs), attr_to_value(op.kwargs, op.inputs))
    x, pad = args["self"], args["pad"]
    shape = x.type.get_shape()
    padded = [(len(shape) - 1 - i // 2, pad[i], pad[i + 1]) for i in range(0, len(pad), 2) if pad[i] or pad[i + 1]]
    if len(padded) != 1 or shape[padded[0][0]] != DYNAMIC_INDEX or padded[0][0] == 0:
        return None
    dim, width, after = padded[0]
    if args.get("mode", "constant") != "constant" or args.get("value") not in (None, 0, 0.0) or after != 0 \
            or width < 1:
        return f"it is not a left pad of zeros (pad {pad}, mode {args.get('mode')}, value {args.get('value')})"
    if len(shape) != 3 or dim != 2 or not _static_rows(x, dim):
        return f"it pads axis {dim} of {list(shape)}, not the tokens of [batch, channels, seq]"
    cut = _keeping_all_rows(op.results[0], width)
    span, value = 0, cut.result if cut is not None else op.results[0]
    while span < width:
        use = value.get_unique_use()
        found = window_reader(use.operation) if use is not None else None
        if found is None or found[0] is not value:
            return (f"its {width} padded tokens are not all read by valid convolutions or unfolds of [batch, channels, "
                    f"seq] (found spans adding up to {span})")
        span, value = span + found[1], use.operation.results[0]
    if span != width:
        return f"its convolutions look back {span} tokens, not the {width} it pads"
    return PaddedConvs(op, x, width, dim, cut)


def _keeping_all_rows(padded: SSAValue, width: int) -> ad.SliceOp | None:
    """The only use of `padded` when it is `padded[..., -(n + width):]` with n the size of a
    token axis: the sequence's n tokens and the `width` rows before them, all the rows there are
    (the types carry no symbols to tell which sequence n measures, as in `position_mixing`)."""
    use = padded.get_unique_use()
    cut = use.operation if use is not None else None
    if not isinstance(cut, ad.SliceOp) or cut.dim.value.data % 3 != 2 \
            or tuple(cut.static_bounds.get_values()) != (DYNAMIC_INDEX, TO_THE_END, 1):
        return None
    return cut if _minus_tokens_and(cut.bounds[0]) == width else None


def _minus_tokens_and(bound: SSAValue) -> int | None:
    """c when `bound` is -(n + c), n the size of a non-batch token axis and c a sum of constants
    (`-(seq_len + kernel - 1)`); else None."""
    neg = bound.owner
    if not isinstance(neg, ad.TorchOp) or neg.target.data != "_operator.neg" or len(neg.inputs) != 1:
        return None
    value, constant = neg.inputs[0], 0
    while isinstance(value.owner, ad.TorchOp) and value.owner.target.data in ("_operator.add", "_operator.sub"):
        args = attr_to_value(value.owner.args, value.owner.inputs)
        if len(args) != 2 or not isinstance(args[0], SSAValue) or not isinstance(args[1], int):
            return None
        constant += args[1] if value.owner.target.data == "_operator.add" else -args[1]
        value = args[0]
    size = value.owner
    if not isinstance(size, ad.SymSizeOp) or size.dim.value.data == 0 \
            or size.input.type.get_shape()[size.dim.value.data] != DYNAMIC_INDEX:
        return None
    return constant


def match_shift(op: ad.CatOp) -> Shift | str | None:
    """The shift by tokens `op` starts: `cat([start, x], dim)` along a token axis cut to its
    first seq rows by `[:-W]`; None when `op` is no such cat, else why it is not one."""
    if len(op.tensors) != 2:
        return None
    initial, x = op.tensors
    rank = len(x.type.get_shape())
    dim = (op.dim.value.data if op.dim is not None else 0) % rank
    width = initial.type.get_shape()[dim]
    if dim == 0 or x.type.get_shape()[dim] != DYNAMIC_INDEX or width in (DYNAMIC_INDEX, 0):
        return None
    use = op.result.get_unique_use()
    cut = use.operation if use is not None else None
    if not isinstance(cut, ad.SliceOp) or cut.dim.value.data % rank != dim \
            or tuple(cut.static_bounds.get_values()) != (0, -width, 1):
        return f"the {width} rows it puts before the tokens are not cut off their end ([:-{width}])"
    if not reads_no_token(initial):
        return "the rows it puts before the tokens are computed from the tokens"
    if not _static_rows(x, dim):
        return f"its rows {list(x.type.get_shape())} are not static but for the batch and token axes"
    return Shift(op, cut, x, initial, width, dim)


def _static_rows(x: SSAValue, dim: int) -> bool:
    """Each of `x`'s rows along token axis `dim` has a static shape (a window's state holds W of
    them per slot)."""
    return all(size != DYNAMIC_INDEX for i, size in enumerate(x.type.get_shape()) if i not in (0, dim))


def reads_no_token(value: SSAValue) -> bool:
    """`value` is computed from weights and sizes only: no input with a token axis reaches it
    (the dtype and device that `new_zeros` and its kin read from a tensor are no token's)."""
    seen: set[SSAValue] = set()
    stack = [value]
    while stack:
        value = stack.pop()
        if value in seen or isinstance(value.type, IndexType):
            continue
        seen.add(value)
        owner = value.owner
        if isinstance(value, BlockArgument):
            if isinstance(value.type, TensorType) and DYNAMIC_INDEX in value.type.get_shape():
                return False
        elif not (isinstance(owner, ad.TorchOp) and owner.target.data in SHAPE_ONLY_TARGETS):
            stack += owner.operands
    return True
