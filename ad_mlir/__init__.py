"""ad-mlir: a fusion compiler for LLM inference graphs (PyTorch FX -> xDSL `ad` -> Triton)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ad_mlir.compiler import CompileOptions, compile
    from ad_mlir.llm.llm import LLM

__all__ = ["LLM", "CompileOptions", "compile"]


def __getattr__(name: str) -> Any:
    # torch is imported only when compile() or LLM is used, so `ad-opt` on .mlir starts fast.
    if name in ("compile", "CompileOptions"):
        from ad_mlir import compiler

        return getattr(compiler, name)
    if name == "LLM":
        from ad_mlir.llm.llm import LLM

        return LLM
    raise AttributeError(name)
