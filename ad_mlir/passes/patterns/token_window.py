"""The forms that a cached token window (`ad.cached_token_window`) makes exact in generation: ops
that read, for each token, at most W tokens before it, from the sequence after W rows that hold no
token. A decode step sees its new tokens only; the window puts in front of them the W rows before
(the slot's state, or at a sequence's start the rows the model puts there) and the model's ops run
unchanged on W + seq rows, whose leading rows drop out as they do over the whole sequence.

- A left pad of W zero tokens (`F.pad(x, (W, 0))` of [batch, channels, seq]: ZAYA's CCA
  projection) read by stacked valid convolutions (`conv1d`, stride 1, no padding) whose spans,
  dilation x (kernel - 1) each, add up to W: each output of the last one is its token's, computed
  from the W tokens before it, all of them in the window.
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
    window's width for its result, less the span of each valid convolution it went through
    since; None for a value that is no such window (or a convolution that reached past it)."""
    owner = value.owner
    if isinstance(owner, ad.CachedTokenWindowOp):
        return owner.width()
    conv = valid_conv(owner) if isinstance(owner, Operation) else None
    lead = window_lead(conv[0]) if conv is not None else None
    return lead - conv[1] if lead is not None and lead >= conv[1] else None


def match_left_pad(op: ad.TorchOp) -> PaddedConvs | str | None:
    """The left pad of tokens `op` is, read by valid convolutions that use up its width; None
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
    span, value = 0, op.results[0]
    while span < width:
        use = value.get_unique_use()
        found = valid_conv(use.operation) if use is not None else None
        if found is None or found[0] is not value:
            return (f"its {width} padded tokens are not all read by valid convolutions of [batch, channels, seq] "
                    f"(found spans adding up to {span})")
        span, value = span + found[1], use.operation.results[0]
    if span != width:
        return f"its convolutions look back {span} tokens, not the {width} it pads"
    return PaddedConvs(op, x, width, dim)


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
