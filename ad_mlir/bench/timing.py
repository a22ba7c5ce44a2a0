"""Timing primitives of the kernel benchmarks: quantiles of a callable's run time, and the copy
bandwidth that achieved bandwidths are compared with.

On CUDA the timings are Triton's: `do_bench` (CUDA events around each call, L2 flushed before
each one, so a kernel reads its inputs from HBM as it would in a model) and `do_bench_cudagraph`
(calls replayed from one CUDA graph: no Python or launch overhead, what a decode step under
CUDA graphs sees). Without CUDA a wall-clock fallback times the same callable, so the harness
runs end to end on CPU (e.g. kernels in the Triton interpreter); its numbers say nothing about
a GPU.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

QUANTILES = [0.5, 0.2, 0.8]
"""Median, 20th and 80th percentiles, in `Timing`'s field order."""

CPU_WARMUP_CALLS = 2
CPU_MIN_CALLS = 5
CPU_MAX_CALLS = 200
CPU_BUDGET_S = 0.2
"""The CPU fallback times at least CPU_MIN_CALLS calls, then more until CPU_BUDGET_S has passed
(at most CPU_MAX_CALLS): enough for stable quantiles of a fast call, bounded for a slow one."""


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float


def measure(fn: Callable[[], object], device: torch.device, cuda_graph: bool = False) -> Timing:
    """Quantiles of `fn`'s run time on `device`; `cuda_graph` replays `fn` from a CUDA graph
    (CUDA only: `fn` must be capturable, i.e. warmed up and free of host synchronization)."""
    if device.type == "cuda":
        import triton.testing

        if cuda_graph:
            return Timing(*triton.testing.do_bench_cudagraph(fn, quantiles=QUANTILES))
        return Timing(*triton.testing.do_bench(fn, quantiles=QUANTILES))
    if cuda_graph:
        raise ValueError(f"CUDA graphs need a CUDA device, got {device}: time without cuda_graph")
    return _measure_wall_clock(fn)


def _measure_wall_clock(fn: Callable[[], object]) -> Timing:
    for _ in range(CPU_WARMUP_CALLS):
        fn()
    times_ms: list[float] = []
    start = time.perf_counter()
    while len(times_ms) < CPU_MIN_CALLS or (
        len(times_ms) < CPU_MAX_CALLS and time.perf_counter() - start < CPU_BUDGET_S
    ):
        t0 = time.perf_counter()
        fn()
        times_ms.append((time.perf_counter() - t0) * 1e3)
    deciles = statistics.quantiles(times_ms, n=10, method="inclusive")
    return Timing(median_ms=deciles[4], p20_ms=deciles[1], p80_ms=deciles[7])


def achieved_gbps(nbytes: int, t: Timing) -> float:
    """Bandwidth of moving `nbytes` in the median time (GB/s, 1e9 bytes)."""
    return nbytes / (t.median_ms * 1e-3) / 1e9


def copy_bandwidth_gbps(device: torch.device, nbytes: int) -> float:
    """Bandwidth of a device-to-device copy of `nbytes` bytes, counting the read and the write:
    the practical ceiling of a memory-bound kernel on `device`."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return achieved_gbps(2 * nbytes, measure(lambda: dst.copy_(src), device))
