"""Which template writes the kernel of each templated op: one table, op class -> template module.

Each template module under `codegen/templates/` ends in `EMITTER`, a `KernelEmitter` saying how
it writes an op's kernel, which operands that kernel writes in place and which ops it cannot
take. A new kernel is its template module plus one line of `TEMPLATES`. Modules are imported
on first use (as xDSL's registries of lazy getters do): the templates import torch, which
`ad-opt` does not need to parse, transform and print IR.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from xdsl.ir import Operation, SSAValue

from ad_mlir.dialects import ad
from ad_mlir.dialects.decompositions import NoKernelForm

OpT = TypeVar("OpT", bound=Operation)


def _writes_nothing(op: Operation) -> frozenset[int]:
    return frozenset()


def _takes_any(op: Operation) -> None:
    """A template without limits takes every op of its class."""


@dataclass(frozen=True)
class KernelEmitter(Generic[OpT]):
    emit: Callable[[OpT, str, str], str]
    """The kernel module's text for the op, its kernel name and the header that goes first."""
    written: Callable[[OpT], frozenset[int]] = _writes_nothing
    """The operands (by index) the kernel writes in place: its caches or states."""
    check: Callable[[OpT], None] = _takes_any
    """Raises `NoKernelForm` for an op the template cannot take (it runs as its reference)."""


def operand_indices(op: Operation, values: Iterable[SSAValue | None]) -> frozenset[int]:
    """The operand indices of `values` (absent optional operands, None, left out)."""
    return frozenset(op.operands.index(v) for v in values if v is not None)


def spec_check(spec: Callable[[OpT], object]) -> Callable[[OpT], None]:
    """A check that the op's template spec builds: the spec's `ValueError` (e.g. a head_dim the
    template does not take) is a `NoKernelForm`."""
    def check(op: OpT) -> None:
        try:
            spec(op)
        except ValueError as e:
            raise NoKernelForm(str(e)) from e
    return check


TEMPLATES: dict[type[Operation], str] = {
    ad.RopeAttentionOp: "attention_kernel",
    ad.RopeOp: "rope_kernel",
    ad.MoeOp: "moe_kernel",
    ad.MoeMxfp4Op: "moe_mxfp4_kernel",
    ad.MoeFp8BlockOp: "moe_fp8_block_kernel",
    ad.LinearFp8BlockOp: "linear_fp8_block_kernel",
    ad.LinearFp8Op: "linear_fp8_kernel",
    ad.LinearNvfp4Op: "linear_nvfp4_kernel",
    ad.LinearInt4Op: "linear_int4_kernel",
    ad.CachedAttentionOp: "cached_attention_kernel",
    ad.CachedMlaAttentionOp: "mla_attention_kernel",
    ad.CachedIndexTopkOp: "index_topk_kernel",
    ad.CachedCausalConv1dOp: "causal_conv_kernel",
    ad.CachedSsmScanOp: "ssm_scan_kernel",
    ad.CachedSelectiveScanOp: "selective_scan_kernel",
    ad.CachedGatedDeltaRuleOp: "gated_delta_rule_kernel",
    ad.CachedRgLruOp: "rg_lru_kernel",
    ad.CachedWkvOp: "wkv_kernel",
}
"""Each templated op's template module, under `ad_mlir.codegen.templates`."""


def emitter(op: Operation) -> KernelEmitter[Any]:
    """The emitter of a templated op (one whose class is in `TEMPLATES`)."""
    return importlib.import_module(f"{__package__}.templates.{TEMPLATES[type(op)]}").EMITTER
