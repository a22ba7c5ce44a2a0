"""Compile time of Llama-shaped graphs (real sizes, weights on the meta device): each ad-mlir
stage, and Inductor's `torch.compile` (CPU) of the same module in the same run.

Every measurement runs in a fresh process with empty caches (ad-mlir's kernel cache, Triton's,
Inductor's), as a model server's first start would: one-time warm-ups (torch.export's and
Dynamo's first trace, loading the compilers) count for both, and nothing one measurement
compiled makes the next one cheaper. Shapes drive compile time, not values: ad-mlir compiles
the meta-device model as it is. Inductor must run the model, so it gets uninitialized CPU
weights (`to_empty`), and is left out (with the reason) when those would not fit in memory.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ad_mlir.codegen.interpreter import default_to_interpreter
from ad_mlir.frontends.export import export_with_ids
from ad_mlir.passes.pipeline import PIPELINES
from ad_mlir.zoo.tiny import ModelShape, meta_model

Progress = Callable[[str], None]

TOKENS = 8
"""Tokens of the example input (the sequence length is dynamic in the exported graph)."""
INDUCTOR_MEMORY_SHARE = 0.5
"""Inductor runs the model: its weights may take at most this share of the machine's memory."""
CACHE_VARIABLES = ("AD_MLIR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")


def _total_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def time_ad_mlir(model: torch.nn.Module, ptx: bool = True) -> dict[str, float]:
    """Seconds per stage of `ad_mlir.compile` on `model` (export, import, each pass of the
    default pipeline, Triton codegen, PTX for sm_90 of each distinct kernel, export back to
    FX), in order."""
    from ad_mlir.codegen.ptx import ptx_reports
    from ad_mlir.frontends.fx_import import import_program
    from ad_mlir.passes.pipeline import run_pipeline
    from ad_mlir.runtime.fx_export import export_program
    from ad_mlir.runtime.kernels import build_kernels

    stages: dict[str, float] = {}

    def timed(stage: str, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        result = fn()
        stages[stage] = time.perf_counter() - start
        return result

    ids = torch.zeros(1, TOKENS, dtype=torch.long, device=next(model.parameters()).device)
    ep = timed("export", lambda: export_with_ids(model, ids))
    program = timed("import", lambda: import_program(ep))
    for record in run_pipeline(program.module, PIPELINES["default"]):
        stages[f"pass {record.name}"] = record.seconds
    kernels = timed("Triton codegen", lambda: build_kernels(program.module))
    if ptx:
        timed("PTX (sm_90)", lambda: ptx_reports(kernels.values()))
    timed("export to FX", lambda: export_program(program, kernels, fold_weights=True))
    return stages


def one_layer_repeated(model: torch.nn.Module, layers: int) -> torch.nn.Module:
    """`model` (one decoder layer) calling its layer `layers` times: the graph of a `layers`-deep
    model, with the weights of one layer."""
    model.model.layers = torch.nn.ModuleList([model.model.layers[0]] * layers)
    model.config.num_hidden_layers = layers
    return model


def time_inductor(model: torch.nn.Module) -> float:
    """Seconds Inductor takes to compile `model` (CPU): the first call of `torch.compile(model)`
    less a second, compiled one."""
    runnable = model.to_empty(device="cpu")
    ids = torch.zeros(1, TOKENS, dtype=torch.long)
    compiled = torch.compile(runnable)
    with torch.no_grad():
        start = time.perf_counter()
        compiled(input_ids=ids)
        first = time.perf_counter() - start
        start = time.perf_counter()
        compiled(input_ids=ids)
        run = time.perf_counter() - start
    return first - run


def _measure(which: str, layers: int, shape: ModelShape, dtype: str, ptx: bool, caches: str) -> Any:
    """In a fresh process: point every compile cache at the empty `caches`, then time. `which`:
    "ad-mlir", "inductor", or "inductor-one-layer" (`one_layer_repeated`)."""
    for variable in CACHE_VARIABLES:
        os.environ[variable] = str(Path(caches) / variable.lower())
    if not torch.cuda.is_available():
        default_to_interpreter()  # kernels load as on a CPU machine; PTX in a child
    if which == "ad-mlir":
        return time_ad_mlir(meta_model("llama", shape, layers, dtype), ptx)
    if which == "inductor":
        return time_inductor(meta_model("llama", shape, layers, dtype))
    return time_inductor(one_layer_repeated(meta_model("llama", shape, 1, dtype), layers))


def _in_fresh_process(*args: Any) -> Any:
    spawn = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="ad_bench_caches_") as caches:
        with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
            return pool.submit(_measure, *args, caches).result()


def run_compile_time(
    layer_counts: Sequence[int],
    shape: ModelShape | None = None,
    dtype: str = "bfloat16",
    inductor: bool = True,
    ptx: bool = True,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """One row per layer count: ad-mlir's stages and total, Inductor's compile time (or why it
    was not measured) and their ratio (default shape: `ModelShape()`, Llama-3-8B's sizes)."""
    shape = shape or ModelShape()
    return [_compile_row(layers, shape, dtype, inductor, ptx, progress) for layers in layer_counts]


def _compile_row(layers: int, shape: ModelShape, dtype: str, inductor: bool, ptx: bool,
                 progress: Progress | None) -> dict[str, Any]:
    if progress:
        progress(f"compile time: {layers} layers, ad-mlir")
    stages = _in_fresh_process("ad-mlir", layers, shape, dtype, ptx)
    row: dict[str, Any] = {"layers": layers, "hidden": shape.hidden_size, "dtype": dtype, "stages": stages,
                           "ad_mlir_s": sum(stages.values()), "inductor_s": None, "inductor_note": None}
    if not inductor:
        row["inductor_note"] = "not run (--no-inductor)"
    else:
        if progress:
            progress(f"compile time: {layers} layers, torch.compile (Inductor, CPU)")
        which = "inductor"
        needed = weight_bytes(meta_model("llama", shape, layers, dtype))
        if needed > INDUCTOR_MEMORY_SHARE * _total_memory():
            which = "inductor-one-layer"
            row["inductor_note"] = (f"its {needed / 2**30:.1f} GiB of weights do not fit in memory: every layer "
                                    "calls the first layer's module (the same graph)")
        row["inductor_s"] = _in_fresh_process(which, layers, shape, dtype, ptx)
    row["ratio"] = row["inductor_s"] / row["ad_mlir_s"] if row["inductor_s"] else None
    return row
