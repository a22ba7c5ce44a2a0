"""Compiling once per distinct decoder layer (`passes/repeated_layers.py`, `CompileOptions.layers_once`)
gives the program the whole-program compile gives: the same `ad` ops, operands, weights and
locations for every layer (the module's text, value names aside), and the same outputs. Families:
a Llama (period 1), Gemma2's sliding/global alternation (period 2), LFM2 with convolution and
attention layers (a hybrid, period 2) and Mixtral (MoE), each deep enough that layers are
instantiated; a model whose layers do not repeat falls back to the whole program. Under
`ad_mlir.LLM` (`insert-cached-attention` adds caches per layer), slot and paged, the lengthened
program has the whole compile's cache arguments too, named, marked and ordered alike."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest
import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, ModuleOp, StringAttr, TensorType, f32
from xdsl.printer import Printer

import ad_mlir
from ad_mlir.codegen.cache import KernelCache
from ad_mlir.compiler import compile_program
from ad_mlir.dialects import ad
from ad_mlir.frontends.export import export_with_ids
from ad_mlir.frontends.fx_import import import_program
from ad_mlir.llm.cache_export import cache_arguments, export_for_cache
from ad_mlir.llm.pipelines import cached_pipeline
from ad_mlir.passes.pipeline import run_pipeline
from ad_mlir.passes.repeated_layers import (
    NotRepeating,
    _Arguments,
    layer_of,
    lengthen,
    period,
    renamed,
    shorten,
)
from ad_mlir.runtime.program_cache import PROGRAM_CACHE_VARIABLE
from ad_mlir.zoo.small import model_from_config, small_config

LOGGER = "ad_mlir.compiler"


def _text(module: ModuleOp) -> str:
    """The module with locations, its values numbered in order (their names are hints only)."""
    module = module.clone()
    for op in module.walk():
        for value in [*op.results, *(a for r in op.regions for b in r.blocks for a in b.args)]:
            value.name_hint = None
    out = io.StringIO()
    Printer(stream=out, print_generic_format=True, print_debuginfo=True).print_op(module)
    return out.getvalue()


def _model(family: str, layers: int, **overrides: object) -> torch.nn.Module:
    return model_from_config(small_config(family, layers=layers, hidden_size=64, overrides=overrides)).eval()


def _both(model: torch.nn.Module, caplog: pytest.LogCaptureFixture) -> tuple[str, str, str]:
    """The compiled program's text once per layer and whole, and what the first compile logged;
    the two graphs' outputs on the same tokens must be equal (the same ops on the same weights)."""
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    exported = export_with_ids(model, ids)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        once, once_program = compile_program(exported, layers_once=True)
    said = " ".join(r.getMessage() for r in caplog.records if r.name == LOGGER)
    whole, whole_program = compile_program(exported, layers_once=False)
    with torch.no_grad():
        got, expected, eager = once(ids)[0], whole(ids)[0], model(input_ids=ids).logits
    assert torch.equal(got, expected)
    # fp32 on the reference path: only the fused ops' order of summation differs from eager
    torch.testing.assert_close(got, eager, rtol=1e-4, atol=1e-4)
    return _text(once_program.module), _text(whole_program.module), said


@pytest.mark.parametrize(("family", "layers", "period", "overrides"), [
    ("llama", 6, 1, {}),
    ("gemma2", 12, 2, {}),
    ("lfm2", 12, 2, {"layer_types": ["conv", "full_attention"] * 6}),
    ("mixtral", 6, 1, {}),
])
def test_layers_compiled_once_give_the_whole_programs_ops(
    family: str, layers: int, period: int, overrides: dict, caplog: pytest.LogCaptureFixture
) -> None:
    once, whole, said = _both(_model(family, layers, **overrides), caplog)
    kept = 5 * period + layers % period
    assert f"{layers} layers of period {period}, compiled {kept} and instantiated the other {layers - kept}" in said
    assert once == whole
    assert f'loc("model.layers.{layers - 1}.' in once


def _through_torch_compile(model: torch.nn.Module, ids: torch.Tensor, monkeypatch: pytest.MonkeyPatch,
                           caplog: pytest.LogCaptureFixture) -> tuple[str, str, bool]:
    """`model` through `torch.compile(backend="ad_mlir")`, its one graph compiled once per layer
    and whole (`layers_once=False`): what the compile logged, the program's text (the same both
    ways), and whether the graph called a subgraph (`invoke_subgraph`); the outputs must equal
    the whole compile's and eager's."""
    import dataclasses

    import torch._dynamo

    import ad_mlir.dynamo_backend

    whole: list[tuple[torch.fx.GraphModule, object]] = []
    once: list[object] = []
    invoked: list[bool] = []

    def both(gm: torch.fx.GraphModule, example_inputs: list, options: object) -> torch.fx.GraphModule:
        invoked.append(any(n.target is torch.ops.higher_order.invoke_subgraph for n in gm.graph.nodes))
        with caplog.at_level(logging.INFO, logger=LOGGER):
            compiled, program = compile_program(gm, example_inputs, options=options)
        once.append(program)
        whole.append(compile_program(gm, example_inputs, options=dataclasses.replace(options, layers_once=False)))
        return compiled

    monkeypatch.setattr(ad_mlir.dynamo_backend, "compile", both)
    torch._dynamo.reset()
    caplog.clear()
    with torch.no_grad():
        got = torch.compile(model, backend="ad_mlir", options={"fallback": False})(input_ids=ids).logits
        expected = whole[0][0](ids)[0]
        eager = model(input_ids=ids).logits
    torch._dynamo.reset()
    assert len(once) == 1 and _text(once[0].module) == _text(whole[0][1].module)
    assert torch.equal(got, expected)
    torch.testing.assert_close(got, eager, rtol=1e-4, atol=1e-4)  # fp32, reference path: as in `_both`
    return " ".join(r.getMessage() for r in caplog.records if r.name == LOGGER), _text(once[0].module), invoked[0]


def test_layers_compiled_once_through_torch_compile(monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Through `torch.compile(backend="ad_mlir")` the layers are found as through torch.export:
    the ops' module paths (Dynamo's, made relative to the model) and the weights' names (their
    module paths, from Dynamo's sources) name the layers. The graph the backend compiles gives
    the whole compile's program (`layers_once=False`, the same graph) and outputs. With the
    decoder layer marked `torch.compiler.nested_compile_region` Dynamo traces one layer and
    every layer calls that trace (`invoke_subgraph`): inlined, each call's ops are renamed into
    its layer, and the program is the unmarked model's, location for location."""
    model, ids = _model("llama", 6), torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    said, plain, invoked = _through_torch_compile(model, ids, monkeypatch, caplog)
    assert "6 layers of period 1, compiled 5 and instantiated the other 1" in said, said
    assert 'loc("model.layers.5.' in plain and not invoked
    layer = type(model.model.layers[0])
    monkeypatch.setattr(layer, "forward", torch.compiler.nested_compile_region(layer.forward))
    said, marked, invoked = _through_torch_compile(model, ids, monkeypatch, caplog)
    assert invoked, "Dynamo called the marked layers through invoke_subgraph"
    assert "6 layers of period 1, compiled 5 and instantiated the other 1" in said, said
    assert marked == plain


def test_the_program_cache_keeps_the_shortened_program_and_lengthens_what_it_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The first compile stores the compiled shortened program, the second reads it (the
    pipeline skipped) and lengthens it to the whole compile's program and outputs."""
    monkeypatch.setenv(PROGRAM_CACHE_VARIABLE, "1")
    model, ids = _model("llama", 6), torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    exported = export_with_ids(model, ids)
    first = compile_program(exported, cache=KernelCache(tmp_path))[1]
    with caplog.at_level(logging.INFO):
        second, program = compile_program(exported, cache=KernelCache(tmp_path))
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "the pass pipeline skipped" in said and "6 layers of period 1, compiled 5" in said
    assert len(list((tmp_path / "programs").glob("*.mlir"))) == 1
    monkeypatch.setenv(PROGRAM_CACHE_VARIABLE, "0")
    whole, whole_program = compile_program(exported, layers_once=False)
    assert _text(program.module) == _text(first.module) == _text(whole_program.module)
    with torch.no_grad():
        assert torch.equal(second(ids)[0], whole(ids)[0])


def test_layers_that_do_not_repeat_are_compiled_whole(caplog: pytest.LogCaptureFixture) -> None:
    types = ["conv", "full_attention", "conv", "conv", "full_attention", "conv"]
    once, whole, said = _both(_model("lfm2", len(types), layer_types=types), caplog)
    assert "compiling the whole program (the 6 layers do not repeat 6 times or more)" in said
    assert once == whole


def test_layer_names_are_renamed_in_their_stack_only() -> None:
    assert layer_of("model.layers.12.mlp.experts.3.w1") == ("model.layers", 12)
    assert layer_of("lm_head.weight") is None
    assert renamed("model.layers.12.mlp.experts.3.w1", "model.layers", lambda i: i + 9) == "model.layers.21.mlp.experts.3.w1"
    assert renamed("transformer.h.2.attn", "model.layers", lambda i: i + 9) == "transformer.h.2.attn"


def test_verify_compiles_the_whole_program_so_every_pass_is_checked_on_every_layer(
    caplog: pytest.LogCaptureFixture
) -> None:
    """One pass (numeric checks of the default pipeline on six layers take long) suffices: the
    program's layers repeat, yet it is not shortened."""
    model, ids = _model("llama", 6), torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with caplog.at_level(logging.INFO, logger=LOGGER):
        compiled = compile_program(export_with_ids(model, ids), verify=True, pipeline="fuse-silu-mul")[0]
    assert not [r for r in caplog.records if "repeated layers" in r.getMessage()]
    with torch.no_grad():  # fp32, reference path: as in `_both`
        torch.testing.assert_close(compiled(ids)[0], model(input_ids=ids).logits, rtol=1e-4, atol=1e-4)


LLM_CASES = [
    ("llama", 7, 1, {}),
    ("gemma2", 12, 2, {}),
    ("lfm2", 13, 2, {"layer_types": ["conv", "full_attention"] * 6 + ["conv"]}),  # the N mod P = 1 layer kept too
]


@pytest.mark.parametrize("paged", [False, True], ids=["slot", "paged"])
@pytest.mark.parametrize(("family", "layers", "period", "overrides"), LLM_CASES, ids=[c[0] for c in LLM_CASES])
def test_llm_compiles_once_per_layer_with_the_whole_programs_caches(
    family: str, layers: int, period: int, overrides: dict, paged: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The caches `insert-cached-attention` adds per layer (K/V, LFM2's convolution states;
    Gemma2's sliding layers' window) come out of lengthening as the whole compile makes them:
    the printed programs, arguments and their `ad.cache` / `ad.input` attributes included, are
    equal (the kernels of the copies are group 3's, as `test_layers_compiled_once_give_the_whole_programs_ops`
    checks by the outputs; a generation would only add the engine's time)."""
    model = _model(family, layers, **overrides)
    form = {"page_size": 16} if paged else {}
    with caplog.at_level(logging.INFO, logger=LOGGER):
        once = ad_mlir.LLM(model, max_batch=2, max_seq_len=32, **form)
    said = " ".join(r.getMessage() for r in caplog.records if r.name == LOGGER)
    whole = ad_mlir.LLM(model, max_batch=2, max_seq_len=32, layers_once=False, **form)
    kept = 5 * period + layers % period
    assert f"{layers} layers of period {period}, compiled {kept} and instantiated the other {layers - kept}" in said
    assert _text(once.program.module) == _text(whole.program.module)
    assert f"model.layers.{layers - 1}." in " ".join(c.layer for c in cache_arguments(once.program.function))


def test_cache_arguments_counted_otherwise_are_not_lengthened() -> None:
    """A shortened program whose cache arguments do not count on alike from layer to layer (one
    renamed) is left as it is: NotRepeating, so the whole program is compiled."""
    model = _model("llama", 7)
    program = import_program(export_for_cache(model, 2, 32))
    layout, p = period(program.function)
    module = shorten(program.function, layout, p)
    run_pipeline(module, cached_pipeline("default", 2, 32))
    fn = next(iter(module.ops))
    attrs = list(fn.arg_attrs.data)
    at = next(i for i, a in enumerate(attrs) if a.data.get(ad.INPUT_ATTR) == StringAttr("v_cache_4"))
    attrs[at] = DictionaryAttr(attrs[at].data | {ad.INPUT_ATTR: StringAttr("v_cache_9")})
    fn.arg_attrs = type(fn.arg_attrs)(attrs)
    before = _text(module)
    with pytest.raises(NotRepeating, match=r"the arguments v_cache_<i> are not counted alike in every group of 1 layers"):
        lengthen(module, 7, p, lambda old, new: None)
    assert _text(module) == before


def _cache_arguments(layers: int) -> func.FuncOp:
    """A function of one K cache argument per layer, named and marked as insert-cached-attention does."""
    fn = func.FuncOp("f", ([TensorType(f32, [2, 8])] * layers, []))
    fn.arg_attrs = ArrayAttr([DictionaryAttr({ad.INPUT_ATTR: StringAttr(f"k_cache_{i}"),
                                              ad.CACHE_ATTR: StringAttr(f"model.layers.{i}.self_attn key")})
                              for i in range(layers)])
    return fn


@pytest.mark.parametrize(("p", "outside"), [(1, 2), (2, 5), (2, 8)])
def test_a_template_reading_another_groups_arguments_is_not_lengthened(p: int, outside: int) -> None:
    """Group 3 (layers 3p to 4p - 1), which the copies are made of, may read its own layers'
    arguments only: a copy could not read what another group's layer reads (an earlier group's
    or the last group's, which stands for the model's last layers)."""
    fn = _cache_arguments(5 * p)
    arguments = _Arguments(fn, "model.layers", p, copies=1)
    args = fn.body.block.args
    arguments.check_reads(args[3 * p:4 * p])
    with pytest.raises(NotRepeating, match=rf"layers? {3 * p}\S* read the argument k_cache_{outside} of layer {outside}"):
        arguments.check_reads([args[3 * p], args[outside]])
