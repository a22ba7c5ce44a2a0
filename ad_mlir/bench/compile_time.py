"""Compile time of Llama-shaped graphs (real sizes, weights on the meta device): each ad-mlir
stage, Inductor's `torch.compile` (CPU) of the same module and `torch.compile` with the ad-mlir
backend, cold and warm, in the same run.

Every measurement runs in a fresh process. Cold: with empty caches (ad-mlir's kernel and
program caches, Triton's, Inductor's), as a model server's first start would: one-time warm-ups
(torch.export's and Dynamo's first trace, loading the compilers) count for all, and nothing one
measurement compiled makes another cheaper. Warm: a second fresh process with the caches the
cold one left, as a restarted server would (ad-mlir reads the pipeline's result and the kernels,
Inductor its FX graph and kernel caches). Shapes drive compile time, not values: ad-mlir
compiles the meta-device model as it is. Inductor and the ad-mlir backend must run the model, so
they get uninitialized CPU weights (`to_empty`) and zeroed buffers, and are left out (with the
reason) when those would not fit in memory.
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

from ad_mlir.codegen.interpreter import use_interpreter
from ad_mlir.zoo.tiny import ModelShape, meta_model

Progress = Callable[[str], None]

TOKENS = 8
"""Tokens of the example input (the sequence length is dynamic in the exported graph)."""
MAX_SEQ = 4096
"""The dynamic sequence length's upper bound (`export_with_ids`')."""
INDUCTOR_MEMORY_SHARE = 0.5
"""Inductor runs the model: its weights may take at most this share of the machine's memory."""
CACHE_VARIABLES = ("AD_MLIR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")


def _total_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def time_ad_mlir(model: torch.nn.Module, ptx: bool = True) -> dict[str, float]:
    """Seconds per stage of `compile_program(model, ...)`, as the compiler records them
    (`compiler.recording_stages`: the module entry's key and read; where it misses, export,
    import, shortening the repeated decoder layers, the program cache's key, read and write, each
    pass of the default pipeline, Triton codegen, lengthening, export to FX, the module entry's
    write), then, with `ptx`, PTX for sm_90 of each distinct kernel of the compile (what a GPU
    machine's first launches compile; a warm compile finds them in Triton's cache)."""
    from ad_mlir.codegen.ptx import ptx_reports
    from ad_mlir.compiler import compile_program, recording_stages

    ids = torch.zeros(1, TOKENS, dtype=torch.long, device=next(model.parameters()).device)
    with recording_stages() as record:
        compile_program(model, {"input_ids": ids},
                        dynamic_shapes={"input_ids": {1: torch.export.Dim("seq", min=2, max=MAX_SEQ)}})
    stages = dict(record.seconds)
    if ptx:
        start = time.perf_counter()
        ptx_reports(record.kernels.values())
        stages["PTX (sm_90)"] = time.perf_counter() - start
    return stages


def one_layer_repeated(model: torch.nn.Module, layers: int) -> torch.nn.Module:
    """`model` (one decoder layer) calling its layer `layers` times: the graph of a `layers`-deep
    model, with the weights of one layer."""
    model.model.layers = torch.nn.ModuleList([model.model.layers[0]] * layers)
    model.config.num_hidden_layers = layers
    return model


def _runnable(model: torch.nn.Module) -> torch.nn.Module:
    """`model` on the CPU with uninitialized weights and zeroed buffers. Compile caches key a
    buffer by its value (ad-mlir's program cache: RoPE's frequencies, masks), and uninitialized
    memory differs in every process: it would make every warm compile a cold one."""
    runnable = model.to_empty(device="cpu")
    with torch.no_grad():
        for buffer in runnable.buffers():
            buffer.zero_()
    return runnable


def time_inductor(model: torch.nn.Module) -> float:
    """Seconds Inductor takes to compile `model` (CPU): the first call of `torch.compile(model)`
    less a second, compiled one."""
    runnable = _runnable(model)
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


class _Compiled(Exception):
    """Raised in place of running the graph the backend compiled: only compiling is timed."""


def time_backend(model: torch.nn.Module) -> float:
    """Seconds `torch.compile(model, backend="ad_mlir", fullgraph=True)` takes to compile (CPU):
    from its first call to the backend's return (Dynamo's trace, AOTAutograd, `ad_mlir.compile`).
    The compiled graph is not run: without a GPU its kernels run in the Triton interpreter, which
    at these sizes takes far longer than compiling (one graph, as `fullgraph` makes sure)."""
    from ad_mlir.dynamo_backend import ad_mlir_backend

    runnable = _runnable(model)
    ids = torch.zeros(1, TOKENS, dtype=torch.long)

    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        ad_mlir_backend(gm, example_inputs)
        done = time.perf_counter()

        def stop(*args: Any) -> Any:
            raise _Compiled(done)

        return stop

    compiled = torch.compile(runnable, backend=backend, fullgraph=True)
    with torch.no_grad():
        start = time.perf_counter()
        try:
            compiled(input_ids=ids)
        except _Compiled as e:
            return e.args[0] - start
    raise AssertionError("the backend compiled nothing")


def _measure(which: str, layers: int, shape: ModelShape, dtype: str, ptx: bool, caches: str) -> Any:
    """In a fresh process: point every compile cache at `caches`, then time. `which`:
    "ad-mlir", "inductor" or "backend" (`torch.compile` with the ad-mlir backend), the last two
    with "-one-layer" (`one_layer_repeated`)."""
    for variable in CACHE_VARIABLES:
        os.environ[variable] = str(Path(caches) / variable.lower())
    if not torch.cuda.is_available():
        # kernels load as on a CPU machine. ad-mlir's own measurement runs no kernel: there they
        # load compiled, as on a GPU machine, and PTX is built in this process through Triton's
        # cache (a warm compile finds its kernels there); the interpreter would build it in a
        # child process, whose start (~1-2 s of imports) no GPU compile pays. This process
        # inherited ad-bench's TRITON_INTERPRET=1, so the choice is made here either way.
        use_interpreter(which != "ad-mlir")
    from ad_mlir.runtime.program_cache import PROGRAM_CACHE_VARIABLE

    os.environ[PROGRAM_CACHE_VARIABLE] = "1"  # the backend's compile uses it (`time_ad_mlir` does in any case)
    if which == "ad-mlir":
        return time_ad_mlir(meta_model("llama", shape, layers, dtype), ptx)
    timer = time_inductor if which.startswith("inductor") else time_backend
    if which.endswith("-one-layer"):
        return timer(one_layer_repeated(meta_model("llama", shape, 1, dtype), layers))
    return timer(meta_model("llama", shape, layers, dtype))


def _in_fresh_process(*args: Any, caches: str) -> Any:
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        return pool.submit(_measure, *args, caches).result()


def _cold(*args: Any) -> Any:
    with tempfile.TemporaryDirectory(prefix="ad_bench_caches_") as caches:
        return _in_fresh_process(*args, caches=caches)


def _cold_and_warm(*args: Any) -> tuple[Any, Any]:
    """The measurement in a fresh process with empty caches, then in another with what the
    first left in them."""
    with tempfile.TemporaryDirectory(prefix="ad_bench_caches_") as caches:
        return _in_fresh_process(*args, caches=caches), _in_fresh_process(*args, caches=caches)


def run_compile_time(
    layer_counts: Sequence[int],
    shape: ModelShape | None = None,
    dtype: str = "bfloat16",
    inductor: bool = True,
    ptx: bool = True,
    progress: Progress | None = None,
    torch_compile_warm_and_backend: bool = True,
) -> list[dict[str, Any]]:
    """One row per layer count: ad-mlir's stages and total, cold and warm; Inductor's cold
    `torch.compile` time and, with `torch_compile_warm_and_backend`, its warm one and the ad-mlir
    backend's cold and warm (or why they were not measured); Inductor's cold / ad-mlir's cold and
    warm / warm (default shape: `ModelShape()`, Llama-3-8B's sizes)."""
    shape = shape or ModelShape()
    return [_compile_row(layers, shape, dtype, inductor, ptx, progress, torch_compile_warm_and_backend)
            for layers in layer_counts]


def _compile_row(layers: int, shape: ModelShape, dtype: str, inductor: bool, ptx: bool,
                 progress: Progress | None, torch_compile_warm_and_backend: bool) -> dict[str, Any]:
    if progress:
        progress(f"compile time: {layers} layers, ad-mlir")
    stages, warm_stages = _cold_and_warm("ad-mlir", layers, shape, dtype, ptx)
    row: dict[str, Any] = {"layers": layers, "hidden": shape.hidden_size, "dtype": dtype, "stages": stages,
                           "warm_stages": warm_stages, "ad_mlir_s": sum(stages.values()),
                           "ad_mlir_warm_s": sum(warm_stages.values()), "inductor_s": None, "inductor_warm_s": None,
                           "backend_s": None, "backend_warm_s": None, "inductor_note": None}
    if not inductor:
        row["inductor_note"] = "not run (--no-inductor)"
    else:
        needed = weight_bytes(meta_model("llama", shape, layers, dtype))
        suffix = ""
        if needed > INDUCTOR_MEMORY_SHARE * _total_memory():
            suffix = "-one-layer"
            row["inductor_note"] = (f"its {needed / 2**30:.1f} GiB of weights do not fit in memory: every layer "
                                    "calls the first layer's module (the same graph)")
        for which, label in (("inductor", "torch.compile (Inductor, CPU)"), ("backend", "torch.compile (ad-mlir)")):
            if progress:
                progress(f"compile time: {layers} layers, {label}")
            if torch_compile_warm_and_backend:
                row[f"{which}_s"], row[f"{which}_warm_s"] = _cold_and_warm(which + suffix, layers, shape, dtype, ptx)
            elif which == "inductor":
                row["inductor_s"] = _cold(which + suffix, layers, shape, dtype, ptx)
    row["ratio"] = row["inductor_s"] / row["ad_mlir_s"] if row["inductor_s"] else None
    row["warm_ratio"] = row["inductor_warm_s"] / row["ad_mlir_warm_s"] if row["inductor_warm_s"] else None
    return row
