"""An attention's mask, evaluated for its cached op (attention's and MLA's): the cached op masks
causally with the cached offset, so the causal mask HF builds is dropped, with every op of its
computation that nothing else uses.

The mask's computation (it may read only the user inputs' shapes and position ids) is evaluated
at max-seq-len new tokens: a causal mask is dropped, a sliding-window one becomes the op's
`window`, anything else is an error naming the layer. An additive (float) mask, as the eager
form adds, must hold 0 where it attends and a very negative number (at most half the dtype's
lowest, or -inf) where it masks. A boolean `masked_fill` mask (MPT's, XLM's, CPM-Ant's) is True
where it masks; CPM-Ant's second mask, which zeroes the probabilities again after the softmax,
must evaluate to the scores' one (it then zeroes only what the softmax made 0: a causal row
always attends to its own key). GPT-Neo's `where(mask, scores, fill)` under HF's mask: both
masks are evaluated (the window is the narrower), the fill must be very negative; the mask and
fill read the model's buffer and a lifted constant, whose values the compiler puts in scope
(`attention_masks.constants_known`). OpenAI-GPT's `scores * mask + (1 - mask) * fill`: its mask
(a slice of its triangular buffer) must hold only 0 and 1 and be causal where it is 1, and its
fill at most `MULTIPLIED_FILL_MAX`.
"""

from __future__ import annotations

import torch
from xdsl.ir import SSAValue
from xdsl.utils.exceptions import PassFailedException

from ad_mlir.passes.cache.interface import CacheSite
from ad_mlir.passes.patterns.attention_masks import MaskError, NotCausalWindow, causal_window, evaluate
from ad_mlir.passes.patterns.attention_patterns import Attention

MULTIPLIED_FILL_MAX = -1e4
"""The largest fill of OpenAI-GPT's `scores * mask + (1 - mask) * fill` taken as masking (HF's
is -1e4). Its masked logits are exactly the fill (a finite score times 0 is 0), so each masked
probability is exp(fill - row max) / sum, and exp underflows to exactly 0 in fp32 (and in the
fp32 softmax of bf16 and fp16 inputs) below -104 (half the smallest subnormal, 2^-150): the
result is the causal kernel's exactly for every row with an attended score above fill + 104
(-9896 for -1e4), which the query's own key is in any row whose scores are not all hugely negative."""


def attention_window(site: CacheSite, attention: Attention, layer: str) -> int | None:
    """None for causal attention, the window of a sliding-window mask; raises otherwise."""
    if attention.mask is None and attention.selected is None and attention.multiplied is None:
        if not attention.causal:
            raise PassFailedException(f"{layer}: attention without a mask and not causal cannot be cached")
        return attention.window
    try:
        windows = []
        if attention.mask is not None:
            windows.append(causal_window(_attended(site, attention)))
        if attention.selected is not None:  # GPT-Neo's where(mask, scores, fill): both masks apply
            windows.append(_selected_window(site, *attention.selected))
        if attention.multiplied is not None:  # OpenAI-GPT's scores * mask + (1 - mask) * fill
            windows.append(_multiplied_window(site, *attention.multiplied))
        return min((w for w in windows if w is not None), default=None)
    except NotCausalWindow as e:
        raise PassFailedException(f"{layer}: {e}; only those can be cached") from None
    except MaskError as e:
        raise PassFailedException(f"{layer}: {e}") from None


def _attended(site: CacheSite, attention: Attention) -> torch.Tensor:
    """`attention.mask` evaluated as where it attends (a masked_fill mask is True where it masks)."""
    mask = evaluate(site.fn, attention.mask, site.mask_inputs())
    if not attention.mask_fills:
        return mask
    if mask.dtype != torch.bool:
        raise MaskError(f"its masked_fill mask is {mask.dtype}, not boolean")
    if attention.zeroed is not None:
        _check_zeroed(site, attention.zeroed, mask)
    return ~mask


def _check_zeroed(site: CacheSite, zeroed: SSAValue, masked: torch.Tensor) -> None:
    """CPM-Ant's mask that zeroes the probabilities after the softmax must be the scores'
    masked_fill mask `masked` (evaluated); a MaskError otherwise."""
    values = evaluate(site.fn, zeroed, site.mask_inputs())
    try:
        same = values.dtype == torch.bool and torch.equal(*torch.broadcast_tensors(values, masked))
    except RuntimeError:  # shapes that do not broadcast together
        same = False
    if not same:
        raise MaskError("its probabilities are zeroed after the softmax under a mask other than its scores' one")


def _selected_window(site: CacheSite, mask: SSAValue, fill: SSAValue) -> int | None:
    """The window of `where(mask, scores, fill)`'s boolean mask, whose fill must mask (very
    negative: at most half the dtype's lowest); a MaskError otherwise."""
    window = causal_window(evaluate(site.fn, mask, site.mask_inputs()))
    value = evaluate(site.fn, fill, site.mask_inputs())
    if not value.is_floating_point() or float(value.max()) > torch.finfo(value.dtype).min / 2:
        raise MaskError(f"its masked scores are filled with {float(value.max())}, not a very negative number")
    return window


def _multiplied_window(site: CacheSite, mask: SSAValue, fill: float) -> int | None:
    """The window of `scores * mask + (1 - mask) * fill`'s mask, which must hold only 0 and 1
    (the scores where 1: the sum is then exactly the scores or exactly the fill), whose fill must
    be at most `MULTIPLIED_FILL_MAX`; a MaskError otherwise."""
    if fill > MULTIPLIED_FILL_MAX:
        raise MaskError(f"its scores are masked as scores * mask + (1 - mask) * {fill}: the fill is not at most "
                        f"{MULTIPLIED_FILL_MAX}")
    values = evaluate(site.fn, mask, site.mask_inputs())
    if not values.is_floating_point() or not torch.all((values == 0) | (values == 1)):
        raise MaskError("its scores are masked as scores * mask + (1 - mask) * fill by a mask that holds values "
                        "other than 0 and 1")
    return causal_window(values == 1)
