"""HF's short causal convolution as it exports: a depthwise `conv1d` over [batch, channels, seq]
with kernel - 1 zeros of padding on both sides, cut back to the sequence's first `seq` outputs
(LFM2's `Lfm2ShortConv.slow_forward`)."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects.builtin import DYNAMIC_INDEX
from xdsl.ir import Operation, SSAValue

from ad_mlir.dialects import ad
from ad_mlir.semantics.op_table import attr_to_value

CONV1D = "aten.conv1d.default"


@dataclass(frozen=True)
class ShortConv:
    conv: ad.TorchOp
    cut: ad.SliceOp
    """The slice back to the sequence's length: its result is the convolution's."""
    input: SSAValue
    weight: SSAValue
    bias: SSAValue | None


def match_short_conv(op: ad.TorchOp) -> ShortConv | str | None:
    """The causal convolution `op` starts, None when `op` is no `conv1d`, else why it is not one."""
    if op.target.data != CONV1D:
        return None
    x, weight, bias, stride, padding, dilation, groups = _conv1d_arguments(op)
    shape, w_shape = x.type.get_shape(), weight.type.get_shape()
    if len(shape) != 3 or len(w_shape) != 3 or DYNAMIC_INDEX in w_shape or w_shape[1] != 1:
        return "it is not a depthwise convolution of [batch, channels, seq] with a static [channels, 1, kernel] weight"
    channels, kernel = w_shape[0], w_shape[2]
    if groups != channels or shape[1] != channels or shape[2] != DYNAMIC_INDEX:
        return f"it is not depthwise over the sequence ({groups} groups, input {list(shape)}, weight {list(w_shape)})"
    if stride != [1] or dilation != [1] or padding != [kernel - 1]:
        return f"stride {stride}, dilation {dilation} and padding {padding} are not 1, 1 and kernel - 1 = {kernel - 1}"
    cut = _only_use(op)
    if not isinstance(cut, ad.SliceOp) or cut.result.type != x.type or not _keeps_the_first(cut):
        return "its output is not cut back to the sequence's first tokens"
    return ShortConv(op, cut, x, weight, bias)



def valid_conv(op: Operation) -> tuple[SSAValue, int] | None:
    """The input of `op` when it is a valid `conv1d` (stride 1, no padding) of [batch, channels,
    seq], and how many inputs before its own an output reads along the last axis, its span of
    dilation x (kernel - 1) (output t reads inputs t .. t + span: it stands at its last input,
    span rows in); else None."""
    if not isinstance(op, ad.TorchOp) or op.target.data != CONV1D:
        return None
    x, weight, _, stride, padding, dilation, _ = _conv1d_arguments(op)
    shape, w_shape = x.type.get_shape(), weight.type.get_shape()
    if len(shape) != 3 or len(w_shape) != 3 or w_shape[2] == DYNAMIC_INDEX or stride != [1] or padding != [0] \
            or len(dilation) != 1:
        return None
    return x, dilation[0] * (w_shape[2] - 1)

def _conv1d_arguments(op: ad.TorchOp) -> list:
    """`conv1d(input, weight, bias=None, stride=[1], padding=[0], dilation=[1], groups=1)`."""
    args = attr_to_value(op.args, op.inputs)
    kwargs = attr_to_value(op.kwargs, op.inputs)
    defaults = [None, None, None, [1], [0], [1], 1]
    names = ["input", "weight", "bias", "stride", "padding", "dilation", "groups"]
    values = [*args, *defaults[len(args):]]
    return [kwargs.get(name, value) for name, value in zip(names, values, strict=True)]


def _only_use(op: ad.TorchOp) -> object:
    result = op.results[0]
    use = result.get_unique_use() if len(op.results) == 1 else None
    return use.operation if use is not None else None


def _keeps_the_first(cut: ad.SliceOp) -> bool:
    """`[..., :n]` with n a token count (a dynamic size, as HF's `[..., :seqlen]` is: the types
    carry no symbols to tell which sequence it measures)."""
    start, end, step = cut.static_bounds.get_values()
    if cut.dim.value.data % 3 != 2 or start != 0 or step != 1 or end != DYNAMIC_INDEX or len(cut.bounds) != 1:
        return False
    size = cut.bounds[0].owner
    return isinstance(size, ad.SymSizeOp) and size.input.type.get_shape()[size.dim.value.data] == DYNAMIC_INDEX
