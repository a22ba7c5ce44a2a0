"""Named pipelines and running a pass pipeline with per-pass logging."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.dialects.func import FuncOp
from xdsl.ir import Operation
from xdsl.passes import ModulePass, PassPipeline
from xdsl.utils.exceptions import ArgSpecParseError, DiagnosticException

from ad_mlir.passes import get_all_passes
from ad_mlir.passes.patterns.matching import describe_op

if TYPE_CHECKING:
    from ad_mlir.passes.verify import NumericVerifier

log = logging.getLogger(__name__)

PIPELINES: dict[str, str] = {
    "default": (
        "canonicalize,match-layernorm,match-rmsnorm,fuse-add-rmsnorm,fuse-add-layernorm,match-moe,fuse-gemms,"
        "fuse-silu-mul,fuse-gelu-mul,fuse-activation,fuse-rmsnorm-quant,fuse-rope-attention,optimize-rope,decompose,"
        "fuse-elementwise"
    ),
    "none": "",
}
"""Pipelines by name; anything else is a YAML file or an xDSL pipeline string ("pass{opt=v},pass")."""


class PipelineConfigError(ValueError):
    """A pipeline YAML file that does not describe passes we have."""


SKIP_ON_ERROR_VARIABLE = "AD_MLIR_SKIP_ON_ERROR"
"""`0` turns the fallback off where the config does not say (the test suite does: a pass that
raises must fail its test); users get it on."""


@dataclass(frozen=True)
class PipelineConfig:
    """A pipeline as pass objects: what a name, a pass string or a YAML file becomes once parsed,
    and what a caller that builds its pipeline (`LLM`) gives directly."""

    passes: tuple[ModulePass, ...]
    skip_on_error: bool | None = None
    """From a YAML file's top-level `skip_on_error`; None: not said."""

    @property
    def spec(self) -> str:
        """The passes as an xDSL pass string, options as xDSL prints them (what the program
        cache keys on)."""
        return ",".join(str(p.pipeline_pass_spec()) for p in self.passes)

    def skips_on_error(self) -> bool:
        """Whether `run_pipeline` skips a failing pass: as the config says, else as
        AD_MLIR_SKIP_ON_ERROR says (on unless `0`)."""
        return self.skip_on_error if self.skip_on_error is not None else default_skip_on_error()


def _is_yaml(pipeline: str | Path) -> bool:
    return isinstance(pipeline, Path) or str(pipeline).endswith((".yaml", ".yml"))


Pipeline = str | Path | PipelineConfig
"""What takes a pipeline takes a name in PIPELINES, a pass string, a YAML file (`.yaml`/`.yml`)
or the passes themselves."""


def load_pipeline(pipeline: Pipeline) -> PipelineConfig:
    """A pipeline name, a YAML file or a pass string -> its passes (a `PipelineConfig` as it is)."""
    if isinstance(pipeline, PipelineConfig):
        return pipeline
    if _is_yaml(pipeline):
        return pipeline_from_yaml(Path(pipeline))
    return PipelineConfig(parse_passes(PIPELINES.get(str(pipeline), str(pipeline))))


def parse_passes(spec: str) -> tuple[ModulePass, ...]:
    """An xDSL pass string's passes, with their options."""
    return PassPipeline.parse_spec(get_all_passes(), spec).passes


def pipeline_from_yaml(path: Path) -> PipelineConfig:
    """The AutoDeploy shape: `transforms: {fuse_elementwise: {enabled: true, max_ops: 32}}`,
    in order; names and options may use `_` for `-`; `enabled` defaults to true. A top-level
    `skip_on_error: true|false` sets the fallback (`run_pipeline`)."""
    import yaml

    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise PipelineConfigError(f"{path}: {e}") from None
    transforms = config.get("transforms") if isinstance(config, dict) else None
    if not isinstance(transforms, dict):
        raise PipelineConfigError(f"{path}: expected 'transforms:' mapping pass names to their options")
    skip_on_error = config.get("skip_on_error")
    if skip_on_error is not None and not isinstance(skip_on_error, bool):
        raise PipelineConfigError(f"{path}: skip_on_error must be true or false, got {skip_on_error!r}")
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
    try:
        passes = parse_passes(",".join(specs))
    except (ValueError, ArgSpecParseError) as e:  # xDSL says what of an option it cannot take
        raise PipelineConfigError(f"{path}: {e}") from None
    return PipelineConfig(passes, skip_on_error)


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


def expand_passes(passes: Sequence[ModulePass]) -> list[ModulePass]:
    """`default` as the passes it runs, so each is timed, verified and skipped on its own."""
    from ad_mlir.passes.default import DefaultPipelinePass

    expanded: list[ModulePass] = []
    for p in passes:
        if isinstance(p, DefaultPipelinePass):
            expanded += PassPipeline.parse_spec(get_all_passes(), PIPELINES["default"]).passes
        else:
            expanded.append(p)
    return expanded


def default_skip_on_error() -> bool:
    return os.environ.get(SKIP_ON_ERROR_VARIABLE, "1") != "0"


def run_pipeline(
    module: ModuleOp,
    pipeline: Pipeline = "default",
    verify: bool = True,
    numeric: NumericVerifier | None = None,
    skip_on_error: bool | None = None,
) -> list[PassRecord]:
    """Apply `pipeline` (a name in PIPELINES, a YAML file, a pass string or a `PipelineConfig`) to `module` in
    place, verifying the IR after each pass and, with `numeric`, its results (the module before
    and after on the same inputs, `passes/verify.py`); returns what each pass did.

    With `skip_on_error` (else the YAML's `skip_on_error`, else on unless
    AD_MLIR_SKIP_ON_ERROR=0), a pass that raises, leaves invalid IR or changes the results is
    undone and skipped with a warning naming it and the op it failed on: the graph stays what
    it was before that pass, so it stays correct. A pass whose rewrite its caller relies on
    (`skippable_on_error = False`: the cache insertion, without which `LLM` cannot generate)
    raises whatever the setting.

    Without `numeric` the passes first run straight through and the IR is verified once, at the
    end: a copy of the module before each pass and a verification after it cost as much as the
    passes themselves. Only if a pass raises or the IR ends invalid does the pipeline run again
    from the start, checked pass by pass as above, which names (or skips) the pass."""
    config = load_pipeline(pipeline)
    if skip_on_error is None:
        skip_on_error = config.skips_on_error()
    passes = expand_passes(config.passes)
    ctx = make_context()
    if numeric is None and verify and passes:
        start = module.clone()
        try:
            records = _run_passes(passes, ctx, module, lambda p: p.apply(ctx, module))
            module.verify()
            return records
        except Exception as e:  # noqa: BLE001 (whatever failed, the checked run below says it, naming the pass)
            log.info("pipeline: %s; running it again pass by pass, checked", failure(e))
            _restore(module, start)
    return _run_passes(passes, ctx, module, lambda p: _apply_checked_or_skipped(p, ctx, module, verify, numeric,
                                                                                 skip_on_error))


def _run_passes(passes: Sequence[ModulePass], ctx: Context, module: ModuleOp,
                apply: Callable[[ModulePass], None]) -> list[PassRecord]:
    """`apply` each pass in turn, timed and logged."""
    records: list[PassRecord] = []
    ops = count_ops(module)
    for p in passes:
        start = time.perf_counter()
        apply(p)
        record = PassRecord(p.name, ops, count_ops(module), time.perf_counter() - start)
        log.info("%s: %d -> %d ops in %.3f s", record.name, record.ops_before, record.ops_after, record.seconds)
        records.append(record)
        ops = record.ops_after
    return records


def _apply_checked_or_skipped(p: ModulePass, ctx: Context, module: ModuleOp, verify: bool,
                              numeric: NumericVerifier | None, skip_on_error: bool) -> None:
    """`p` applied and checked; if that fails, with `skip_on_error` and a skippable pass, the
    module as before it, with a warning, else the failure raised."""
    before = module.clone() if skip_on_error else None
    try:
        _apply_checked(p, ctx, module, verify, numeric)
    except Exception as e:
        if before is None or not getattr(p, "skippable_on_error", True):
            raise
        log.warning("%s: skipped (skip_on_error), the graph is left as before it: %s", p.name, failure(e))
        _restore(module, before)


def _apply_checked(p: ModulePass, ctx: Context, module: ModuleOp, verify: bool,
                   numeric: NumericVerifier | None) -> None:
    if numeric is not None:
        numeric.before_pass(module)
    p.apply(ctx, module)
    if verify:
        module.verify()
    if numeric is not None:
        numeric.check_pass(p.name, module)


def failure(e: BaseException) -> str:
    """An exception from a pass, in one line, with the op it was working on when that can be
    told (the innermost frame holding an op of the function)."""
    message = " ".join(f"{type(e).__name__}: {e}".split())
    if isinstance(e, DiagnosticException):  # its message already says where
        return message
    tb = e.__traceback__
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        op = next((v for v in frame.f_locals.values()
                   if isinstance(v, Operation) and not isinstance(v, ModuleOp | FuncOp)), None)
        if op is not None:
            return f"on {describe_op(op)}: {message}"
    return message


def _restore(module: ModuleOp, before: ModuleOp) -> None:
    block = module.body.block
    for op in list(block.ops):
        op.detach()
    for op in list(before.body.block.ops):
        op.detach()
        block.add_op(op)
