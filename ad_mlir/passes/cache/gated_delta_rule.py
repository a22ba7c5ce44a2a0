"""The gated delta rule, cached (Qwen3-Next and its kind): HF's chunked scan as the export
patches route it (`frontends/export_patches.py`: one opaque `ad_mlir.chunk_gated_delta_rule`
over the whole sequence, `scan_patterns.match_gated_delta_rule`) becomes
`ad.cached_gated_delta_rule` over an fp32 state argument `recurrent_state_<i>` [max-batch, value
heads, key dim, value dim], marked `ad.cache = "<layer> recurrent_state"` (its q/k L2 norm
carried). HF keeps this state in fp32 too. Paged, the state stays one per sequence, in the
`state_slots` the driver adds, and the op takes `query_starts` besides.
"""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.dialects.builtin import Float32Type, TensorType, UnitAttr
from xdsl.ir import Operation
from xdsl.rewriter import Rewriter

from ad_mlir.dialects import ad
from ad_mlir.passes.cache.interface import CachedMixer, CacheSite, Found, find_ops, layer_of
from ad_mlir.passes.patterns.scan_patterns import GatedDeltaRule, match_gated_delta_rule

ROLE = "recurrent_state"


def _find(fn: func.FuncOp) -> Found:
    return find_ops(fn, ad.TorchOp, match_gated_delta_rule, "scan")


def _cache_all(site: CacheSite, scans: list[GatedDeltaRule]) -> None:
    for i, scan in enumerate(scans):
        _cache(site, scan, i)


def _cache(site: CacheSite, scan: GatedDeltaRule, i: int) -> None:
    """The opaque scan -> `ad.cached_gated_delta_rule` over its state [max-batch, value heads,
    key dim, value dim]."""
    _, _, v_heads, v_dim = scan.value.type.get_shape()
    state_type = TensorType(Float32Type(), [site.max_batch, v_heads, scan.key.type.get_shape()[3], v_dim])
    state = site.add_cache(state_type, f"{ROLE}_{i}", layer_of(scan.op), ROLE)
    cached = ad.CachedGatedDeltaRuleOp.build(
        operands=[scan.query, scan.key, scan.value, scan.g, scan.beta, *site.state_operands(state)],
        properties={"use_qk_l2norm": UnitAttr()} if scan.use_qk_l2norm else {},
        result_types=[scan.op.results[0].type])
    cached.location = scan.op.location
    Rewriter.replace_op(scan.op, cached)


def _replaced(scan: GatedDeltaRule) -> Operation:
    return scan.op


MIXER = CachedMixer("gated delta rule", _find, _cache_all, _replaced, per_sequence=True)
