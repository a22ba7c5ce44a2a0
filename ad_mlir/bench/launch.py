"""ad-bench's launch part: what calling a kernel costs the host, with the kernel itself stubbed
(`ad_mlir.runtime.kernels.stubbed_launches`), so that it is measured on every machine, GPU or
not, and tracked from run to run.

A decode step of SmolLM2's shape (one decoder layer, the paged form, `SEQUENCES`
sequences of `CACHED` cached tokens each) is run once to record each kernel call's inputs. Then,
per kernel, microseconds per call through:

- `op`: the kernel's torch op (`torch.ops.ad_mlir.<kernel>`: torch's dispatch of a custom op,
  what graphs handed to users call),
- `direct`: the kernel's Python entry (what `LLM`'s runner calls, `call_kernels_directly`),
- `launcher`: the generated `launch` alone (inputs bound, grid computed, outputs allocated),
  its kernel a stub that does nothing;
- `jit`: the generated `launch` with the kernel launched through Triton's JIT
  (`kernel[grid](...)`: the arguments bound and specialized, the cache key built and looked up,
  the launch hooks' metadata made), the compiled kernel's launcher (`CompiledKernel.run`) a stub;
- `bound`: the same through the kernel bound once (`runtime/bound_launch.py`, what a call on CUDA
  takes): the specialization key, the compiled kernel looked up, its stubbed `run` called;

and per step, the whole step's host cost through each of the graphs (a tenth of the calls).
Each figure is the median of `REPEATS` timings of `CALLS` calls. `jit` and `bound` run Triton's
own JIT on any machine: its driver is one that reports device 0, stream 0 and an sm_90 target
(`host_only_triton`), and each kernel's compilation gives the stub (`stubbed_jit`)."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
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


def recorded_calls(llm: Any, flat: tuple[torch.Tensor, ...]) -> dict[str, tuple[Any, tuple[list[Any], ...]]]:
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
    from ad_mlir.runtime.bound_launch import BoundKernel
    from ad_mlir.runtime.kernels import _NO_KERNEL, stubbed_launches

    llm, flat = _decode_step(progress)
    direct = llm.runner
    rows = []
    with stubbed_launches(), host_only_triton():
        for name, (kernel, groups) in recorded_calls(llm, flat).items():
            progress(f"launch: {name}")
            tensors, scalars = kernel._launch_inputs(kernel.join_inputs(*groups))
            launch, jit = kernel.cached.module.launch, stubbed_jit(kernel.cached.jit_function)
            timed = {"op": lambda k=kernel, g=groups: k.op(*g), "direct": lambda k=kernel, g=groups: k.run(*g)}
            for path, fn in (("launcher", _NO_KERNEL), ("jit", jit), ("bound", BoundKernel(jit))):
                timed[path] = lambda f=launch, fn=fn, t=tensors, s=scalars: f(fn, t, s)
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


class _HostDriver:
    """Triton's driver as its JIT asks it, on a host with no GPU: device 0, stream 0, sm_90."""

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int) -> int:
        return 0

    def get_current_target(self) -> Any:
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)


@contextlib.contextmanager
def host_only_triton() -> Iterator[None]:
    """Within it, Triton's JIT runs without a GPU (`_HostDriver`): kernels from `stubbed_jit`
    bind, specialize and look up their compiled kernel as on CUDA."""
    from triton.runtime import driver

    outer = driver._active  # None until a driver was made: set back as it was, the next use makes one
    driver.set_active(_HostDriver())
    try:
        yield
    finally:
        driver.set_active(outer)


def jit_twin(fn: Any) -> Any:
    """A new `JITFunction` of a kernel's function and decorator keywords, whether the kernel was
    loaded for the interpreter or compiled (its parameters, its binder, caches of its own)."""
    from triton.runtime.jit import JITFunction

    if hasattr(fn, "kwargs"):  # the interpreter's function keeps the decorator's keywords
        return JITFunction(fn.fn, **fn.kwargs)
    return JITFunction(fn.fn, do_not_specialize=fn.do_not_specialize,
                       do_not_specialize_on_alignment=fn.do_not_specialize_on_alignment, debug=fn.debug,
                       noinline=fn.noinline, launch_metadata=fn.launch_metadata)


def stub_compiled_kernel(name: str, run: Callable[..., None] | None = None) -> Any:
    """A `CompiledKernel` whose launcher (`run`) is `run`, by default one that launches nothing."""
    from triton.compiler import CompiledKernel

    kernel = CompiledKernel.__new__(CompiledKernel)
    # `module` set: its handles count as loaded; `_module_pid` None: nothing to unload when freed
    kernel.__dict__.update(name=name, src=None, module=name, _module_pid=None, function=0, packed_metadata=(),
                           _run=run or _launch_nothing)
    return kernel


def stubbed_jit(fn: Any, run: Callable[..., None] | None = None) -> Any:
    """A `jit_twin` of the kernel `fn` whose every compilation gives `stub_compiled_kernel(run)`.
    Make it and launch it within `host_only_triton`."""
    twin = jit_twin(fn)
    stub = stub_compiled_kernel(twin.__name__, run)
    twin.device_caches[0]  # noqa: B018 (its binder made now, which sets the `compile` replaced here)
    twin.compile = lambda *_, **__: stub
    return twin


def _launch_nothing(*_: Any) -> None:
    return None


def _calls_kernel(node: torch.fx.Node) -> bool:
    from ad_mlir.runtime.kernels import registered_kernel

    return node.op == "call_function" and registered_kernel(node.target) is not None
