"""HF's short causal convolution, cached (LFM2: a depthwise `conv1d` padded by kernel - 1 and cut
back to the sequence, `conv_patterns.match_short_conv`).

It becomes `ad.cached_causal_conv1d` over an argument `conv_state_<i>` [max-batch, channels,
kernel - 1] in the input's dtype, marked `ad.cache = "<layer> conv_state"`: the inputs of the
kernel - 1 tokens before a step. Paged, the state stays one per sequence, in the `state_slots`
the driver adds, and the op takes `query_starts` besides, running sequence by sequence over the
flattened tokens (`ad.cached_causal_conv1d`'s docstring).
"""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.dialects.builtin import TensorType
from xdsl.ir import Operation
from xdsl.rewriter import Rewriter

from ad_mlir.dialects import ad
from ad_mlir.passes.cache.interface import CachedMixer, CacheSite, Found, find_ops, layer_of, optional
from ad_mlir.passes.patterns.conv_patterns import ShortConv, match_short_conv

ROLE = "conv_state"


def _find(fn: func.FuncOp) -> Found:
    return find_ops(fn, ad.TorchOp, match_short_conv, "conv1d")


def _cache_all(site: CacheSite, convs: list[ShortConv]) -> None:
    for i, conv in enumerate(convs):
        _cache(site, conv, i)


def _cache(site: CacheSite, conv: ShortConv, i: int) -> None:
    """The convolution and its cut -> `ad.cached_causal_conv1d` over a state argument
    [max-batch, channels, kernel - 1] in the input's dtype."""
    channels, _, kernel = conv.weight.type.get_shape()
    state_type = TensorType(conv.input.type.element_type, [site.max_batch, channels, kernel - 1])
    state = site.add_cache(state_type, f"{ROLE}_{i}", layer_of(conv.conv), ROLE)
    cached = ad.CachedCausalConv1dOp.build(
        operands=[conv.input, conv.weight, optional(conv.bias), *site.state_operands(state)],
        result_types=[conv.cut.result.type],
    )
    cached.location = conv.conv.location
    Rewriter.replace_op(conv.cut, cached)
    Rewriter.erase_op(conv.conv)


def _replaced(conv: ShortConv) -> Operation:
    return conv.conv


MIXER = CachedMixer("short convolution", _find, _cache_all, _replaced, per_sequence=True)
