"""`compile(gm)`: import -> pass pipeline -> Triton kernels for the fused regions -> export."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, TypeVar

import torch
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation

from ad_mlir.codegen.cache import KernelCache
from ad_mlir.frontends.export import ModuleExport, heap_frozen
from ad_mlir.frontends.export_key import Unkeyable, export_fingerprint
from ad_mlir.frontends.fx_import import ImportedProgram, import_program
from ad_mlir.frontends.graph_sources import module_export
from ad_mlir.frontends.input_checks import InputSpec
from ad_mlir.passes import repeated_layers
from ad_mlir.passes.patterns.attention_masks import constants_known
from ad_mlir.passes.pipeline import Pipeline, load_pipeline, run_pipeline
from ad_mlir.passes.verify import NumericVerifier
from ad_mlir.runtime.fx_export import export_program
from ad_mlir.runtime.kernels import RegionKernel, build_kernels
from ad_mlir.runtime.program_cache import (
    ModuleEntry,
    ProgramCache,
    Served,
    bound_weights,
    module_bindings,
    module_key,
    pass_warnings,
    program_cache_enabled,
    program_key,
    serving,
)
from ad_mlir.runtime.verify import check_compiled
from ad_mlir.semantics.weights import Rank

log = logging.getLogger(__name__)

Options = TypeVar("Options", bound="CompileOptions")


@dataclass(frozen=True)
class CompileOptions:
    """How to compile: the options `ad_mlir.compile`, `compile_program`, `LLM(...)` and
    `torch.compile(..., backend="ad_mlir", options={...})` share. Each of them takes an
    `options=` object and/or the fields as keywords (`compile(ep, pipeline="none")`); a keyword
    overrides the object's field."""

    pipeline: Pipeline = "default"
    """The pass pipeline: "default", "none", "pass,pass{option=value}", a pipeline YAML file or a
    `PipelineConfig` of pass objects."""
    verify: bool = False
    """Check every pass numerically (the function before and after it, `passes/verify.py`) and
    the result's kernels against the final IR (`runtime/verify.py`)."""
    cache: KernelCache | None = None
    """Where generated kernels are kept (default: `KernelCache()`, on disk, see `codegen/cache.py`),
    and beside them (`programs/`) the pipeline's results (`runtime/program_cache.py`): a second
    compile of the same program skips the passes, and of the same `nn.Module` (keyed by the
    fingerprint of its export, `frontends/export_key.py`) torch.export too
    (AD_MLIR_PROGRAM_CACHE=0 turns that off)."""
    world_size: int | None = None
    """Tensor-parallel world size for a pipeline with `shard` (default: the initialized process
    group's, else 1)."""
    rank: int | None = None
    """This process's rank in `world_size` (default: the process group's, else 0)."""
    layers_once: bool = True
    """Run the pipeline and code generation on one instance of each distinct decoder layer and
    instantiate it for the others (`passes/repeated_layers.py`; a model whose layers do not
    repeat is compiled whole). With `verify` the whole program is compiled, so that every pass is
    checked on every layer."""

    @classmethod
    def of(cls: type[Options], options: CompileOptions | Mapping[str, Any] | None = None,
           **overrides: Any) -> Options:
        """`options` (an options object, whose fields this class shares, or a mapping of field
        names) with `overrides` applied; an unknown name in a mapping or the overrides raises
        ValueError listing the known ones."""
        known = {f.name for f in fields(cls)}
        given = {f.name: getattr(options, f.name) for f in fields(options) if f.name in known} \
            if is_dataclass(options) else dict(options or {})
        given.update(overrides)
        unknown = sorted(set(given) - known)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} option(s) {', '.join(unknown)} "
                             f"(known: {', '.join(sorted(known))})")
        return cls(**given)


def compile(
    gm: torch.nn.Module | torch.export.ExportedProgram,
    example_inputs: Sequence[Any] | Mapping[str, Any] | None = None,
    *,
    dynamic_shapes: Any = None,
    options: CompileOptions | None = None,
    **overrides: Any,
) -> torch.fx.GraphModule:
    """Compile a graph through the pipeline (`CompileOptions`: `pipeline`, `verify`, `cache`,
    `world_size`, `rank`, given as `options=` and/or keywords). `gm` is
    an ExportedProgram (grad-mode exports included: grad-mode and disabled-autocast regions are
    inlined, an enabled autocast region gets its casts made explicit), `ep.module()`, an
    ATen-level GraphModule (`make_fx`, AOTAutograd) with `meta["val"]` or `example_inputs`, or an
    `nn.Module` / `symbolic_trace` GraphModule with `example_inputs` (a tuple of positional
    inputs or a dict of keyword inputs) and optionally `dynamic_shapes` (as `torch.export.export`
    takes them), exported here for inference (non-strict, under no_grad). A higher-order op that
    cannot be inlined exactly (`torch.cond`, ...) raises ImportError_ naming its node.
    Each fused region becomes a Triton kernel called as `torch.ops.ad_mlir.<name>`
    (kernels are cached on disk, see `codegen/cache.py`; so is the pipeline's result, keyed by
    the imported program, the values of its buffers and constants, the pipeline and the versions,
    see `runtime/program_cache.py`: compiling the same program again skips the passes; compiling
    the same `nn.Module` again skips torch.export too, `frontends/export_key.py`). The result takes the graph's user
    inputs in order and returns a tuple. Ops on weights alone (e.g. the weight concatenation of
    `fuse-gemms`) run once, here: the result holds their outputs in place of those weights.
    Weight arguments that are tensor-parallel shards (`ad.shard_dim`) hold `rank`'s slice.

    With `verify`, every pass is checked numerically (the function before and after it, on the
    same random inputs and the real weights, `passes/verify.py`), and so is the result: its
    kernels against the final IR (`runtime/verify.py`); a difference beyond the dtype's tolerance raises
    NumericMismatch naming the pass (and the first op that differs) or the result. A pass that
    raises or breaks the program is skipped instead when the pipeline's YAML says
    `skip_on_error: true` (the default outside the test suite, see `run_pipeline`).

    The result checks its inputs at every call before any kernel runs (count, dtype, device type,
    rank, static sizes, the dynamic dims' ranges of the export): a mismatch raises InputError
    naming the input, expected and actual (`frontends/input_checks.py`)."""
    return compile_program(gm, example_inputs, dynamic_shapes=dynamic_shapes, options=options, **overrides)[0]


def compile_program(
    gm: torch.nn.Module | torch.export.ExportedProgram | ModuleExport,
    example_inputs: Sequence[Any] | Mapping[str, Any] | None = None,
    *,
    dynamic_shapes: Any = None,
    options: CompileOptions | None = None,
    **overrides: Any,
) -> tuple[torch.fx.GraphModule, ImportedProgram]:
    """`compile`, also returning the program the pipeline made (its function's arguments say
    what the compiled graph takes, e.g. the K/V caches `insert-cached-attention` added). `gm`
    may also be a `ModuleExport` (an export not run yet, as `LLM` gives it), run only where the
    program cache holds no module entry for it."""
    opts = CompileOptions.of(options, **overrides)
    source = gm if isinstance(gm, ModuleExport) else (
        module_export(gm, example_inputs, dynamic_shapes)
        if isinstance(gm, torch.nn.Module) and not isinstance(gm, torch.fx.GraphModule) else None)
    with heap_frozen():  # no full garbage collection over the model and the export while compiling
        kernels, rank = opts.cache or KernelCache(), _rank(opts.world_size, opts.rank)
        with _stage("module entry key"):
            key = module_entry_key(source, opts, rank)
        if source is not None and key is not None:
            with _stage("module entry read"):
                done = from_module_entry(source, key, kernels, rank)
            if done:
                _record_kernels(done[2])
                return done[:2]
        with serving() as served:
            if source is not None:
                with _stage("export"):
                    source.exported()
            with _stage("import"):
                program = import_program(source or gm, example_inputs, dynamic_shapes)
            imported = dict(program.weights)
            with constants_known(program.weights):  # a mask computed from a buffer (GPT-Neo's) can be evaluated
                built = _run_pipeline_or_reuse(program, opts, kernels, rank)
        with _stage("export to FX"):
            compiled = export_program(program, built, fold_weights=True, rank=rank)
        if source is not None and key is not None:
            with _stage("module entry write"):
                store_module_entry(source, key, served, program.input_specs, imported, kernels)
        _record_kernels(built)
    if opts.verify:
        check_compiled(compiled, program.module, program.weights)
    return compiled, program


def module_entry_key(source: ModuleExport | None, opts: CompileOptions, rank: Rank) -> str | None:
    """The key of `source`'s module entry (`runtime/program_cache.py`): a compile found by its
    export's fingerprint (`frontends/export_key.py`), which skips torch.export. None where
    there is no module to export, the program cache is off, `verify` is asked for (the passes
    always run then) or the module cannot be fingerprinted (said in the log)."""
    if source is None or opts.verify or not program_cache_enabled():
        return None
    try:
        fingerprint = export_fingerprint(source)
    except Unkeyable as e:
        log.info("program cache: the export is not keyed, torch.export runs: %s", e)
        return None
    return module_key(fingerprint, load_pipeline(opts.pipeline), rank, opts.layers_once)


def from_module_entry(
    source: ModuleExport, key: str, kernels: KernelCache, rank: Rank
) -> tuple[torch.fx.GraphModule, ImportedProgram, dict[Operation, RegionKernel]] | None:
    """The compile a module entry stored (and its kernels): its program read from the program
    cache (its passes' warnings said again), lengthened to all its layers where it is a
    shortened one, with the weights of `source`'s module bound by the names the export gave
    them. None (the export and compile run) where there is no entry, or it or the program it
    names is missing or unusable."""
    programs = ProgramCache.beside(kernels)
    entry = programs.load_module(key)
    stored = None if entry is None else programs.load(entry.program)
    if entry is None or stored is None:
        return None
    try:
        weights = bound_weights(source.module, entry.weights)
    except AttributeError as e:  # the key holds every weight's name: a stale entry
        log.warning("program cache module entry for %s: %s: exporting again", type(source.module).__name__, e)
        return None
    program = ImportedProgram(stored.module, weights, entry.input_specs)
    built = build_kernels(program.module, kernels)
    if entry.repeated is not None:
        try:
            repeated_layers.lengthen(program.module, *entry.repeated, lambda old, new: _same_kernel(built, old, new))
        except repeated_layers.NotRepeating as e:
            log.warning("program cache module entry's program does not lengthen (%s): exporting again", e)
            return None
    log.info("program cache: module entry %s read, torch.export skipped", programs.module_path(key).name)
    return export_program(program, built, fold_weights=True, rank=rank), program, built


def store_module_entry(source: ModuleExport, key: str, served: Served, input_specs: dict[str, InputSpec],
                        imported: dict[str, torch.Tensor], kernels: KernelCache) -> None:
    """Point `key` at the program the program cache served this compile; not where what it
    served cannot be told (said in the log)."""
    if served.last not in served.repeated:
        log.info("program cache: no module entry stored (no program served whose key this compile computed)")
        return
    entry = ModuleEntry(served.last, served.repeated[served.last], dict(input_specs),
                        module_bindings(source.module, imported))
    ProgramCache.beside(kernels).store_module(key, entry)


def _run_pipeline_or_reuse(
    program: ImportedProgram, opts: CompileOptions, kernels: KernelCache, rank: Rank
) -> dict[Operation, RegionKernel]:
    """Run the pipeline on `program`'s module, or take its result from the program cache
    (`runtime/program_cache.py`, beside `kernels`) where an earlier compile stored it, with the
    warnings its passes logged (said again); then its kernels. Where the decoder layers repeat
    (`opts.layers_once`), on a shortened program lengthened afterwards (`_compile_shortened`).
    With `verify` the passes always run, on the whole program (each is checked on every layer);
    their result is stored either way."""
    with _stage("repeated layers: shorten"):
        short = _shortened(program, opts)
    if short is not None and (built := _compile_shortened(program, short, opts, kernels, rank)) is not None:
        return built
    numeric = NumericVerifier(program.weights) if opts.verify else None
    if not program_cache_enabled():
        _timed_pipeline(program.module, opts.pipeline, numeric)
        return _codegen(program.module, kernels)
    programs = ProgramCache.beside(kernels)
    with _stage("program key"):
        key = program_key(program, load_pipeline(opts.pipeline), rank)
    with _stage("program cache read"):
        stored = None if opts.verify else programs.load(key)
    if stored is not None:
        program.module = stored.module
        return _codegen(program.module, kernels)
    with pass_warnings() as warnings:
        _timed_pipeline(program.module, opts.pipeline, numeric)
    with _stage("program cache write"):
        programs.store(key, program.module, warnings)
    return _codegen(program.module, kernels)


@dataclass(frozen=True)
class _Shortened:
    """A program whose decoder layers repeat, cut to a few of them (`repeated_layers.shorten`)."""

    module: ModuleOp
    layers: int
    period: int

    def __str__(self) -> str:
        kept = repeated_layers.kept_layers(self.layers, self.period)
        return f"{self.layers} layers of period {self.period}, compiled {kept} and instantiated the other {self.layers - kept}"


def _shortened(program: ImportedProgram, opts: CompileOptions) -> _Shortened | None:
    if not opts.layers_once or opts.verify:
        return None
    try:
        layout, p = repeated_layers.period(program.function)
        return _Shortened(repeated_layers.shorten(program.function, layout, p), len(layout.layers), p)
    except repeated_layers.NotRepeating as e:
        log.info("repeated layers: compiling the whole program (%s)", e)
        return None


def _compile_shortened(
    program: ImportedProgram, short: _Shortened, opts: CompileOptions, kernels: KernelCache, rank: Rank
) -> dict[Operation, RegionKernel] | None:
    """The pipeline (or the program cache, keyed by the shortened program and the layer count,
    which with the layers' period determine the whole) and code generation on the shortened
    program, then `repeated_layers.lengthen` to all the layers: `program`'s module becomes that.
    None (`program` unchanged, the reason logged) where the compiled layers do not repeat."""
    programs = ProgramCache.beside(kernels) if program_cache_enabled() else None
    key, stored = None, None
    if programs is not None:
        with _stage("program key"):
            key = program_key(ImportedProgram(short.module, program.weights), load_pipeline(opts.pipeline), rank,
                              repeated=(short.layers, short.period))
        with _stage("program cache read"):
            stored = programs.load(key)
    module, warnings = (stored.module if stored else short.module), []
    if stored is None:
        with pass_warnings() as warnings:
            _timed_pipeline(module, opts.pipeline)
    to_store = None
    if programs is not None and stored is None:
        with _stage("program cache write"):
            to_store = module.clone()  # lengthen changes the module
    built = _codegen(module, kernels)
    try:
        with _stage("repeated layers: lengthen"):
            repeated_layers.lengthen(module, short.layers, short.period,
                                     lambda old, new: _same_kernel(built, old, new))
    except repeated_layers.NotRepeating as e:
        log.info("repeated layers: compiling the whole program (%s)", e)
        return None
    if programs is not None and to_store is not None:
        with _stage("program cache write"):
            programs.store(key, to_store, warnings)
    log.info("repeated layers: %s", short)
    program.module = module
    return built


def _timed_pipeline(module: ModuleOp, pipeline: Pipeline, numeric: NumericVerifier | None = None) -> None:
    """`run_pipeline`, each pass's seconds recorded as a stage ("pass <name>"), and the rest of
    its time (copying the module, verifying it) as "pipeline checks"."""
    start = time.perf_counter()
    records = run_pipeline(module, pipeline, numeric=numeric)
    if (record := _RECORDING.get()) is not None:
        for r in records:
            record.add(f"pass {r.name}", r.seconds)
        record.add("pipeline checks", time.perf_counter() - start - sum(r.seconds for r in records))


def _codegen(module: ModuleOp, kernels: KernelCache) -> dict[Operation, RegionKernel]:
    with _stage("Triton codegen"):
        return build_kernels(module, kernels)


def _same_kernel(built: dict[Operation, RegionKernel], original: Operation, copy: Operation) -> None:
    if original in built:
        built[copy] = built[original]


@dataclass
class StageTimes:
    """What the compiles within `recording_stages()` did: the seconds of each stage by name, in
    the order each first ran (a stage that runs again adds to its time), and the kernels of the
    last compile (for a benchmark to build them for a GPU)."""

    seconds: dict[str, float] = field(default_factory=dict)
    kernels: dict[Operation, RegionKernel] = field(default_factory=dict)

    def add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds


_RECORDING: ContextVar[StageTimes | None] = ContextVar("ad_mlir_stage_times", default=None)


@contextlib.contextmanager
def recording_stages() -> Iterator[StageTimes]:
    """Within it, `compile_program` (and so `compile`, `LLM`) records the time of each of its
    stages: the module entry's key and read; where that misses, torch.export, the import,
    shortening repeated layers, the program cache's key, read and write, each pass, the
    pipeline's checks, Triton codegen, lengthening, export to FX and the module entry's write."""
    record = StageTimes()
    token = _RECORDING.set(record)
    try:
        yield record
    finally:
        _RECORDING.reset(token)


@contextlib.contextmanager
def _stage(name: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        if (record := _RECORDING.get()) is not None:
            record.add(name, time.perf_counter() - start)


def _record_kernels(built: dict[Operation, RegionKernel]) -> None:
    if (record := _RECORDING.get()) is not None:
        record.kernels = built


def _rank(world_size: int | None, rank: int | None) -> Rank:
    initialized = torch.distributed.is_available() and torch.distributed.is_initialized()
    if world_size is None:
        world_size = torch.distributed.get_world_size() if initialized else 1
    if rank is None:
        rank = torch.distributed.get_rank() if initialized else 0
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of {world_size}")
    return Rank(rank, world_size)
