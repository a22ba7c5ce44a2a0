"""Graphs the importer cannot take fail with a message that names the node and the way out."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest
import torch
from kernel_guard import graph_kernels, kernels_ran

import ad_mlir
from ad_mlir.codegen.cache import KernelCache
from ad_mlir.frontends.export import export_model
from ad_mlir.frontends.fx_import import ImportError_, import_program
from ad_mlir.frontends.graph_sources import SourceError
from ad_mlir.runtime.kernels import build_kernels
from ad_mlir.zoo.tiny import TinyConfig, build_model


class _WithSubmodule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).relu()


def test_graph_without_shapes_asks_for_example_inputs() -> None:
    """A torch-level graph (call_module/call_method, Python operators) is exported to ATen with
    example inputs (tests/unit/test_front_door.py); without them the error says to pass them."""
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    with pytest.raises(SourceError, match="torch-level GraphModule is exported with torch.export before "
                                          "compiling: pass example_inputs"):
        import_program(gm)


def test_module_without_example_inputs_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="nn.Module Linear is exported with torch.export before compiling: pass"):
        import_program(torch.nn.Linear(2, 2))


def test_aten_graph_without_shapes_asks_for_example_inputs() -> None:
    graph = torch.fx.Graph()
    graph.output((graph.call_function(torch.ops.aten.relu.default, (graph.placeholder("x"),)),))
    with pytest.raises(ImportError_, match="no meta\\['val'\\] shapes: pass example_inputs"):
        import_program(torch.fx.GraphModule(torch.nn.Module(), graph))


def test_compile_reports_unknown_pipeline_pass() -> None:
    ep = torch.export.export(torch.nn.ReLU(), (torch.randn(2),))
    with pytest.raises(Exception, match="bogus"):
        ad_mlir.compile(ep, pipeline="canonicalize,bogus")


def test_compile_none_and_default_pipelines_are_exact() -> None:
    model = _WithSubmodule().eval()
    x = torch.randn(3, 4)
    ep = torch.export.export(model, (x,))
    with torch.no_grad():
        expected = model(x)
        for pipeline in ("none", "default", "canonicalize,dce"):
            assert torch.equal(ad_mlir.compile(ep, pipeline=pipeline)(x)[0], expected), pipeline


class _ComplexAndInt8(torch.nn.Module):
    def forward(self, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        z = torch.complex(x, x.flip(-1)) * 2
        return torch.view_as_real(z * z).sum(-1), (a + b) * 3, torch.exp(x) + 1


def test_complex_and_int8_math_stay_out_of_kernels_and_stay_correct(monkeypatch: pytest.MonkeyPatch) -> None:
    """Types the kernels do not support (complex, int8) are carried as torch calls, outside any
    fused region; the float math around them still fuses; results equal eager's."""
    x = torch.randn(4, 6)
    a, b = torch.randint(-100, 100, (4, 6), dtype=torch.int8), torch.randint(-100, 100, (4, 6), dtype=torch.int8)
    ep = torch.export.export(_ComplexAndInt8(), (x, a, b))
    program = import_program(ep)
    from ad_mlir.passes.pipeline import run_pipeline

    run_pipeline(program.module, "default")
    for region in (op for op in program.module.walk() if op.name == "ad.fused"):
        types = [str(v.type) for v in (*region.inputs, *region.outputs)]
        assert not any("complex" in t or "i8>" in t for t in types), types
    gm = ad_mlir.compile(ep)
    graph_kernels(gm)  # the float math around them fuses
    with torch.no_grad(), kernels_ran(monkeypatch):
        for got, expected in zip(gm(x, a, b), _ComplexAndInt8()(x, a, b), strict=True):
            torch.testing.assert_close(got, expected, rtol=1.3e-6, atol=1e-5)


def _compile_into(cache: str, start: Any, results: Any) -> None:
    import os

    os.environ["AD_MLIR_CACHE_DIR"] = cache
    try:
        from ad_mlir.frontends.export import export_model
        from ad_mlir.zoo.tiny import TinyConfig, build_model, example_input_ids

        cfg = TinyConfig(layers=1)
        model = build_model(cfg)
        ep = export_model(model)
        start.wait(timeout=60)  # both processes generate the same kernels at the same moment
        gm = ad_mlir.compile(ep)
        ids = example_input_ids(cfg, 6)
        with torch.no_grad():
            error = (gm(ids)[0] - model(input_ids=ids).logits).abs().max().item()
        results.put(("ok", error))
    except BaseException as e:  # the parent asserts
        results.put(("failed", repr(e)))


def test_two_processes_compiling_into_one_cache_both_succeed(tmp_path: Path) -> None:
    """Writes are atomic (a temporary file, then os.replace): two compilers racing on the same
    kernels both get whole files, and the cache they leave serves a third compile entirely."""
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_compile_into, args=(str(tmp_path), start, results)) for _ in range(2)]
    for p in procs:
        p.start()
    try:
        outcomes = [results.get(timeout=300) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
    assert [o[0] for o in outcomes] == ["ok", "ok"], outcomes
    assert all(o[1] < 1e-4 for o in outcomes), outcomes
    cache = KernelCache(tmp_path)
    cfg = TinyConfig(layers=1)
    build_kernels(_pipeline_module(cfg), cache)
    assert cache.generated == 0 and cache.hits > 0
    assert not list(tmp_path.glob(".*.tmp")), "no temporary files left behind"


def _pipeline_module(cfg: TinyConfig) -> Any:
    from ad_mlir.passes.pipeline import run_pipeline

    program = import_program(export_model(build_model(cfg)))
    run_pipeline(program.module, "default")
    return program.module


def test_non_contiguous_inputs_are_read_through_their_strides() -> None:
    """A transposed, a sliced (every other column) and an expanded (stride 0) input give what
    their contiguous copies give."""

    class Mix(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
            return torch.softmax(x * 2 + y, dim=-1) * torch.sigmoid(z)

    shape = (6, 10)
    gm = ad_mlir.compile(torch.export.export(Mix(), tuple(torch.randn(shape) for _ in range(3))))
    base = torch.randn(10, 6)
    inputs = (base.t(), torch.randn(6, 20)[:, ::2], torch.randn(1, 10).expand(shape))
    assert not any(t.is_contiguous() for t in inputs)
    with torch.no_grad():
        torch.testing.assert_close(gm(*inputs)[0], gm(*(t.contiguous() for t in inputs))[0], rtol=0, atol=0)
        torch.testing.assert_close(gm(*inputs)[0], Mix()(*inputs))
