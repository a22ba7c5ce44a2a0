"""The MLP activation kernels (`ad.gelu_and_mul`, `ad.activation`, and each with the per-token
FP8 quantization of the down projection's input fused in) at real model sizes: PTX for sm_90,
compiled without a GPU as the runtime specializes them for 256 tokens, spills no register and
loads and stores vectors. Their numerics (decomposition == torch reference bit for
bit, the kernel in the interpreter at odd sizes) are in test_llm_ops.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from xdsl.dialects.builtin import ModuleOp
from xdsl.parser import Parser

from ad_mlir.codegen.cache import KernelCache
from ad_mlir.codegen.lowering import kernel_ops
from ad_mlir.codegen.ptx import PtxReport, ptx_reports
from ad_mlir.dialects import ad
from ad_mlir.passes.pipeline import make_context, run_pipeline
from ad_mlir.runtime.kernels import region_kernel


def _gated(width: int, approximate: str) -> str:
    t = f"tensor<?x{width}xbf16>"
    return f"ad.gelu_and_mul %x, %y{approximate} : ({t}, {t}) -> {t}"


def _activation(kind: str, width: int, element: str, bias: bool) -> str:
    t = f"tensor<?x{width}x{element}>"
    if bias:
        return f'ad.activation "{kind}" %x bias %b : ({t}, tensor<{width}x{element}>) -> {t}'
    return f'ad.activation "{kind}" %x : ({t}) -> {t}'


OPS = {
    # intermediate sizes of real models (rows: the dynamic token count)
    "gemma_7b_gelu_tanh_and_mul": _gated(24576, ' approximate "tanh"'),
    "gemma_2b_gelu_tanh_and_mul": _gated(16384, ' approximate "tanh"'),
    "llama3_8b_sized_gelu_and_mul": _gated(14336, ""),
    "falcon_7b_bias_gelu": _activation("gelu", 18176, "bf16", bias=True),
    "phi2_gelu_tanh": _activation("gelu_tanh", 10240, "bf16", bias=False),
    "starcoder2_15b_gelu_tanh": _activation("gelu_tanh", 24576, "bf16", bias=False),
    "opt_6_7b_relu": _activation("relu", 16384, "bf16", bias=False),
    "nemotron4_15b_relu2": _activation("relu2", 24576, "bf16", bias=False),
    "gpt2_bias_silu_f32": _activation("silu", 3072, "f32", bias=True),
}
QUANTIZED = {
    # the down projection's FP8 input quantized per token in the activation's kernel
    "gemma_2b_gelu_tanh_and_mul_fp8": (_gated(16384, ' approximate "tanh"'), "quantize_fp8_dynamic"),
    "falcon_7b_bias_gelu_fp8": (_activation("gelu", 18176, "bf16", bias=True), "quantize_fp8_dynamic"),
}


def _op(text: str) -> ad.KernelOp:
    args = ", ".join(f"%{v}: {t}" for v, t in _argument_types(text))
    module: ModuleOp = Parser(make_context(), f"func.func @f({args}) {{\n  {text}\n  func.return\n}}").parse_module()
    return next(op for op in module.walk() if isinstance(op, ad.KernelOp))


def _argument_types(text: str) -> list[tuple[str, str]]:
    """The op's operand names with their types, from its text (`%x, %y : (t1, t2) -> t`)."""
    names = [w.strip(",") for w in text.split(" : ")[0].split() if w.startswith("%")]
    types = text.split(" : (")[1].split(") -> ")[0].split(", ")
    return list(zip((n.removeprefix("%") for n in names), types, strict=True))


def _quantized_region(text: str) -> ad.FusedOp:
    """The activation and the per-token FP8 quantization of its result, as `fuse-rmsnorm-quant`
    makes them one region (the function returns the fp8 values and scales)."""
    result = text.rsplit("-> ", 1)[1]
    rows, width = result.removeprefix("tensor<").split("x")[:2]
    fp8, scale = f"tensor<{rows}x{width}xf8E4M3FN>", f"tensor<{rows}x1xf32>"
    args = ", ".join(f"%{v}: {t}" for v, t in _argument_types(text))
    module: ModuleOp = Parser(make_context(), (
        f"func.func @f({args}) -> ({fp8}, {scale}) {{\n  %a = {text}\n"
        f"  %q, %s = ad.quantize_fp8_dynamic %a per_token : {result} -> ({fp8}, {scale})\n"
        f"  func.return %q, %s : {fp8}, {scale}\n}}"
    )).parse_module()
    run_pipeline(module, "fuse-rmsnorm-quant")
    (region,) = kernel_ops(module)
    assert isinstance(region, ad.FusedOp)
    return region


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, PtxReport]]:
    """One compile (a child process under the interpreter) for all the kernels."""
    cache = KernelCache(Path(tmp_path_factory.mktemp("activation_kernels")))
    kernels = {case: region_kernel(_op(text), cache) for case, text in OPS.items()}
    kernels |= {case: region_kernel(_quantized_region(text), cache) for case, (text, _) in QUANTIZED.items()}
    by_name = {r.name: r for r in ptx_reports(kernels.values())}
    return {case: (kernel.name, by_name[kernel.name]) for case, kernel in kernels.items()}


def _label(case: str) -> str:
    if case in OPS:
        return _op(OPS[case]).kernel_label()
    text, quantization = QUANTIZED[case]
    return f"{_op(text).kernel_label()}_{quantization}"


@pytest.mark.parametrize("case", sorted(OPS) + sorted(QUANTIZED))
def test_compiles_for_sm90_without_spills_and_with_vector_memory_access(reports, case: str) -> None:
    name, report = reports[case]
    assert name.startswith(_label(case) + "_"), name
    assert report.registers > 0 and report.spills == 0, report
    assert report.vectorized_loads and report.vectorized_stores, report
