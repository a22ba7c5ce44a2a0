"""Graphs the importer cannot take fail with a message that names the node and the way out."""

from __future__ import annotations

import pytest
import torch

import ad_mlir
from ad_mlir.frontends.fx_import import ImportError_, import_program


class _WithSubmodule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).relu()


def test_call_module_graph_is_rejected_with_the_node_name() -> None:
    gm = torch.fx.symbolic_trace(_WithSubmodule())
    with pytest.raises(ImportError_, match=r"node 'lin': call_module nodes are not supported \(use torch.export"):
        import_program(gm, example_inputs=[torch.randn(2, 4)])


def test_graph_without_shapes_asks_for_example_inputs() -> None:
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    with pytest.raises(ImportError_, match="no meta\\['val'\\] shapes: pass example_inputs"):
        import_program(gm)


def test_non_graph_input_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="expected an ExportedProgram or GraphModule, got Linear"):
        import_program(torch.nn.Linear(2, 2))


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
