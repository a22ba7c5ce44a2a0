"""Mamba2's chunked scan, cached: HF's scan as the export patches route it
(`frontends/export_patches.py`: one opaque `ad_mlir.mamba2_chunk_scan` over the whole sequence,
`scan_patterns.match_ssm_scan`) becomes `ad.cached_ssm_scan` over an fp32 state argument
`ssm_state_<i>` [max-batch, heads, head_dim, state_size], marked `ad.cache = "<layer> ssm_state"`
(its D, dt_bias, softplus and time-step limits carried). HF keeps this state in fp32 too. Paged,
the state stays one per sequence, in the `state_slots` the driver adds, and the op takes
`query_starts` besides.
"""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.dialects.builtin import Float32Type, Float64Type, FloatAttr, TensorType, UnitAttr
from xdsl.ir import Attribute, Operation
from xdsl.rewriter import Rewriter

from ad_mlir.dialects import ad
from ad_mlir.passes.cache.interface import CachedMixer, CacheSite, Found, find_ops, layer_of, optional
from ad_mlir.passes.patterns.scan_patterns import SsmScan, match_ssm_scan

ROLE = "ssm_state"


def _find(fn: func.FuncOp) -> Found:
    return find_ops(fn, ad.TorchOp, match_ssm_scan, "scan")


def _cache_all(site: CacheSite, scans: list[SsmScan]) -> None:
    for scan in scans:
        _cache(site, scan)


def _cache(site: CacheSite, scan: SsmScan) -> None:
    """The opaque scan -> `ad.cached_ssm_scan` over its state [max-batch, heads, head_dim, state_size]."""
    _, _, heads, head_dim = scan.input.type.get_shape()
    state_type = TensorType(Float32Type(), [site.max_batch, heads, head_dim, scan.b.type.get_shape()[3]])
    # numbered among every ssm_state: Mamba1's selective scan keeps one too
    state = site.add_cache(state_type, f"{ROLE}_{site.count_roles(ROLE)}", layer_of(scan.op), ROLE)
    properties: dict[str, Attribute] = {"dt_min": FloatAttr(scan.dt_min, Float64Type())}
    if scan.dt_softplus:
        properties["dt_softplus"] = UnitAttr()
    if scan.dt_max is not None:
        properties["dt_max"] = FloatAttr(scan.dt_max, Float64Type())
    cached = ad.CachedSsmScanOp.build(
        operands=[scan.input, scan.dt, scan.a, scan.b, scan.c, optional(scan.d), optional(scan.dt_bias),
                  *site.state_operands(state)],
        properties=properties, result_types=[scan.op.results[0].type])
    cached.location = scan.op.location
    Rewriter.replace_op(scan.op, cached)


def _replaced(scan: SsmScan) -> Operation:
    return scan.op


MIXER = CachedMixer("SSM scan", _find, _cache_all, _replaced, per_sequence=True)
