"""Named pipelines and running a pass pipeline with per-pass logging."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass, PassPipeline

from ad_mlir.passes import get_all_passes

log = logging.getLogger(__name__)

PIPELINES: dict[str, str] = {
    "default": "canonicalize,decompose,fuse-elementwise",
    "none": "",
}
"""Pipelines by name; anything else is an xDSL pipeline string ("pass{opt=v},pass")."""


@dataclass(frozen=True)
class PassRecord:
    name: str
    ops_before: int
    ops_after: int
    seconds: float


def make_context() -> Context:
    from xdsl.dialects.builtin import Builtin
    from xdsl.dialects.func import Func

    from ad_mlir.dialects.ad import Ad

    ctx = Context()
    for dialect in (Builtin, Func, Ad):
        ctx.load_dialect(dialect)
    return ctx


def count_ops(module: ModuleOp) -> int:
    return sum(1 for _ in module.walk()) - 1


def run_pipeline(module: ModuleOp, pipeline: str = "default", verify: bool = True) -> list[PassRecord]:
    """Apply `pipeline` (a name in PIPELINES or a pass string) to `module` in place,
    verifying after each pass; returns what each pass did."""
    spec = PIPELINES.get(pipeline, pipeline)
    records: list[PassRecord] = []
    state = {"ops": count_ops(module), "t": time.perf_counter()}

    def after_pass(previous: ModulePass | None, mod: ModuleOp, _next: ModulePass | None) -> None:
        if previous is not None:
            if verify:
                mod.verify()
            ops = count_ops(mod)
            record = PassRecord(previous.name, state["ops"], ops, time.perf_counter() - state["t"])
            log.info("%s: %d -> %d ops in %.3f s", record.name, record.ops_before, record.ops_after, record.seconds)
            records.append(record)
            state["ops"] = ops
        state["t"] = time.perf_counter()

    PassPipeline.parse_spec(get_all_passes(), spec, after_pass).apply(make_context(), module)
    return records
