"""The `ad-bench` kernel harness, run on CPU with tiny shapes: every case compiles to at least one
of our kernels (run in the Triton interpreter, never the torch reference), matches eager, and
yields complete rows with consistent bytes and bandwidths. The timings of real calls are not
checked (benchmarks are not tests); `measure` itself is, on a fake clock."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import torch
from kernel_guard import graph_kernels, kernels_ran

import ad_mlir
from ad_mlir.bench import timing
from ad_mlir.bench.kernels import CASES, BenchmarkError, Shape, check_outputs, run_kernel_benchmarks
from ad_mlir.bench.timing import Timing, achieved_gbps, copy_bandwidth_gbps, measure

CPU = torch.device("cpu")
TOKENS = (1, 3)
HIDDEN = 128
HEADS = {"head_dim": 32, "kv_heads": 2}
"""4 query heads of 32 at hidden 128 (32 is the attention template's smallest head_dim), 2 kv heads."""


def expected_bytes(case: str, tokens: int, hidden: int, element: int) -> int:
    """The bytes formulas, spelled out: each input read and each output written once."""
    t, h, b = tokens, hidden, element
    width = h * 7 // 2
    d, kv = HEADS["head_dim"], HEADS["kv_heads"]
    q = h // d
    attention = 2 * t * q * d * b + 2 * t * kv * d * b + 2 * t * d * b
    return {
        "add_rmsnorm": 2 * t * h * b + h * b + 2 * t * h * b,
        "rmsnorm_fp8_static": t * h * b + h * b + 4 + t * h,
        "rmsnorm_fp8_dynamic": t * h * b + h * b + t * h + 4 * t,
        "silu_mul": 3 * t * width * b,
        "silu_mul_fp8_static": 2 * t * width * b + 4 + t * width,
        "rope_qk": 2 * t * (q + kv) * d * b + 2 * t * d * b,
        "rope_attention": attention,
        "attention_separate_rope": attention,
        "elementwise_chain": 3 * t * h * b,
    }[case]


@pytest.fixture
def no_reference_fallback(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The ad-mlir rows must time the Triton kernels, not the regions' torch reference."""
    with kernels_ran(monkeypatch):
        yield


@pytest.fixture
def short_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fewest timed calls: the interpreter is slow and the numbers are not the point here."""
    monkeypatch.setattr(timing, "CPU_BUDGET_S", 0.0)


def check_rows(rows: list[dict], case: str, impls: tuple[str, ...], tokens: tuple[int, ...], dtype: torch.dtype) -> None:
    assert {(r["impl"], r["tokens"], r["mode"]) for r in rows} == {(i, t, "plain") for i in impls for t in tokens}
    assert len(rows) == len(impls) * len(tokens)
    json.dumps(rows)
    element = torch.empty((), dtype=dtype).element_size()
    for r in rows:
        assert r["case"] == case and r["hidden"] == HIDDEN and r["dtype"] == str(dtype).removeprefix("torch.")
        assert r["bytes"] == expected_bytes(case, r["tokens"], HIDDEN, element)
        assert r["bytes_formula"] == CASES[case].bytes_formula
        assert r["gbps"] == pytest.approx(r["bytes"] / (r["median_ms"] * 1e-3) / 1e9)
        assert r["copy_gbps"] > 0 and r["pct_of_copy"] == pytest.approx(100 * r["gbps"] / r["copy_gbps"])
        if r["impl"] == "ad-mlir":
            assert r["kernels"] >= 1
        else:
            assert r["kernels"] is None


@pytest.mark.parametrize(
    "case", list(CASES)
)
@pytest.mark.usefixtures("no_reference_fallback", "short_timing")
def test_case_rows(case: str) -> None:
    lines: list[str] = []
    rows = run_kernel_benchmarks(
        CPU, [(t, HIDDEN) for t in TOKENS], torch.bfloat16, impls=("ad-mlir", "eager"), cases=[case],
        progress=lines.append, **HEADS,
    )
    check_rows(rows, case, ("ad-mlir", "eager"), TOKENS, torch.bfloat16)
    assert len(lines) == 1 + len(rows), "the copy bandwidth, then one line per row"


@pytest.mark.usefixtures("no_reference_fallback", "short_timing")
def test_torch_compile_rows() -> None:
    """Inductor on CPU compiles in seconds even for one tiny case: one case, one shape."""
    impls = ("ad-mlir", "eager", "torch.compile")
    rows = run_kernel_benchmarks(CPU, [(1, HIDDEN)], torch.float32, impls=impls, cases=["elementwise_chain"])
    check_rows(rows, "elementwise_chain", impls, (1,), torch.float32)


def test_separate_rope_keeps_torch_attention() -> None:
    """The two attention cases compare one fused kernel with our RoPE kernel + torch's SDPA."""
    shape = Shape(3, HIDDEN, **HEADS)
    for name, fused in (("rope_attention", True), ("attention_separate_rope", False)):
        case = CASES[name]
        inputs = case.inputs(shape, torch.float32, CPU)
        gm = ad_mlir.compile(torch.export.export(case.module, inputs), pipeline=case.pipeline)
        names = graph_kernels(gm)
        assert any(k.startswith("rope_attention_") for k in names) == fused, names
        assert any(k.startswith("rope_") and "attention" not in k for k in names) != fused, names
        targets = {str(n.target) for n in gm.graph.nodes}
        assert ("aten.scaled_dot_product_attention.default" in targets) != fused


def test_bad_arguments_are_errors() -> None:
    with pytest.raises(ValueError, match="unknown cases"):
        run_kernel_benchmarks(CPU, [(1, HIDDEN)], torch.float32, cases=["rmsnorm"])
    with pytest.raises(ValueError, match="unknown implementations"):
        run_kernel_benchmarks(CPU, [(1, HIDDEN)], torch.float32, impls=("triton",))
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        run_kernel_benchmarks(CPU, [(1, HIDDEN)], torch.float32, cuda_graphs=True)
    with pytest.raises(ValueError, match="not benchmarked"):
        run_kernel_benchmarks(CPU, [(1, HIDDEN)], torch.float64)


def test_wrong_outputs_are_not_timed() -> None:
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    check_outputs("close", [x * (1 + 2.0**-8)], [x], torch.bfloat16)
    with pytest.raises(BenchmarkError, match="output 0 differs"):
        check_outputs("wrong", [x.flip(0)], [x], torch.bfloat16)
    with pytest.raises(BenchmarkError, match="instead of"):
        check_outputs("wrong dtype", [x.float()], [x], torch.bfloat16)
    q = (torch.randn(4, 64) * 100).to(torch.float8_e4m3fn)
    check_outputs("fp8 equal", [q], [q], torch.bfloat16)
    with pytest.raises(BenchmarkError, match="e4m3 step"):
        check_outputs("fp8 wrong", [(q.float() * 1.5).to(torch.float8_e4m3fn)], [q], torch.bfloat16)


def test_measure_on_cpu_times_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a fake clock that each call advances by a known time (warm-up calls first, then calls
    of 5, 1, 4, 2 and 3 ms, no time budget left): exactly the timed calls' median, 20th and 80th
    percentiles (statistics.quantiles, inclusive: 3, 1.8 and 4.2 ms)."""
    now = [0.0]
    durations_ms = iter([7.0] * timing.CPU_WARMUP_CALLS + [5.0, 1.0, 4.0, 2.0, 3.0])
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(timing, "CPU_BUDGET_S", 0.0)

    def call() -> None:
        now[0] += next(durations_ms) * 1e-3

    t = measure(call, CPU)
    assert (t.median_ms, t.p20_ms, t.p80_ms) == pytest.approx((3.0, 1.8, 4.2))
    assert next(durations_ms, None) is None, "every warm-up and timed call ran, no more"


def test_cuda_graph_on_cpu_raises() -> None:
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        measure(lambda: None, CPU, cuda_graph=True)


def test_bandwidths() -> None:
    assert achieved_gbps(3_000_000, Timing(median_ms=2.0, p20_ms=1.0, p80_ms=3.0)) == pytest.approx(1.5)
    assert copy_bandwidth_gbps(CPU, 1 << 20) > 0
