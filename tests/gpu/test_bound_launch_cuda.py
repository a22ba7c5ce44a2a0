"""Kernel calls on a CUDA GPU launched through their compiled kernel bound once
(`runtime/bound_launch.py`): the outputs of Triton's JIT launch, the first call of a
specialization through `JITFunction.run` and none after it, through the kernels' direct entry
and their torch ops alike, on a side stream and inside a captured CUDA graph. Every kernel of a
decode step and of a prefill step of a tiny paged Llama, their inputs recorded from the steps.
Skipped without CUDA: CI has no GPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from engine_steps import two_sequence_flat_steps
from triton.runtime.jit import JITFunction

import ad_mlir
from ad_mlir.bench.launch import recorded_calls
from ad_mlir.runtime.bound_launch import BoundKernel
from ad_mlir.zoo.tiny import TinyConfig, build_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on CI)")


@pytest.fixture(scope="module")
def calls() -> list[tuple[Any, tuple[list[Any], ...]]]:
    """Each kernel's call in a decode step of two sequences and in a prefill step of two prompts,
    fp32 on the GPU: (kernel, the op's argument lists)."""
    llm = ad_mlir.LLM(build_model(TinyConfig(family="llama", layers=1)).cuda(), max_batch=2, max_seq_len=16,
                      page_size=4)
    found = []
    for flat in two_sequence_flat_steps():
        found += list(recorded_calls(llm, tuple(t.cuda() for t in flat)).values())
    assert {k.name.rsplit("_", 1)[0] for k, _ in found} >= {"rms_norm", "add_rms_norm", "cached_attention",
                                                             "silu_and_mul"}
    return found


@pytest.fixture
def jit_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of `JITFunction.run` calls (Triton's JIT launch) from now on."""
    count, run = [0], JITFunction.run

    def counting(self: JITFunction, *args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return run(self, *args, **kwargs)

    monkeypatch.setattr(JITFunction, "run", counting)
    return count


def test_bound_launches_give_the_jits_outputs_and_skip_it_after_the_first_call(calls: list,
                                                                                jit_runs: list[int]) -> None:
    """Outputs equal bit for bit: the same compiled kernel on the same inputs (cached attention
    writes the same K/V into its caches each time, and none of these kernels uses atomics)."""
    for kernel, groups in calls:
        tensors, scalars = kernel._launch_inputs(kernel.join_inputs(*groups))
        launch = kernel.cached.module.launch
        expected = launch(kernel.cached.jit_function, tensors, scalars)
        bound, before = BoundKernel(kernel.cached.jit_function), jit_runs[0]
        launch(bound, tensors, scalars)
        launches = jit_runs[0] - before
        got = launch(bound, tensors, scalars)
        assert jit_runs[0] - before == launches, f"{kernel.name}: a second call went through JITFunction.run"
        assert len(got) == len(expected) and all(torch.equal(g, e) for g, e in zip(got, expected, strict=True))


def test_direct_entries_and_torch_ops_launch_bound(calls: list, jit_runs: list[int]) -> None:
    """`RegionKernel.run` (what `LLM`'s runner and the torch op's CUDA kernel call) after a first
    call: no JIT launch, the op's outputs the entry's."""
    for kernel, groups in calls:
        kernel.run(*groups)
        kernel.op(*groups)
        before = jit_runs[0]
        direct, op = kernel.run(*groups), kernel.op(*groups)
        assert jit_runs[0] == before, kernel.name
        assert all(torch.equal(d, o) for d, o in zip(direct, op, strict=True)), kernel.name


def test_bound_launches_go_to_the_current_stream_and_into_captured_graphs(calls: list) -> None:
    """The stream is read at each launch: on a side stream, and under CUDA graph capture (a launch
    on another stream would fail the capture or be missing from the replay)."""
    kernel, groups = next(c for c in calls if c[0].name.startswith("rms_norm"))
    expected = kernel.run(*groups)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = kernel.run(*groups)
    torch.cuda.current_stream().wait_stream(side)
    assert all(torch.equal(s, e) for s, e in zip(on_side, expected, strict=True))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = kernel.run(*groups)
    for out in captured:
        out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(c, e) for c, e in zip(captured, expected, strict=True))
