"""ad-bench's launch part: what calling a kernel costs the host, with the kernel itself stubbed
(`ad_mlir.runtime.kernels.stubbed_launches`), so that it is measured on every machine, GPU or
not, and tracked from run to run.

A decode step of SmolLM2's shape (one decoder layer, the paged form, `SEQUENCES`
sequences of `CACHED` cached tokens each) is run once to record each kernel call's inputs. Then,
per kernel, microseconds per call through:

- `op`: the kernel's torch op (`torch.ops.ad_mlir.<kernel>`: torch's dispatch of a custom op,
  what graphs handed to users call),
- `direct`: the kernel's Python entry (what `LLM`'s runner calls, `call_kernels_directly`),
- `launcher`: the generated `launch` alone (inputs bound, grid computed, outputs allocated);

and per step, the whole step's host cost through each of the graphs. Each figure is the median
of `REPEATS` timings of `CALLS` calls."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

SEQUENCES = 4
CACHED = 64
REPEATS = 7
CALLS = 200


def _us_per_call(run: Callable[[], Any], calls: int, repeats: int) -> float:
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            run()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times) * 1e6


def _decode_step(progress: Callable[[str], None]) -> tuple[Any, tuple[torch.Tensor, ...]]:
    """A one-layer SmolLM2-shaped LLM (paged; bf16 on CUDA, else fp32 on the CPU) and the flat
    inputs of a decode step of `SEQUENCES` sequences that hold `CACHED` tokens each."""
    import ad_mlir
    from ad_mlir.bench.generate import smollm2_or_its_shape

    model, _ = smollm2_or_its_shape(1)
    if torch.cuda.is_available():
        model = model.to("cuda", torch.bfloat16)
    progress("launch: compiling a one-layer SmolLM2-shaped model")
    llm = ad_mlir.LLM(model, max_batch=SEQUENCES, max_seq_len=2 * CACHED, page_size=16)
    pages = CACHED // 16 + 1
    tables = torch.arange(SEQUENCES * pages).view(SEQUENCES, pages)
    flat = (torch.ones(1, SEQUENCES, dtype=torch.int64), torch.full((1, SEQUENCES), CACHED),
            torch.arange(SEQUENCES + 1), torch.full((SEQUENCES,), CACHED), tables, torch.arange(SEQUENCES))
    return llm, flat


def _recorded_calls(llm: Any, flat: tuple[torch.Tensor, ...]) -> dict[str, tuple[Any, tuple[list[Any], ...]]]:
    """Each kernel the step calls (by name, its first call) and the arguments it was given."""
    from ad_mlir.runtime import kernels

    calls: dict[str, tuple[Any, tuple[list[Any], ...]]] = {}
    run = kernels.RegionKernel.run

    def recording(kernel: Any, *groups: list[Any]) -> list[torch.Tensor]:
        calls.setdefault(kernel.name, (kernel, groups))
        return run(kernel, *groups)

    kernels.RegionKernel.run = recording
    try:
        llm.run_flat(*flat)
    finally:
        kernels.RegionKernel.run = run
    return calls


def run_launch(progress: Callable[[str], None] = lambda _: None, calls: int = CALLS,
               repeats: int = REPEATS) -> list[dict[str, Any]]:
    """The rows of the launch part (see the module's docstring): one per kernel, then the step's."""
    from ad_mlir.runtime.kernels import _NO_KERNEL, stubbed_launches

    llm, flat = _decode_step(progress)
    direct = llm.runner
    rows = []
    with stubbed_launches():
        for name, (kernel, groups) in _recorded_calls(llm, flat).items():
            progress(f"launch: {name}")
            tensors, scalars = kernel._launch_inputs(kernel.join_inputs(*groups))
            timed = {"op": lambda k=kernel, g=groups: k.op(*g), "direct": lambda k=kernel, g=groups: k.run(*g),
                     "launcher": lambda k=kernel, t=tensors, s=scalars: k.cached.module.launch(_NO_KERNEL, t, s)}
            rows.append({"kind": "kernel", "kernel": name,
                         **{f"{path}_us": _us_per_call(run, calls, repeats) for path, run in timed.items()}})
        progress("launch: whole steps")
        step: dict[str, Any] = {"kind": "step", "sequences": SEQUENCES, "cached": CACHED,
                                "kernels": sum(1 for n in direct.graph.nodes if _calls_kernel(n))}
        for label, graph in (("op", llm.graph), ("direct", direct)):
            llm.runner = graph  # a step's time is mostly its GEMMs and LM head: a tenth of the calls
            step[f"{label}_us"] = _us_per_call(lambda: llm.run_flat(*flat), max(calls // 10, 1), repeats)
        llm.runner = direct
        rows.append(step)
    return rows


def _calls_kernel(node: torch.fx.Node) -> bool:
    from ad_mlir.runtime.kernels import registered_kernel

    return node.op == "call_function" and registered_kernel(node.target) is not None
