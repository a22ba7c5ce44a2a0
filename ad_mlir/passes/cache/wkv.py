"""RWKV's time mixing, cached: HF's WKV recurrence as the export patches route it
(`frontends/export_patches.py`: one opaque `ad_mlir.wkv_scan(w, u, k, v)` over the whole
sequence from an empty state, w = `-exp(time_decay)`) becomes `ad.cached_wkv` over an fp32 state
argument `wkv_state_<i>` [max-batch, 3, width] (num, den and the running maximum, HF's three
state tensors of the layer), marked `ad.cache = "<layer> wkv_state"`. HF keeps this state in fp32
too. The token shifts beside it (the patches' `cat([zeros, x])[:, :-1]`) are token windows
(`token_window.py`). Paged, the state stays one per sequence, in the `state_slots` the driver
adds, and the op takes `query_starts` besides.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects import func
from xdsl.dialects.builtin import Float32Type, TensorType
from xdsl.ir import Operation, SSAValue
from xdsl.rewriter import Rewriter

from ad_mlir.dialects import ad
from ad_mlir.passes.cache.interface import CachedMixer, CacheSite, Found, find_ops, layer_of
from ad_mlir.semantics.op_table import attr_to_value, bound_arguments
from ad_mlir.semantics.torch_ops import NAMESPACE

ROLE = "wkv_state"
WKV_SCAN = f"{NAMESPACE}.wkv_scan.default"


@dataclass(frozen=True)
class WkvScan:
    """`wkv_scan(w, u, k, v)`: w and u [width], k and v [batch, seq, width]."""

    op: ad.TorchOp
    w: SSAValue
    u: SSAValue
    key: SSAValue
    value: SSAValue


def match_wkv_scan(op: ad.TorchOp) -> WkvScan | None:
    """The opaque scan, its arguments read by name; None for any other torch op."""
    if op.target.data != WKV_SCAN:
        return None
    f = bound_arguments(op.target.data, attr_to_value(op.args, op.inputs), attr_to_value(op.kwargs, op.inputs))
    return WkvScan(op, f["w"], f["u"], f["k"], f["v"])


def _find(fn: func.FuncOp) -> Found:
    return find_ops(fn, ad.TorchOp, match_wkv_scan, "WKV scan")


def _cache_all(site: CacheSite, scans: list[WkvScan]) -> None:
    for i, scan in enumerate(scans):
        _cache(site, scan, i)


def _cache(site: CacheSite, scan: WkvScan, i: int) -> None:
    """The opaque scan -> `ad.cached_wkv` over its state [max-batch, 3, width]."""
    state_type = TensorType(Float32Type(), [site.max_batch, 3, scan.key.type.get_shape()[2]])
    state = site.add_cache(state_type, f"{ROLE}_{i}", layer_of(scan.op), ROLE)
    cached = ad.CachedWkvOp.build(operands=[scan.w, scan.u, scan.key, scan.value, *site.state_operands(state)],
                                  result_types=[scan.op.results[0].type])
    cached.location = scan.op.location
    Rewriter.replace_op(scan.op, cached)


def _replaced(scan: WkvScan) -> Operation:
    return scan.op


MIXER = CachedMixer("WKV scan", _find, _cache_all, _replaced, per_sequence=True)
