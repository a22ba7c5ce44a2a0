"""RecurrentGemma's RG-LRU, cached: HF's scan as the export patches route it
(`frontends/export_patches.py`: one opaque `ad_mlir.rg_lru_scan(x, a)` over the whole sequence
from a zero state, a already 0 at position 0) becomes `ad.cached_rg_lru` over an fp32 state
argument `rg_lru_state_<i>` [max-batch, width], marked `ad.cache = "<layer> rg_lru_state"`. HF
keeps this state in fp32 too. Paged, the state stays one per sequence, in the `state_slots` the
driver adds, and the op takes `query_starts` besides.
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

ROLE = "rg_lru_state"
RG_LRU_SCAN = f"{NAMESPACE}.rg_lru_scan.default"


@dataclass(frozen=True)
class RgLruScan:
    """`rg_lru_scan(x, a)`: x and a [batch, seq, width]."""

    op: ad.TorchOp
    input: SSAValue
    a: SSAValue


def match_rg_lru_scan(op: ad.TorchOp) -> RgLruScan | None:
    """The opaque scan, its arguments read by name; None for any other torch op."""
    if op.target.data != RG_LRU_SCAN:
        return None
    f = bound_arguments(op.target.data, attr_to_value(op.args, op.inputs), attr_to_value(op.kwargs, op.inputs))
    return RgLruScan(op, f["x"], f["a"])


def _find(fn: func.FuncOp) -> Found:
    return find_ops(fn, ad.TorchOp, match_rg_lru_scan, "RG-LRU scan")


def _cache_all(site: CacheSite, scans: list[RgLruScan]) -> None:
    for i, scan in enumerate(scans):
        _cache(site, scan, i)


def _cache(site: CacheSite, scan: RgLruScan, i: int) -> None:
    """The opaque scan -> `ad.cached_rg_lru` over its state [max-batch, width]."""
    state_type = TensorType(Float32Type(), [site.max_batch, scan.input.type.get_shape()[2]])
    state = site.add_cache(state_type, f"{ROLE}_{i}", layer_of(scan.op), ROLE)
    cached = ad.CachedRgLruOp.build(operands=[scan.input, scan.a, *site.state_operands(state)],
                                    result_types=[scan.op.results[0].type])
    cached.location = scan.op.location
    Rewriter.replace_op(scan.op, cached)


def _replaced(scan: RgLruScan) -> Operation:
    return scan.op


MIXER = CachedMixer("RG-LRU scan", _find, _cache_all, _replaced, per_sequence=True)
