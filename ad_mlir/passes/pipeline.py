"""Named pipelines and running a pass pipeline with per-pass logging."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass, PassPipeline

from ad_mlir.passes import get_all_passes

log = logging.getLogger(__name__)

PIPELINES: dict[str, str] = {
    "default": (
        "canonicalize,match-rmsnorm,fuse-add-rmsnorm,fuse-gemms,fuse-silu-mul,fuse-rmsnorm-quant,"
        "fuse-rope-attention,optimize-rope,decompose,fuse-elementwise"
    ),
    "none": "",
}
"""Pipelines by name; anything else is a YAML file or an xDSL pipeline string ("pass{opt=v},pass")."""


class PipelineConfigError(ValueError):
    """A pipeline YAML file that does not describe passes we have."""


def resolve_pipeline(pipeline: str | Path) -> str:
    """A pipeline name, a YAML file (`.yaml`/`.yml`) or a pass string -> an xDSL pass string."""
    if isinstance(pipeline, Path) or str(pipeline).endswith((".yaml", ".yml")):
        return pipeline_from_yaml(Path(pipeline))
    return PIPELINES.get(pipeline, pipeline)


def pipeline_from_yaml(path: Path) -> str:
    """The AutoDeploy shape: `transforms: {fuse_elementwise: {enabled: true, max_ops: 32}}`,
    in order; names and options may use `_` for `-`; `enabled` defaults to true."""
    import yaml

    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise PipelineConfigError(f"{path}: {e}") from None
    transforms = config.get("transforms") if isinstance(config, dict) else None
    if not isinstance(transforms, dict):
        raise PipelineConfigError(f"{path}: expected 'transforms:' mapping pass names to their options")
    known = get_all_passes()
    specs = []
    for key, options in transforms.items():
        name = str(key).replace("_", "-")
        if name not in known:
            raise PipelineConfigError(f"{path}: unknown transform '{key}' (known: {', '.join(sorted(known))})")
        if options is not None and not isinstance(options, dict):
            raise PipelineConfigError(f"{path}: options of '{key}' must be a mapping, got {options!r}")
        options = dict(options or {})
        if not options.pop("enabled", True):
            continue
        args = " ".join(f"{k.replace('_', '-')}={_spec_value(v)}" for k, v in options.items())
        specs.append(f"{name}{{{args}}}" if args else name)
    return ",".join(specs)


def _spec_value(value: object) -> str:
    if isinstance(value, list | tuple):
        return ",".join(_spec_value(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace('"', '\\"') + '"'
    return str(value)


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


def run_pipeline(module: ModuleOp, pipeline: str | Path = "default", verify: bool = True) -> list[PassRecord]:
    """Apply `pipeline` (a name in PIPELINES, a YAML file or a pass string) to `module` in
    place, verifying after each pass; returns what each pass did."""
    spec = resolve_pipeline(pipeline)
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
