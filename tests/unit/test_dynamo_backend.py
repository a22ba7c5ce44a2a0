"""`torch.compile(backend="ad_mlir")` (ad_mlir/dynamo_backend.py): HF models equal to eager, graph
breaks, dynamic sequence lengths without recompiles, eager fallback with one warning, gradients.

fp32 logits within torch.testing's defaults (rtol 1.3e-6, atol 1e-5): the kernels compute in
fp32 like eager and only reorder sums. Kernels run as their torch reference except in the one
interpreter test (the Triton kernels themselves are covered by the model tests)."""

from __future__ import annotations

import collections
import functools
import re
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch._dynamo
from kernel_guard import graph_kernels, kernel_calls, kernels_ran
from torch._dynamo.testing import CompileCounterWithBackend

import ad_mlir.dynamo_backend
from ad_mlir.compiler import compile_program
from ad_mlir.dialects import ad
from ad_mlir.dynamo_backend import EagerFallbackWarning, ad_mlir_backend
from ad_mlir.frontends.fx_import import ImportedProgram
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.zoo.small import small_model
from ad_mlir.zoo.tiny import FAMILIES, TinyConfig, build_model

MOE_FAMILIES = ("mixtral", "qwen2_moe")
MORE_FAMILIES = ("qwen3", "phi3", "olmo2", "starcoder2", "gpt_neox", "falcon", "gpt2")
"""Built from their configs (ad_mlir/zoo/small.py): QK-norm, fused QKV, post-norms, LayerNorm + GELU."""


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()  # compiled frames of one test must not serve another's


@pytest.fixture
def compiled_graphs(monkeypatch: pytest.MonkeyPatch) -> list[torch.fx.GraphModule]:
    """The ATen graphs that `ad_mlir.compile` compiled through the backend, in order (a graph
    is counted once compiled, not when it arrives: one whose compile fails is not in the list);
    each compiled graph is checked to call generated kernels of ours."""
    seen: list[torch.fx.GraphModule] = []
    real = ad_mlir.dynamo_backend.compile

    def spy(gm: torch.fx.GraphModule, *args: Any, **kwargs: Any) -> torch.fx.GraphModule:
        compiled = real(gm, *args, **kwargs)
        if kwargs["options"].pipeline != "none":  # the backend passes its BackendOptions
            assert kernel_calls(compiled), "the compiled graph calls no kernel of ours"
        seen.append(gm)
        return compiled

    monkeypatch.setattr(ad_mlir.dynamo_backend, "compile", spy)
    return seen


def _ids(seq: int, vocab: int = 128) -> torch.Tensor:
    return torch.randint(0, vocab, (1, seq), generator=torch.Generator().manual_seed(seq))


def _logits_error(model: torch.nn.Module, ids: torch.Tensor, options: dict[str, Any] | None = None) -> float:
    """Compile `model` with the backend (no eager fallback: a failure raises), compare its
    logits with eager's, return the max error."""
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        compiled = torch.compile(model, backend="ad_mlir", options={**(options or {}), "fallback": False})
        got = compiled(input_ids=ids).logits
    torch.testing.assert_close(got, expected)
    return (got - expected).abs().max().item()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_builtin_family_equals_eager(family: str, compiled_graphs: list[torch.fx.GraphModule]) -> None:
    with reference_kernels():
        error = _logits_error(build_model(TinyConfig(family=family)), _ids(9))
    assert len(compiled_graphs) == 1, "one graph, no break, compiled by ad-mlir (not the eager fallback)"
    print(f"{family}: max |error| {error:.3g}")


@pytest.mark.parametrize("family", MORE_FAMILIES)
def test_family_from_config_equals_eager(family: str, compiled_graphs: list[torch.fx.GraphModule]) -> None:
    model = small_model(family, layers=1)
    with reference_kernels():
        error = _logits_error(model, _ids(9, model.config.vocab_size))
    assert len(compiled_graphs) == 1
    print(f"{family}: max |error| {error:.3g}")


def _llm_ops(program: ImportedProgram) -> collections.Counter[str]:
    """The LLM-level ops of a compiled program: kernel ops (norms, RoPE, attention, MoE, ...),
    linears and attentions."""
    return collections.Counter(op.name for op in program.module.walk()
                               if isinstance(op, ad.KernelOp | ad.LinearOp | ad.AttentionOp))


@pytest.fixture
def programs(monkeypatch: pytest.MonkeyPatch) -> list[ImportedProgram]:
    """The programs the backend's compiles made (the pipeline's result: its ops), in order."""
    made: list[ImportedProgram] = []

    def keep(gm: torch.fx.GraphModule, *args: Any, **kwargs: Any) -> torch.fx.GraphModule:
        compiled, program = compile_program(gm, *args, **kwargs)
        made.append(program)
        return compiled

    monkeypatch.setattr(ad_mlir.dynamo_backend, "compile", keep)
    return made


@pytest.mark.parametrize("family", (*sorted(FAMILIES), *MORE_FAMILIES, *MOE_FAMILIES))
def test_torch_compile_gets_the_llm_ops_torch_export_gets(family: str, programs: list[ImportedProgram]) -> None:
    """The same model through Dynamo/AOTAutograd and through torch.export makes the same fused
    program (AOTAutograd leaves linears as t + mm/addmm, SDPA as a backend op or, Falcon's,
    written out around _safe_softmax, an MoE block's gate/up chunk as a split and its index_put_
    functional; canonicalize and match-moe take them), and the compiled model equals eager."""
    model = build_model(TinyConfig(family=family, layers=1)) if family in FAMILIES else small_model(family, layers=1)
    ids = _ids(9, model.config.vocab_size)
    with torch.no_grad(), reference_kernels():
        got = torch.compile(model, backend="ad_mlir", options={"fallback": False})(input_ids=ids).logits
        torch.testing.assert_close(got, model(input_ids=ids).logits)  # fp32: torch's default tolerance
    exported = compile_program(torch.export.export(model, (), {"input_ids": ids}))[1]
    assert len(programs) == 1
    through_export = _llm_ops(exported)
    assert {"ad.linear"} < set(through_export), through_export  # the comparison covers fused ops
    assert _llm_ops(programs[0]) == through_export


@pytest.mark.parametrize("kv_heads, gqa", [(1, False), (2, True)])
def test_sdpa_backends_compile_to_an_attention_op(kv_heads: int, gqa: bool, programs: list[ImportedProgram]) -> None:
    """SDPA as AOTAutograd hands it over compiles to one ad.attention (canonicalize): one
    key/value head broadcast over four query heads (Falcon's), which no fused CPU backend takes,
    written out as torch's math backend around `aten._safe_softmax`; two heads with
    `enable_gqa`, the CPU flash op taking the grouped heads as they are. A query row whose every
    key is masked gives 0 as eager does, not NaN (the attention kernels store 0 there too:
    test_attention_kernel.py). fp32 at torch's default tolerance."""
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)

    q, k, v = (torch.randn(shape, generator=torch.Generator().manual_seed(i))
               for i, shape in enumerate([(1, 4, 5, 8), (1, kv_heads, 5, 8), (1, kv_heads, 5, 8)]))
    mask = torch.ones(1, 1, 5, 5, dtype=torch.bool).tril()
    mask[..., 2, :] = False
    with torch.no_grad():
        got = torch.compile(attend, backend="ad_mlir", options={"fallback": False})(q, k, v, mask)
    expected = attend(q, k, v, mask)
    torch.testing.assert_close(got, expected)
    assert torch.equal(got[..., 2, :], torch.zeros(1, 4, 8)) and torch.equal(expected[..., 2, :], got[..., 2, :])
    assert _llm_ops(programs[0]) == {"ad.attention": 1}, _llm_ops(programs[0])


def test_kernels_in_the_triton_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real Triton kernels (interpreted on CPU), checked numerically by `verify` when
    compiling and run again with nothing but kernels (`kernel_guard`), and the `none` pipeline
    (imported and exported back, nothing fused) bit-exact."""
    model, ids = build_model(TinyConfig(family="llama", layers=1)), _ids(7)
    made: list[torch.fx.GraphModule] = []
    real = ad_mlir.dynamo_backend.compile
    monkeypatch.setattr(ad_mlir.dynamo_backend, "compile", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    options = {"pipeline": "default", "verify": True, "fallback": False}
    compiled = torch.compile(model, backend="ad_mlir", options=options)
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        compiled(input_ids=ids)
        assert len(made) == 1
        graph_kernels(made[0])
        with kernels_ran(monkeypatch):
            torch.testing.assert_close(compiled(input_ids=ids).logits, expected)
    torch._dynamo.reset()
    with torch.no_grad():
        options = {"pipeline": "none", "fallback": False}
        got = torch.compile(model, backend="ad_mlir", options=options)(input_ids=ids).logits
        assert torch.equal(got, model(input_ids=ids).logits)


def test_graph_break_compiles_both_parts(compiled_graphs: list[torch.fx.GraphModule]) -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.silu(x @ w) * 2.0
        torch._dynamo.graph_break()
        return torch.softmax(y, -1) + 1.0

    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with torch.no_grad(), reference_kernels():
        compiled = torch.compile(f, backend="ad_mlir", options={"fallback": False})
        torch.testing.assert_close(compiled(x, w), f(x, w))
    targets = [{str(n.target) for n in gm.graph.nodes} for gm in compiled_graphs]
    assert len(targets) == 2, "each side of the break reaches ad_mlir.compile"
    assert "aten.silu.default" in targets[0] and "aten._softmax.default" in targets[1]


def test_dynamic_sequence_length_compiles_once(compiled_graphs: list[torch.fx.GraphModule]) -> None:
    model = build_model(TinyConfig(family="qwen2", layers=1))
    counter = CompileCounterWithBackend(functools.partial(ad_mlir_backend, options={"fallback": False}))
    compiled = torch.compile(model, backend=counter)
    with torch.no_grad(), reference_kernels():
        for seq in (5, 8, 13, 21):
            ids = _ids(seq)
            torch._dynamo.mark_dynamic(ids, 1)
            torch.testing.assert_close(compiled(input_ids=ids).logits, model(input_ids=ids).logits)
    assert counter.frame_count == 1, f"{counter.frame_count} Dynamo compiles for 4 sequence lengths"
    assert len(compiled_graphs) == 1, "one ad-mlir compile serves every length"
    symbolic = [n for n in compiled_graphs[0].graph.nodes if n.op == "placeholder"
                and isinstance(n.meta["val"], torch.SymInt)]
    assert symbolic, "the sequence length reaches the compiled graph as a SymInt input"


@pytest.mark.parametrize("freeze", [True, False])
def test_weights_frozen_or_graph_inputs(freeze: bool, compiled_graphs: list[torch.fx.GraphModule]) -> None:
    """Frozen (the default), the parameters and buffers Dynamo lifts are weights of the graph
    (named by module path, as torch.export names them), and only input_ids is an input; else
    every one is an input."""
    model = build_model(TinyConfig(family="llama", layers=1))
    with reference_kernels():
        _logits_error(model, _ids(6), {"freeze_weights": freeze})
    nodes = compiled_graphs[0].graph.nodes
    weights = {n.target for n in nodes if n.op == "get_attr"}
    inputs = [n for n in nodes if n.op == "placeholder"]
    parameters = {name for name, _ in model.named_parameters()}
    buffers = {name for name, _ in model.named_buffers()}  # Dynamo lifts those used
    if freeze:
        assert len(inputs) == 1 and parameters <= weights <= parameters | buffers, weights
    else:
        assert len(parameters) < len(inputs) <= 1 + len(parameters | buffers) and not weights


@pytest.mark.parametrize("family", ["llama", "phi3", "mixtral"])
def test_weights_kept_inputs_follow_changes_in_place(family: str, compiled_graphs: list[torch.fx.GraphModule]) -> None:
    """With `freeze_weights=False` the weights stay graph inputs and nothing computed from them
    is folded at compile time (fuse-gemms does not concatenate inputs: Llama keeps its 8
    linears, against 5 frozen): after every parameter is scaled in place (by 1 to 1.5), the
    compiled model gives eager's new logits without recompiling, Phi-3's fused projections and
    Mixtral's experts included. (Frozen, a weight a rewrite copied keeps its old value: the docs
    say `torch._dynamo.reset()` after such a change.)"""
    model = build_model(TinyConfig(family="llama", layers=2)) if family == "llama" else small_model(family, layers=2)
    ids = _ids(7, model.config.vocab_size)
    compiled = torch.compile(model, backend="ad_mlir", options={"freeze_weights": False, "fallback": False})
    with torch.no_grad(), reference_kernels():
        before = compiled(input_ids=ids).logits
        generator = torch.Generator().manual_seed(1)
        for parameter in model.parameters():
            parameter.mul_(1 + 0.5 * torch.rand(parameter.shape, generator=generator))
        after, got = model(input_ids=ids).logits, compiled(input_ids=ids).logits
    assert (after - before).abs().max() > 0.05, "the change must move the logits"
    torch.testing.assert_close(got, after)
    assert len(compiled_graphs) == 1, "one ad-mlir compile, no recompile, no eager fallback"


def _cond(x: torch.Tensor) -> torch.Tensor:
    """A data-dependent branch: Dynamo keeps it as a `cond` higher-order op in the ATen graph,
    which ad-mlir does not take (its branches are subgraphs, not tensors)."""
    return torch.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,)) * 2.0


UNSUPPORTED_COND = r"\bcond\b|true_graph_0"
"""The importer's error names the `cond` node or its branch subgraph."""


def test_unsupported_graph_runs_eager_with_one_warning() -> None:
    x = torch.randn(4, 8)
    compiled = torch.compile(_cond, backend="ad_mlir")
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for inp in (x.abs(), -x.abs(), x):
            torch.testing.assert_close(compiled(inp), _cond(inp), rtol=0, atol=0)
    fallbacks = [w for w in caught if issubclass(w.category, EagerFallbackWarning)]
    assert len(fallbacks) == 1, [str(w.message) for w in fallbacks]
    message = str(fallbacks[0].message)
    assert "could not compile" in message and re.search(UNSUPPORTED_COND, message), message


def test_unsupported_graph_raises_without_fallback() -> None:
    compiled = torch.compile(_cond, backend="ad_mlir", options={"fallback": False})
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match=UNSUPPORTED_COND), torch.no_grad():
        compiled(torch.randn(4, 8))


def test_graph_needing_gradients_runs_eager(compiled_graphs: list[torch.fx.GraphModule]) -> None:
    """Documented choice: training graphs run eagerly (with the warning); gradients are eager's."""
    linear = torch.nn.Linear(8, 8)
    x = torch.randn(2, 8)
    with pytest.warns(EagerFallbackWarning, match="needs gradients"):
        out = torch.compile(linear, backend="ad_mlir")(x)
    out.square().sum().backward()
    got = linear.weight.grad.clone()
    linear.weight.grad = None
    linear(x).square().sum().backward()
    torch.testing.assert_close(got, linear.weight.grad, rtol=0, atol=0)
    assert not compiled_graphs


@pytest.mark.parametrize("options, match", [({"pipelin": "none"}, "unknown BackendOptions option"),
                                             ({"pipeline": "no-such-pass"}, "no-such-pass")])
def test_bad_options_are_named(options: dict[str, Any], match: str) -> None:
    run: Callable[[torch.Tensor], torch.Tensor] = torch.compile(
        lambda x: x * 2.0, backend="ad_mlir", options={**options, "fallback": False})
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match=match), torch.no_grad():
        run(torch.randn(3))


def test_registered_under_its_name() -> None:
    assert "ad_mlir" in torch._dynamo.list_backends()


def test_hf_generate_with_a_static_cache_on_a_compiled_forward_gives_hf_tokens(
        compiled_graphs: list[torch.fx.GraphModule]) -> None:
    """HF's own generation loop over `torch.compile(model.forward, backend="ad_mlir")` with
    HF's static cache (the cache tensors are graph inputs written in place: AOTAutograd returns
    the new values and writes them back): a prefill graph and a decode graph, HF's greedy tokens.
    Wide weights, so the tokens vary and a decode that lost the cache would show."""
    model = build_model(TinyConfig(family="llama", layers=2, hf_overrides=(("initializer_range", 0.5),)))
    ids = torch.tensor([[5, 9, 13, 3, 7, 40, 41]])
    generate = {"max_new_tokens": 8, "do_sample": False, "cache_implementation": "static", "use_cache": True}
    with torch.no_grad():
        expected = model.generate(ids, **generate)[0, ids.shape[1]:].tolist()
    assert len(set(expected)) > 4, expected
    model.forward = torch.compile(model.forward, backend="ad_mlir", options={"fallback": False})
    with torch.no_grad(), reference_kernels():
        got = model.generate(ids, **generate)[0, ids.shape[1]:].tolist()
    assert got == expected
    assert len(compiled_graphs) >= 2, "prefill and decode compiled by ad-mlir"
