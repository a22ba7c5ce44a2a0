"""PTX resources (sm_90, compiled on the CPU) of every kernel the default pipeline generates
for each HF family at real sizes (weights on the meta device), and of the cached-attention
kernel of generation at the same sizes: a prefill and a decode step (split kernel + reduce)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ad_mlir.frontends.export import export_meta_model
from ad_mlir.zoo.tiny import FAMILIES, ModelShape, meta_model

TOKENS = 256
"""Kernels are specialized as the runtime launches them at this many tokens."""
CACHE_SLOTS, CACHE_TOKENS, DECODE_BATCH = 16, 8192, 8
"""The cache the generation rows are specialized for, and the sequences of their decode step."""

_CACHED_ATTENTION = """
func.func @forward(%q: tensor<?x{heads}x?x{d}x{t}>, %k: tensor<?x{kv}x?x{d}x{t}>, %v: tensor<?x{kv}x?x{d}x{t}>,
                   %cos: tensor<?x?x{d}x{t}>, %sin: tensor<?x?x{d}x{t}>, %kc: tensor<{slots}x{max_seq}x{kv}x{d}x{t}>,
                   %vc: tensor<{slots}x{max_seq}x{kv}x{d}x{t}>, %slots: tensor<?x1xi64>, %starts: tensor<?xi64>)
    -> tensor<?x{heads}x?x{d}x{t}> {{
  %o = ad.cached_attention %q, %k, %v rope %cos, %sin cache %kc, %vc block_tables %slots cache_starts %starts
    scale {scale} :
    (tensor<?x{heads}x?x{d}x{t}>, tensor<?x{kv}x?x{d}x{t}>, tensor<?x{kv}x?x{d}x{t}>,
     tensor<{slots}x{max_seq}x{kv}x{d}x{t}>, tensor<{slots}x{max_seq}x{kv}x{d}x{t}>, tensor<?x1xi64>, tensor<?xi64>,
     tensor<?x?x{d}x{t}>, tensor<?x?x{d}x{t}>) -> tensor<?x{heads}x?x{d}x{t}>
  func.return %o : tensor<?x{heads}x?x{d}x{t}>
}}
"""


def family_kernels(family: str, shape: ModelShape, dtype: str) -> list[Any]:
    """The kernels of a two-layer model of `family` (layers repeat: two show every kernel)."""
    from ad_mlir.frontends.fx_import import import_program
    from ad_mlir.passes.pipeline import run_pipeline
    from ad_mlir.runtime.kernels import build_kernels

    program = import_program(export_meta_model(meta_model(family, shape, 2, dtype)))
    run_pipeline(program.module, "default")
    return list(build_kernels(program.module).values())


def cached_attention_kernel(shape: ModelShape, dtype: str) -> Any:
    """The kernel of an `ad.cached_attention` with RoPE of `shape`'s heads over a cache of
    CACHE_SLOTS x CACHE_TOKENS, through the compiler's own lowering and kernel cache."""
    from xdsl.parser import Parser

    from ad_mlir.passes.pipeline import make_context
    from ad_mlir.runtime.kernels import build_kernels

    t = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}[dtype]
    text = _CACHED_ATTENTION.format(heads=shape.heads, kv=shape.kv_heads, d=shape.head_dim, t=t, slots=CACHE_SLOTS,
                                    max_seq=CACHE_TOKENS, scale=f"{shape.head_dim**-0.5:e}")
    module = Parser(make_context(), text).parse_module()
    return next(iter(build_kernels(module).values()))


def generation_specializations(shape: ModelShape, dtype: str) -> list[tuple[str, Any]]:
    """(phase, specialization) of every launch of a TOKENS-token prefill and of a decode step of
    DECODE_BATCH sequences."""
    from ad_mlir.codegen.ptx import record_launches, specialize_launch
    from ad_mlir.semantics.op_table import torch_dtype

    kernel = cached_attention_kernel(shape, dtype)
    specs = []
    for phase, (batch, seq) in (("prefill", (1, TOKENS)), ("decode", (DECODE_BATCH, 1))):
        tensors = [torch.empty(_sizes(t.get_shape(), batch, seq), dtype=torch_dtype(t), device="meta")
                   for t in kernel.arg_types]
        launches = record_launches(kernel.cached.module, tensors, [])
        phases = [phase] if len(launches) == 1 else [phase, f"{phase} (reduce)"]
        specs += [(p, specialize_launch(kernel.name, kernel.cached.path, kernel.cached.jit_function, launch))
                  for p, launch in zip(phases, launches, strict=True)]
    return specs


def _sizes(shape: Sequence[int], batch: int, seq: int) -> list[int]:
    """A cached attention's operand shape: its first dynamic dim is the batch, any other the
    sequence."""
    from xdsl.dialects.builtin import DYNAMIC_INDEX

    dynamic = [i for i, d in enumerate(shape) if d == DYNAMIC_INDEX]
    return [d if d != DYNAMIC_INDEX else batch if i == dynamic[0] else seq for i, d in enumerate(shape)]


def run_ptx(
    families: Sequence[str] = tuple(FAMILIES), shape: ModelShape | None = None, dtype: str = "bfloat16",
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """One row per family and distinct kernel: registers, spills, shared memory, vectorized
    global loads/stores, warps, tile."""
    from ad_mlir.codegen.ptx import compile_all, ptx_reports

    rows = []
    for family in families:
        if progress:
            progress(f"PTX: {family}")
        for report in ptx_reports(family_kernels(family, shape or ModelShape(), dtype), TOKENS):
            rows.append({"family": family, **dataclasses.asdict(report)})
    if progress:
        progress("PTX: cached attention")
    phases, specs = zip(*generation_specializations(shape or ModelShape(), dtype), strict=True)
    for phase, report in zip(phases, compile_all(specs), strict=True):
        rows.append({"family": f"generation: {phase}", **dataclasses.asdict(report)})
    return rows
