"""Mamba1's selective scan, cached: HF's scan as the export patches route it
(`frontends/export_patches.py`: one opaque `ad_mlir.selective_scan` over the whole sequence,
`scan_patterns.match_selective_scan`) becomes `ad.cached_selective_scan` over an fp32 state
argument `ssm_state_<i>` [max-batch, channels, state_size], marked `ad.cache = "<layer>
ssm_state"` (its D, gate z, dt bias and softplus carried). HF keeps this state in fp32 too.
Paged, the state stays one per sequence, in the `state_slots` the driver adds, and the op takes
`query_starts` besides.
"""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.dialects.builtin import Float32Type, TensorType, UnitAttr
from xdsl.ir import Operation
from xdsl.rewriter import Rewriter

from ad_mlir.dialects import ad
from ad_mlir.passes.cache.interface import CachedMixer, CacheSite, Found, find_ops, layer_of, optional
from ad_mlir.passes.cache.ssm_scan import ROLE
from ad_mlir.passes.patterns.scan_patterns import SelectiveScan, match_selective_scan


def _find(fn: func.FuncOp) -> Found:
    return find_ops(fn, ad.TorchOp, match_selective_scan, "scan")


def _cache_all(site: CacheSite, scans: list[SelectiveScan]) -> None:
    for scan in scans:
        _cache(site, scan)


def _cache(site: CacheSite, scan: SelectiveScan) -> None:
    """The opaque scan -> `ad.cached_selective_scan` over its state [max-batch, channels, state_size]."""
    state_type = TensorType(Float32Type(), [site.max_batch, *scan.a.type.get_shape()])
    # numbered among every ssm_state: Mamba2's scan keeps one too
    state = site.add_cache(state_type, f"{ROLE}_{site.count_roles(ROLE)}", layer_of(scan.op), ROLE)
    cached = ad.CachedSelectiveScanOp.build(
        operands=[scan.input, scan.dt, scan.a, scan.b, scan.c, optional(scan.d), optional(scan.z),
                  optional(scan.dt_bias), *site.state_operands(state)],
        properties={"dt_softplus": UnitAttr()} if scan.dt_softplus else {},
        result_types=[scan.op.results[0].type])
    cached.location = scan.op.location
    Rewriter.replace_op(scan.op, cached)


def _replaced(scan: SelectiveScan) -> Operation:
    return scan.op


MIXER = CachedMixer("selective scan", _find, _cache_all, _replaced, per_sequence=True)
