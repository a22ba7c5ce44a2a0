"""One options object for every way in: `ad_mlir.compile`, `torch.compile(backend="ad_mlir")` and
`LLM` take the same `CompileOptions` (as `options=` and/or keywords), and each option reaches the
compile (a kernel cache given in the options is the one kernels are written to)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from kernel_guard import kernel_calls

import ad_mlir
from ad_mlir import CompileOptions
from ad_mlir.codegen.cache import KernelCache
from ad_mlir.dynamo_backend import BackendOptions
from ad_mlir.zoo.tiny import TinyConfig, build_model


class SiluMul(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.silu(x) * x


def _export() -> torch.export.ExportedProgram:
    return torch.export.export(SiluMul(), (torch.randn(4, 8),))


def test_keywords_override_the_options_object(tmp_path: Path) -> None:
    opts = CompileOptions(pipeline="none", cache=KernelCache(tmp_path))
    assert not kernel_calls(ad_mlir.compile(_export(), options=opts))
    compiled = ad_mlir.compile(_export(), options=opts, pipeline="default")
    assert kernel_calls(compiled), "the keyword pipeline did not replace the object's"
    assert opts.cache is not None and opts.cache.generated == len(list(tmp_path.glob("*.py"))) >= 1
    x = torch.randn(4, 8)
    torch.testing.assert_close(compiled(x)[0], SiluMul()(x), rtol=1.3e-6, atol=1e-5)  # fp32: torch's defaults


def test_an_unknown_option_is_named_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown CompileOptions option\(s\) pipelin \(known: cache, layers_once, pipeline, rank"):
        ad_mlir.compile(_export(), pipelin="none")
    with pytest.raises(ValueError, match="unknown BackendOptions option"):
        BackendOptions.of({"fallbak": False})


def test_backend_options_are_compile_options_and_reach_the_compile(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path)
    run = torch.compile(SiluMul(), backend="ad_mlir", options={"cache": cache, "fallback": False})
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(run(x), SiluMul()(x), rtol=1.3e-6, atol=1e-5)
    assert cache.generated >= 1 and list(tmp_path.glob("*.py"))
    assert BackendOptions.of(CompileOptions(pipeline="none"), fallback=False) == BackendOptions(
        pipeline="none", fallback=False)


def test_llm_takes_the_same_options(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path)
    llm = ad_mlir.LLM(build_model(TinyConfig("llama")), max_batch=1, max_seq_len=16, options=CompileOptions(cache=cache))
    assert llm.options.cache is cache
    assert cache.generated + cache.hits >= 1 and list(tmp_path.glob("*.py"))
    assert kernel_calls(llm.graph)
