"""Cached token windows: ops that read at most W tokens back from a sequence after W rows that
hold no token (`patterns/token_window.py`).

Two forms: a left pad of W zero tokens read by stacked valid convolutions whose spans, dilation
x (kernel - 1) each, add up to W (ZAYA's CCA q/k: a pad of (2 - 1) + (2 - 1) before convolutions
of kernels 2 and 2), or by an `unfold(-1, W + 1, 1)` after a cut to the pad's last seq + W rows,
all of them (Inkling2's dynamic short convolution: `F.pad(x, (k - 1, 0))[..., -(seq + k -
1):].unfold(-1, k, 1)`, the cut going with the pad); and a shift by W tokens, `cat([start,
x])[:-W]` along a token axis whose W start rows are computed from no token (ZAYA's delayed
values, W = 1, start `v_proj_delayed(zeros)`; DeepSeek-V4's CSA shifts by one token,
`compressed_attention.py`).

The pad, or the cat, becomes `ad.cached_token_window` over an argument `token_window_<i>` (the
input's shape with max-batch slots and W tokens) in the input's dtype, marked `ad.cache =
"<layer> token_window"`: the W rows before a step, which the op puts in front of the step's
tokens (at a sequence's start zeros, or the shift's start rows), as HF's cache does. The
convolutions run unchanged on those W + seq rows, and each of their outputs is its own token's;
the shift becomes the window's first seq rows. A pad whose convolutions look back less or more
than W, or a shift whose start rows read a token, is left as it is and refused by the driver.
Paged, the state stays one per sequence, in the `state_slots` the driver adds, and the op takes
`query_starts` besides: a shift's window is each flattened token's row `width` back in its own
sequence (RWKV's token shifts). Convolutions over a padded window would read across the
flattened sequences: the paged form refuses them as `PerSequenceState` (compile such a model in
the slot form).
"""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.dialects.builtin import DYNAMIC_INDEX, DenseArrayBase, IndexType, IntegerAttr, TensorType, i64
from xdsl.ir import Operation
from xdsl.rewriter import InsertPoint, Rewriter

from ad_mlir.dialects import ad
from ad_mlir.passes.cache.interface import CachedMixer, CacheSite, Found, PerSequenceState, layer_of, logged
from ad_mlir.passes.patterns.token_window import PaddedConvs, Shift, match_left_pad, match_shift

ROLE = "token_window"


def _find(fn: func.FuncOp) -> Found:
    """The left pads of tokens read by convolutions and the shifts by tokens of `fn`, in
    program order (one sweep: the windows are numbered in that order)."""
    found = []
    for op in fn.body.block.ops:
        if isinstance(op, ad.TorchOp) and (match := logged(match_left_pad(op), op, "pad")) is not None:
            found.append(match)
        elif isinstance(op, ad.CatOp) and (match := logged(match_shift(op), op, "cat")) is not None:
            found.append(match)
    return Found(found)


def _cache_all(site: CacheSite, windows: list[PaddedConvs | Shift]) -> None:
    for i, window in enumerate(windows):
        _cache(site, window, i)


def _cache(site: CacheSite, found: PaddedConvs | Shift, i: int) -> None:
    """A left pad read by convolutions, or a shift by tokens -> `ad.cached_token_window` over a
    state argument `token_window_<i>` (the input's shape with max-batch slots and `width`
    tokens) in the input's dtype: the convolutions and unfolds read it as they read the pad
    (the cut to its last seq + width rows, all of them, goes); the shift is its first seq rows."""
    x, at = found.input, _replaced(found)
    if site.paged and isinstance(found, PaddedConvs):
        raise PerSequenceState(
            f"{layer_of(at)}: convolutions over a cached token window read each token's earlier rows across the "
            "flattened step, which the paged form (paged=true) does not hold: compile this model in the slot form "
            "(paged=false)")
    shape = list(x.type.get_shape())
    shape[0], shape[found.dim] = site.max_batch, found.width
    state = site.add_cache(TensorType(x.type.element_type, shape), f"{ROLE}_{i}", layer_of(at), ROLE)
    initial = [found.initial] if isinstance(found, Shift) else []
    window = ad.CachedTokenWindowOp.build(operands=[x, initial, *site.state_operands(state)],
                                          properties={"dim": IntegerAttr(found.dim, i64)},
                                          result_types=[at.results[0].type])
    window.location = at.location
    window.result.name_hint = "window"
    if isinstance(found, PaddedConvs):
        Rewriter.replace_op(found.pad, window)
        if found.cut is not None:  # it keeps all of the window's rows too
            Rewriter.replace_op(found.cut, [], [window.result])
    else:
        _shift_from(window, found)


def _shift_from(window: ad.CachedTokenWindowOp, shift: Shift) -> None:
    """The shift's cut -> the window's first seq rows; its cat goes."""
    tokens = ad.SymSizeOp.build(operands=[shift.input], properties={"dim": IntegerAttr(shift.dim, i64)},
                                result_types=[IndexType()])
    tokens.result.name_hint = "tokens"
    first = ad.SliceOp.build(operands=[window.result, [tokens.result]],
                             properties={"dim": IntegerAttr(shift.dim, i64),
                                         "static_bounds": DenseArrayBase.from_list(i64, [0, DYNAMIC_INDEX, 1])},
                             result_types=[shift.cut.result.type])
    for op in (tokens, first):
        op.location = shift.cut.location
    Rewriter.insert_op([window, tokens], InsertPoint.before(shift.cat))
    Rewriter.replace_op(shift.cut, first)
    Rewriter.erase_op(shift.cat)


def _replaced(found: PaddedConvs | Shift) -> Operation:
    """The pad, or the shift's cat."""
    return found.pad if isinstance(found, PaddedConvs) else found.cat


MIXER = CachedMixer("token window", _find, _cache_all, _replaced, per_sequence=True)
