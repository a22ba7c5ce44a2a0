"""Every generated kernel of the five families compiles to PTX for sm_90 (no GPU needed) as
the runtime specializes it, and spills no register; llama's norm and SiLU-mul kernels load and
store vectors (the specialization marks pointers 16-byte aligned and unit strides constexpr,
so contiguous rows vectorize).

Cost: under the Triton interpreter each `ptx_reports` call starts a compiler process (~2.5 s)
and each family's export takes ~1 s, so one call compiles a dtype's kernels of all families,
each distinct kernel once per worker. `dtype` is a module-scoped fixture so that pytest keeps a
dtype's two tests together and `-n 2` runs each dtype's pair on its own worker."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
from triton.compiler import make_backend
from triton.runtime.jit import JITFunction, create_function_from_signature

from ad_mlir.codegen.ptx import TARGET, PtxCompileError, PtxReport, capture_launch, ptx_reports, specialize
from ad_mlir.dialects import ad
from ad_mlir.frontends.fx_import import import_program
from ad_mlir.passes.pipeline import run_pipeline
from ad_mlir.runtime.kernels import RegionKernel, build_kernels
from ad_mlir.semantics import op_table
from ad_mlir.zoo.tiny import FAMILIES

_KERNELS: dict[tuple[str, str], list[RegionKernel]] = {}
_REPORTS: dict[str, PtxReport] = {}


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def dtype(request: pytest.FixtureRequest) -> str:
    return request.param


def _kernels(exported, family: str, dtype: str) -> list[RegionKernel]:  # noqa: ANN001 (the fixture's builder)
    """The family's distinct kernels (1 layer, default pipeline), built once per worker."""
    if (family, dtype) not in _KERNELS:
        _, ep = exported(family, dtype, False)
        program = import_program(ep)
        run_pipeline(program.module, "default")
        _KERNELS[family, dtype] = list({k.name: k for k in build_kernels(program.module).values()}.values())
    return _KERNELS[family, dtype]


def _holding(kernels: list[RegionKernel], op_type: type) -> list[RegionKernel]:
    """The kernels whose region computes an `op_type` (seen as its torch call in the reference)."""
    target = op_table.SPEC_BY_OP[op_type].overloads[0].target
    return [k for k in kernels if any(str(n.target) == target for n in k.reference.graph.nodes)]


def _reports(kernels: list[RegionKernel]) -> list[PtxReport]:
    _REPORTS.update((r.name, r) for r in ptx_reports(k for k in kernels if k.name not in _REPORTS))
    return [_REPORTS[k.name] for k in kernels]


def _assert_specialized_as_triton_does(kernel: RegionKernel) -> None:
    """Triton's runtime binder, given the same launch, picks the same types, constexprs and
    divisibility marks (it runs on meta tensors too: their address 0 is aligned)."""
    backend = make_backend(TARGET)
    launch = capture_launch(kernel)
    fn = JITFunction(kernel.cached.jit_function.fn)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*launch.args, **launch.kwargs)
    _, signature, constexprs, attrs = fn._pack_args(backend, dict(launch.kwargs), bound, specialization, options)
    ours = specialize(kernel)
    assert ours.signature == signature, kernel.name
    assert ours.constexprs == {fn.arg_names[i]: v for (i,), v in constexprs.items()}, kernel.name
    assert set(ours.divisible) == {fn.arg_names[i] for (i,), a in attrs.items() if a}, kernel.name


def test_every_kernel_compiles_as_specialized_without_spills(exported, dtype: str) -> None:
    kernels = {k.name: (f, k) for f in sorted(FAMILIES) for k in _kernels(exported, f, dtype)}
    for _, kernel in kernels.values():
        _assert_specialized_as_triton_does(kernel)
    reports = _reports([k for _, k in kernels.values()])
    for (family, _), report in zip(kernels.values(), reports, strict=True):
        assert report.registers > 0, (family, report)
        assert report.spills == 0, (family, report)


def test_llama_norm_and_silu_mul_are_vectorized(exported, dtype: str) -> None:
    kernels = _kernels(exported, "llama", dtype)
    for op_type in (ad.MeanOp, ad.SiluOp):
        holding = _holding(kernels, op_type)
        assert holding, op_type.name
        for report in _reports(holding):
            assert report.vectorized_loads and report.vectorized_stores, report


def test_a_kernel_triton_rejects_raises_naming_it(exported, tmp_path: Path) -> None:  # noqa: ANN001
    [silu_mul] = _holding(_kernels(exported, "llama", "float32"), ad.SiluOp)
    path = tmp_path / silu_mul.cached.path.name
    path.write_text(silu_mul.cached.path.read_text().replace("tl.exp(", "tl.no_such_function("))
    spec = importlib.util.spec_from_file_location(f"broken_{silu_mul.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    broken = dataclasses.replace(silu_mul, cached=dataclasses.replace(silu_mul.cached, path=path, module=module))
    with pytest.raises(PtxCompileError, match=rf"(?s)kernel {silu_mul.name} does not compile.*no_such_function"):
        ptx_reports([broken])


def test_attention_and_fp8_kernels_compile_without_spills(exported) -> None:  # noqa: ANN001
    """The rope-attention template (as specialized for the tiny llama: head_dim 32, bf16, a
    boolean mask) and the fused norm / SiLU-mul + FP8 quantization kernels of a quantized llama
    (dynamic per-token and static scales)."""
    _, ep = exported("llama", "bfloat16", False)
    kernels: dict[str, RegionKernel] = {}
    for quantize in ("quantize-linear-fp8", "quantize-linear-fp8{scheme=static activation-scale=0.02}"):
        program = import_program(ep)
        run_pipeline(program.module, f"{quantize},default")
        kernels.update((k.name, k) for k in build_kernels(program.module).values())
    wanted = ("rope_attention_", "rms_norm_quantize_fp8_dynamic_", "add_rms_norm_quantize_fp8_dynamic_",
              "silu_and_mul_quantize_fp8_dynamic_", "rms_norm_quantize_fp8_", "silu_and_mul_quantize_fp8_")
    for prefix in wanted:
        assert any(name.startswith(prefix) for name in kernels), prefix
    for kernel in kernels.values():
        _assert_specialized_as_triton_does(kernel)
    for report in _reports(list(kernels.values())):
        assert report.registers > 0 and report.spills == 0, report
