"""The graphs a user holds reach `ad_mlir.compile`: grad-mode and autocast regions, other
higher-order ops, torch-level GraphModules, `nn.Module`s; and the compiled graph's input checks.

Small modules, fp32, the `none` pipeline with reference kernels: the compiled graph runs the same
ATen ops as eager, so results are compared bit-exact. HF families from every source are in
tests/models/test_sources.py."""

from __future__ import annotations

import operator
import re

import pytest
import torch
from kernel_guard import graph_kernels, no_dropped_ops
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode

import ad_mlir
from ad_mlir.frontends.export import export_model
from ad_mlir.frontends.fx_import import ImportError_
from ad_mlir.frontends.graph_sources import SourceError
from ad_mlir.frontends.input_checks import InputError
from ad_mlir.runtime import kernels
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.zoo.tiny import TinyConfig, build_model, example_input_ids


class Regions(torch.nn.Module):
    """A no_grad region and a disabled autocast region: a grad-mode export wraps each in a
    higher-order op over a subgraph."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            y = torch.sin(x) * 2
        with torch.autocast("cpu", enabled=False):
            z = self.lin(y).relu()
        return z + x


class Autocast(torch.nn.Module):
    """An enabled bf16 autocast region: its casts are implicit in the graph."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            z = self.lin(x)
        return z.float() + 1


def _run(gm: torch.fx.GraphModule, *inputs: torch.Tensor) -> torch.Tensor:
    with reference_kernels(), torch.no_grad():
        return gm(*inputs)[0]


def _higher_order_ops(ep: torch.export.ExportedProgram) -> set[str]:
    return {n.target.name() for n in ep.graph.nodes if isinstance(n.target, torch._ops.HigherOrderOperator)}


def test_grad_mode_regions_are_inlined() -> None:
    torch.manual_seed(0)
    model, x = Regions(), torch.randn(2, 8)
    ep = torch.export.export(model, (x,), strict=False)
    assert _higher_order_ops(ep) == {"wrap_with_set_grad_enabled", "wrap_with_autocast"}, "the test needs both"
    for source in (ep, ep.module()):
        torch.testing.assert_close(_run(ad_mlir.compile(source, pipeline="none"), x), model(x), rtol=0, atol=0)


def test_enabled_autocast_gets_explicit_casts() -> None:
    """From an ExportedProgram (or the module) the region is retraced with its casts explicit,
    bit-exact against eager autocast; in `ep.module()` (no retrace) it is refused by name."""
    torch.manual_seed(0)
    model, x = Autocast(), torch.randn(2, 8)
    ep = torch.export.export(model, (x,), strict=False)
    assert _higher_order_ops(ep) == {"wrap_with_autocast"}
    for source, inputs in ((ep, None), (model, (x,))):
        gm = ad_mlir.compile(source, inputs, pipeline="none")
        assert any(n.target is torch.ops.aten._to_copy.default for n in gm.graph.nodes), "casts made explicit"
        torch.testing.assert_close(_run(gm, x), model(x), rtol=0, atol=0)
    with pytest.raises(ImportError_, match=r"node 'linear': an enabled autocast region \(cpu, torch.bfloat16\)"):
        ad_mlir.compile(ep.module(), pipeline="none")


def test_cond_is_refused_by_name() -> None:
    class Cond(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cond(x.sum() > 0, lambda x: x + 1, lambda x: x - 1, (x,))

    ep = torch.export.export(Cond(), (torch.randn(2, 8),), strict=False)
    with pytest.raises(ImportError_, match=r"node 'cond': higher-order op torch.ops.higher_order.cond .*rewrite"):
        ad_mlir.compile(ep, pipeline="none")


INVOKE = torch.ops.higher_order.invoke_subgraph


def test_invoke_subgraph_is_inlined() -> None:
    """AOTAutograd graphs call repeated regions (`nested_compile_region`) through
    invoke_subgraph: a function call, inlined."""
    body = make_fx(lambda x, w: (torch.sin(x) @ w,))(torch.randn(2, 8), torch.randn(8, 8))
    root = torch.nn.Module()
    root.body = body
    graph = torch.fx.Graph()
    x, w = graph.placeholder("x"), graph.placeholder("w")
    sub = graph.get_attr("body")
    first = graph.call_function(operator.getitem, (graph.call_function(INVOKE, (sub, "body", x, w)), 0))
    second = graph.call_function(operator.getitem, (graph.call_function(INVOKE, (sub, "body", first, w)), 0))
    graph.output((graph.call_function(torch.ops.aten.add.Tensor, (second, 1)),))
    gm = torch.fx.GraphModule(root, graph)
    inputs = (torch.randn(2, 8), torch.randn(8, 8))
    compiled = ad_mlir.compile(gm, inputs, pipeline="none")
    assert not any(n.target is INVOKE for n in compiled.graph.nodes)
    torch.testing.assert_close(_run(compiled, *inputs), torch.sin(torch.sin(inputs[0]) @ inputs[1]) @ inputs[1] + 1,
                               rtol=0, atol=0)


def test_torch_level_graphs_and_modules_need_example_inputs() -> None:
    """symbolic_trace's call_module/call_method graph is exported to ATen with the example
    inputs (and dynamic shapes); make_fx's ATen graph is imported as it is."""
    torch.manual_seed(0)
    model, x = Regions().eval(), torch.randn(2, 8)
    traced = torch.fx.symbolic_trace(model)
    assert {n.op for n in traced.graph.nodes} >= {"call_module", "call_method"}
    batch = torch.export.Dim("batch", min=2, max=16)
    gm = ad_mlir.compile(traced, (x,), pipeline="none", dynamic_shapes=({0: batch},))
    x5 = torch.randn(5, 8)
    torch.testing.assert_close(_run(gm, x5), model(x5), rtol=0, atol=0)
    fx_aten = make_fx(model)(x)
    torch.testing.assert_close(_run(ad_mlir.compile(fx_aten, (x,), pipeline="none"), x), model(x), rtol=0, atol=0)
    with pytest.raises(SourceError, match="nn.Module Regions is exported with torch.export before compiling: pass example_inputs"):
        ad_mlir.compile(model, pipeline="none")
    with pytest.raises(SourceError, match="torch-level GraphModule"):
        ad_mlir.compile(traced, pipeline="none")


# ------------------------------------------------------------------------------------ input checks


@pytest.fixture(scope="module")
def compiled() -> tuple[torch.fx.GraphModule, torch.Tensor]:
    """A one-layer Llama through the default pipeline (its kernels are what must not run),
    exported with the sequence dynamic in [2, 4096]."""
    cfg = TinyConfig(layers=1)
    with no_dropped_ops():  # every op got its kernel, none was left as torch calls
        gm = ad_mlir.compile(export_model(build_model(cfg)))
    graph_kernels(gm)  # the graph must hold kernels, and no reference op
    return gm, example_input_ids(cfg, 8)


@pytest.mark.parametrize("path", ["reference", "interpreter"])
def test_the_compiled_graph_exports_and_compiles_with_inductor(
    path: str, compiled: tuple[torch.fx.GraphModule, torch.Tensor]
) -> None:
    """The compiled graph is a graph of torch ops, its kernels `torch.ops.ad_mlir.*`: torch.export
    takes it as it is, and Inductor compiles the rest around the kernels, whose outputs must have
    the layout their fakes give (Inductor checks it; the reference attention's transposed rows
    failed that)."""
    gm, ids = compiled
    with reference_kernels() if path == "reference" else torch.no_grad(), torch.no_grad():
        expected = gm(ids)[0]
        ep = torch.export.export(gm, (ids,), strict=False)
        assert any(str(n.target).startswith("ad_mlir.") for n in ep.graph.nodes)
        torch.testing.assert_close(ep.module()(ids)[0], expected, rtol=0, atol=0)
        torch._dynamo.reset()
        got = torch.compile(gm)(ids)[0]
        torch._dynamo.reset()
    torch.testing.assert_close(got, expected)  # fp32: Inductor may reorder the sums of the ops it fuses


@pytest.fixture
def no_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any kernel of ours that starts fails the test."""

    def ran(*args: object) -> None:
        raise AssertionError("a kernel ran")

    monkeypatch.setattr(kernels.RegionKernel, "run", ran)


BAD_INPUTS = {
    "count": (lambda ids: (ids, ids), r"expected 1 inputs \(input_ids\), got 2"),
    "dtype": (lambda ids: (ids.int(),), r"input 'input_ids': expected torch.int64 tensor .*, got dtype torch.int32"),
    "device": (lambda ids: (ids.to("meta"),), r"input 'input_ids': expected .* on cpu, got a tensor on meta"),
    "rank": (lambda ids: (ids[0],), r"input 'input_ids': .*got rank 1 \(shape \[8\]\)"),
    "static size": (lambda ids: (ids.expand(2, 8),), r"got shape \[2, 8\]: dim 0 is 2, compiled for 1"),
    "dynamic range": (lambda ids: (ids.new_zeros(1, 4097),), r"dim 1 of size 4097, outside the compiled range s\d+ in \[0, 4096\]"),
    "not a tensor": (lambda ids: (ids.tolist(),), r"input 'input_ids': expected .*, got a list"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_wrong_input_raises_before_any_kernel(compiled, no_kernel, case: str) -> None:  # noqa: ANN001
    gm, ids = compiled
    make, message = BAD_INPUTS[case]
    with pytest.raises(InputError, match=message):
        gm(*make(ids))


def test_the_kernel_guard_would_see_a_missing_check(compiled, no_kernel) -> None:  # noqa: ANN001
    """Without the check, a wrong dtype reaches a kernel: the guard above can fail."""
    gm, ids = compiled
    with pytest.raises(AssertionError, match="a kernel ran"):
        gm.forward(ids.int())


def test_right_inputs_run_positionally_and_by_name(compiled) -> None:  # noqa: ANN001
    gm, ids = compiled
    with reference_kernels(), torch.no_grad():
        torch.testing.assert_close(gm(input_ids=ids)[0], gm(ids)[0], rtol=0, atol=0)
        assert gm(ids[:, :1])[0].shape[1] == 1, "sizes 0/1 pass, as in torch.export's own guards"
    with pytest.raises(InputError, match="unexpected input"):
        gm(ids=ids)


def test_dims_of_one_symbol_must_agree() -> None:
    """Sizes are compared by value: equal sizes above 256 (not Python's cached small ints, so
    two tensors' sizes are two int objects) agree."""
    class Two(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x * y

    seq = torch.export.Dim("seq", min=2, max=1024)
    gm = ad_mlir.compile(Two(), (torch.randn(1, 4), torch.randn(1, 4)), pipeline="none",
                         dynamic_shapes=({1: seq}, {1: seq}))
    with pytest.raises(InputError, match=r"input 'y': .*dim 1 of size 5, but 'x' dim 1 \(the same symbol s\d+\) is 6"):
        gm(torch.randn(1, 6), torch.randn(1, 5))
    x, y = torch.randn(1, 300), torch.randn(1, 300)
    assert x.shape[1] is not y.shape[1]
    torch.testing.assert_close(gm(x, y)[0], x * y)


def test_check_reads_no_tensor_values(compiled) -> None:  # noqa: ANN001
    """The check reads sizes, dtypes and devices only: it dispatches no tensor op (reading a
    value, e.g. `.item()` or a min/max of the ids, would be one, and would sync on CUDA)."""
    gm, ids = compiled
    dispatched: list[str] = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            dispatched.append(str(func))
            return func(*args, **(kwargs or {}))

    with Recorder():
        ids.max()  # the recorder sees a value read
        assert dispatched, "the recorder records dispatched ops"
        dispatched.clear()
        gm.input_checks.check((ids,))
    assert not dispatched, f"the input check ran tensor ops: {dispatched}"


def test_graph_module_called_as_a_module_is_inlined_with_its_weights() -> None:
    """A partition called through call_module (as `split_module` makes them), holding its own
    parameter: inlined, the parameter a weight named by its path."""
    torch.manual_seed(0)
    x = torch.randn(2, 8)
    inner = make_fx(torch.nn.Linear(8, 8))(x)
    root = torch.nn.Module()
    root.part = inner
    graph = torch.fx.Graph()
    placeholder = graph.placeholder("x")
    placeholder.meta["val"] = x
    call = graph.call_module("part", (placeholder,))
    call.meta["val"] = inner(x)
    relu = graph.call_function(torch.ops.aten.relu.default, (call,))
    relu.meta["val"] = inner(x).relu()
    graph.output((relu,))
    outer = torch.fx.GraphModule(root, graph)
    gm = ad_mlir.compile(outer, pipeline="none")
    weights = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    assert weights and all(w.startswith("part.") for w in weights), weights
    torch.testing.assert_close(_run(gm, x), outer(x)[0], rtol=0, atol=0)


@pytest.mark.parametrize(("dim", "ok", "bad", "message"), [
    (torch.export.Dim("seq"), 100_000, None, r"s\d+ in \[0, inf\]"),
    (torch.export.Dim("seq", min=3, max=10), 10, 2, r"dim 1 of size 2, outside the compiled range s\d+ in \[3, 10\]"),
])
def test_dynamic_bounds_follow_the_export(dim: torch.export.Dim, ok: int, bad: int | None, message: str) -> None:
    """An unbounded dim (torch's int_oo) accepts any size; a lower bound above 2 is checked."""
    class Double(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    gm = ad_mlir.compile(Double(), (torch.randn(1, 4),), pipeline="none", dynamic_shapes=({1: dim},))
    assert gm(torch.randn(1, ok))[0].shape == (1, ok)
    if bad is None:
        assert re.search(message, gm.input_checks.specs[0].describe())
    else:
        with pytest.raises(InputError, match=message):
            gm(torch.randn(1, bad))
