"""Every family compiles from every graph a user may hold, equal to eager.

Sources: the ExportedProgram (under no_grad, `export_model`), `ep.module()`, an export taken in
grad mode (plain `torch.export.export`, how most people call it), and the `nn.Module` itself with
example inputs and dynamic shapes. Families: the five built-in ones and six more HF causal LMs
built from their configs (one layer, the family sweep's sizes), each checked at two sequence
lengths of one compiled graph (the sequence is dynamic).

fp32. The `none` pipeline runs the ATen ops eager runs, so its logits are compared bit-exact;
the `default` pipeline's fused kernels compute in fp32 and only reorder sums, so they are
compared within torch.testing's fp32 defaults (rtol 1.3e-6, atol 1e-5), with the kernels as
their torch reference, and in the Triton interpreter for a subset."""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import pytest
import torch
from kernel_guard import graph_kernels, kernel_calls, kernels_ran, no_dropped_ops

import ad_mlir
from ad_mlir.frontends.export import export_inference
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.zoo.small import model_from_config, small_config
from ad_mlir.zoo.tiny import FAMILIES, TinyConfig, build_model

HF_FAMILIES = ("qwen3", "phi3", "olmo2", "starcoder2", "gpt_neox", "falcon")
SOURCES = ("exported", "ep.module()", "grad-mode export", "nn.Module")
SEQ_LENS = (5, 9)
MAX_SEQ = 64
INTERPRETED = ("llama", "gemma2", "falcon")
"""Families whose default-pipeline kernels also run in the Triton interpreter (its cost is per
program instance: a subset keeps the file near a minute on 2 cores)."""


@functools.cache
def _model(family: str) -> tuple[torch.nn.Module, int]:
    """(model, vocabulary size), one decoder layer."""
    if family in FAMILIES:
        cfg = TinyConfig(family=family, layers=1)
        return build_model(cfg), cfg.vocab_size
    config = small_config(family)
    config.num_hidden_layers = 1
    return model_from_config(config), config.vocab_size


def _ids(vocab: int, seq: int) -> torch.Tensor:
    return torch.randint(1, vocab, (1, seq), generator=torch.Generator().manual_seed(seq))


def _source(family: str, source: str) -> tuple[Any, dict[str, Any]]:
    """The graph (or module) and the keyword arguments `compile` needs for it."""
    if source in ("exported", "ep.module()"):
        ep = _exported(family)
        return (ep if source == "exported" else ep.module()), {}
    model, vocab = _model(family)
    kwargs = {"input_ids": _ids(vocab, SEQ_LENS[0])}
    dims = {"input_ids": {1: torch.export.Dim("seq", min=2, max=MAX_SEQ)}}
    if source == "nn.Module":
        return model, {"example_inputs": kwargs, "dynamic_shapes": dims}
    if source == "grad-mode export":
        assert torch.is_grad_enabled()
        return torch.export.export(model, (), kwargs, dynamic_shapes=dims, strict=False), {}
    raise ValueError(source)


@functools.cache
def _exported(family: str) -> torch.export.ExportedProgram:
    model, vocab = _model(family)
    return export_inference(model, {"input_ids": _ids(vocab, SEQ_LENS[0])},
                            {"input_ids": {1: torch.export.Dim("seq", min=2, max=MAX_SEQ)}})


def _check(gm: torch.fx.GraphModule, family: str, exact: bool, context: Any = reference_kernels) -> None:
    model, vocab = _model(family)
    for seq in SEQ_LENS:
        ids = _ids(vocab, seq)
        with torch.no_grad():
            expected = model(input_ids=ids).logits
        with torch.no_grad(), context():
            got = gm(ids)[0]
        if exact:
            torch.testing.assert_close(got, expected, rtol=0, atol=0, msg=lambda m, s=seq: f"{family} seq {s}: {m}")
        else:
            torch.testing.assert_close(got, expected, msg=lambda m, s=seq: f"{family} seq {s}: {m}")


ALL_FAMILIES = (*FAMILIES, *HF_FAMILIES)


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_none_pipeline_is_eager(family: str, source: str) -> None:
    graph, kwargs = _source(family, source)
    _check(ad_mlir.compile(graph, pipeline="none", **kwargs), family, exact=True)


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_default_pipeline_matches_eager(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One source per family, in turn, so every source meets the default pipeline. For the
    interpreted families every op is a kernel (`kernel_guard`), and each kernel runs in the
    interpreter."""
    source = SOURCES[ALL_FAMILIES.index(family) % len(SOURCES)]
    graph, kwargs = _source(family, source)
    with no_dropped_ops() if family in INTERPRETED else contextlib.nullcontext():
        gm = ad_mlir.compile(graph, **kwargs)
    assert kernel_calls(gm), f"{family}: no kernel of ours"
    _check(gm, family, exact=False)
    if family in INTERPRETED:
        graph_kernels(gm)
        _check(gm, family, exact=False, context=lambda: kernels_ran(monkeypatch))
