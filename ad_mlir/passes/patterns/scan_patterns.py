"""HF's chunked scans as they export through the project's export patches
(`frontends/export_patches.py`): one opaque `ad.torch_op` calling `ad_mlir.mamba2_chunk_scan`,
`ad_mlir.chunk_gated_delta_rule` or `ad_mlir.selective_scan` (Mamba1), over the whole sequence from an empty state. The matchers
read its arguments by name, for the cache pass to rebuild it as a cached op."""

from __future__ import annotations

import math
from dataclasses import dataclass

from xdsl.ir import SSAValue

from ad_mlir.dialects import ad
from ad_mlir.semantics.op_table import attr_to_value, bound_arguments
from ad_mlir.semantics.torch_ops import NAMESPACE

MAMBA2_CHUNK_SCAN = f"{NAMESPACE}.mamba2_chunk_scan.default"
CHUNK_GATED_DELTA_RULE = f"{NAMESPACE}.chunk_gated_delta_rule.default"
SELECTIVE_SCAN = f"{NAMESPACE}.selective_scan.default"


@dataclass(frozen=True)
class SsmScan:
    """`mamba2_chunk_scan(hidden_states, dt, A, B, C, chunk_size, D, dt_bias, dt_softplus,
    dt_min, dt_max)`: its tensors and time-step settings (`dt_max` None: no upper bound)."""

    op: ad.TorchOp
    input: SSAValue
    dt: SSAValue
    a: SSAValue
    b: SSAValue
    c: SSAValue
    d: SSAValue | None
    dt_bias: SSAValue | None
    dt_softplus: bool
    dt_min: float
    dt_max: float | None


@dataclass(frozen=True)
class GatedDeltaRule:
    """`chunk_gated_delta_rule(query, key, value, g, beta, chunk_size, use_qk_l2norm_in_kernel)`."""

    op: ad.TorchOp
    query: SSAValue
    key: SSAValue
    value: SSAValue
    g: SSAValue
    beta: SSAValue
    use_qk_l2norm: bool


@dataclass(frozen=True)
class SelectiveScan:
    """Mamba1's `selective_scan(hidden_states, dt, A, B, C, D, z, delta_bias, delta_softplus)`."""

    op: ad.TorchOp
    input: SSAValue
    dt: SSAValue
    a: SSAValue
    b: SSAValue
    c: SSAValue
    d: SSAValue | None
    z: SSAValue | None
    dt_bias: SSAValue | None
    dt_softplus: bool


def _arguments(op: ad.TorchOp) -> dict:
    return bound_arguments(op.target.data, attr_to_value(op.args, op.inputs), attr_to_value(op.kwargs, op.inputs))


def match_ssm_scan(op: ad.TorchOp) -> SsmScan | None:
    if op.target.data != MAMBA2_CHUNK_SCAN:
        return None
    f = _arguments(op)
    return SsmScan(op, f["hidden_states"], f["dt"], f["A"], f["B"], f["C"], f["D"], f["dt_bias"],
                   bool(f["dt_softplus"]), float(f["dt_min"]), None if math.isinf(f["dt_max"]) else float(f["dt_max"]))


def match_gated_delta_rule(op: ad.TorchOp) -> GatedDeltaRule | None:
    if op.target.data != CHUNK_GATED_DELTA_RULE:
        return None
    f = _arguments(op)
    return GatedDeltaRule(op, f["query"], f["key"], f["value"], f["g"], f["beta"], bool(f["use_qk_l2norm_in_kernel"]))


def match_selective_scan(op: ad.TorchOp) -> SelectiveScan | None:
    if op.target.data != SELECTIVE_SCAN:
        return None
    f = _arguments(op)
    return SelectiveScan(op, f["hidden_states"], f["dt"], f["A"], f["B"], f["C"], f["D"], f["z"], f["delta_bias"],
                         bool(f["delta_softplus"]))
