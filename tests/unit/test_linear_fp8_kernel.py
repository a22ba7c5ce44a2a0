"""The per-token / per-channel FP8 linear's kernel template (`codegen/templates/linear_fp8_kernel.py`)
against `ad.linear_fp8`'s torch reference (`torch_ops.linear_fp8`, itself the eager forward of a
compressed-tensors FP8-dynamic linear: test_ct_fp8_export.py), in the Triton interpreter on CPU
(conftest sets TRITON_INTERPRET=1 where CUDA is absent) or on the GPU; and its PTX for sm_90 at
Llama-3.1-8B's sizes, compiled without a GPU: no spills, on wgmma e4m3.

The kernel module is called directly (its `launch`), so nothing can fall back to the reference.
Its operands are already fp8 (no e4m3 conversion in the kernel), so the interpreter computes the
same exact e4m3 products; the kernel scales the fp32 sum once where the reference multiplies the
dequantized operands, so they differ by fp32 rounding: K products' sums and two scale products,
within 2^-16 of the row's largest |output| for fp32 (K <= 200 here, each rounding 2^-24), and
one bf16 ulp (2^-7 relative, two roundings to bf16 of nearly equal values) for bf16."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from template_modules import template_builder
from xdsl.dialects.builtin import BFloat16Type, Float8E4M3FNType, Float32Type, TensorType
from xdsl.utils.test_value import create_ssa_value

from ad_mlir.codegen.interpreter import nearest_bf16_rounding
from ad_mlir.codegen.ptx import compile_all, record_launches, specialize_launch
from ad_mlir.codegen.templates.linear_fp8_kernel import EMITTER, LinearFp8Spec, emit_linear_fp8_module
from ad_mlir.dialects import ad
from ad_mlir.dialects.decompositions import NoKernelForm
from ad_mlir.semantics import torch_ops
from ad_mlir.zoo.ct_fp8 import quantize_tokens, quantize_weight

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Callable[[LinearFp8Spec], ModuleType]:
    return template_builder(tmp_path_factory.mktemp("fp8_kernels"), "linear_fp8", emit_linear_fp8_module)


CASES = {
    # (spec, input shape): ragged M (37 rows: 3 row blocks of 16) and N (72), K over two K tiles
    "fp32_channel_ragged": (LinearFp8Spec(72, 200, torch.float32, True, True, False), (37, 200)),
    "fp32_decode": (LinearFp8Spec(96, 128, torch.float32, True, True, True), (2, 1, 128)),
    "bf16_channel_bias": (LinearFp8Spec(64, 96, torch.bfloat16, True, True, True), (1, 5, 96)),
    "bf16_per_tensor": (LinearFp8Spec(48, 64, torch.bfloat16, False, False, False), (70, 64)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_equals_the_reference(build, case: str) -> None:  # noqa: ANN001
    spec, shape = CASES[case]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g) * torch.rand(*shape[:-1], 1, generator=g) * 10
    if spec.per_token:
        q, xs = quantize_tokens(x)
    else:
        xs = x.abs().amax() / 448
        q = (x / xs).to(torch.float8_e4m3fn)
    fp8, ws = quantize_weight(torch.randn(spec.n, spec.k, generator=g), "channel" if spec.per_channel else "tensor")
    ws = ws if spec.per_channel else ws.reshape(())
    bias = torch.randn(spec.n, generator=g).to(spec.dtype) if spec.bias else None
    tensors = [t.to(DEVICE) for t in (q, fp8, xs, ws, *([bias] if bias is not None else []))]
    module = build(spec)
    with nearest_bf16_rounding():
        got, = module.launch(getattr(module, module.kernel_name), tensors, [])
    expected = torch_ops.linear_fp8(q, fp8, xs, ws, bias, spec.dtype)
    got = got.cpu()
    assert got.dtype == spec.dtype and got.shape == expected.shape
    magnitude = expected.float().abs().amax(-1, keepdim=True)
    tol = 2.0**-7 if spec.dtype == torch.bfloat16 else 2.0**-16
    assert bool(((got.float() - expected.float()).abs() <= tol * magnitude).all()), case
    assert got.float().abs().amax() > 0


def _meta(*shape: int, dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


LLAMA_3_1_8B = {  # (N, K) of Llama-3.1-8B's projections (hidden 4096, 32 / 8 heads of 128, intermediate 14336)
    "q_o": (4096, 4096),
    "k_v": (1024, 4096),
    "qkv_fused": (6144, 4096),
    "gate_up": (14336, 4096),
    "down": (4096, 14336),
}


def test_ptx_for_sm90_at_llama_3_1_8b_sizes_has_no_spills(build) -> None:  # noqa: ANN001
    """bf16 output, per-token and per-channel scales (FP8-dynamic): a decode step of 1 token and
    a prefill of 2048, compiled for sm_90 as the runtime specializes them (in one compiler
    process); both on Hopper's fp8 MMA (wgmma on e4m3 operands: the decode tile swapped)."""
    specs = {}
    for proj, (n, k) in LLAMA_3_1_8B.items():
        module = build(LinearFp8Spec(n, k, torch.bfloat16, True, True, False))
        fn = getattr(module, module.kernel_name)
        for tokens in (1, 2048):
            tensors = [_meta(tokens, k), _meta(n, k), _meta(tokens, 1, dtype=torch.float32),
                       _meta(n, 1, dtype=torch.float32)]
            (launch,) = record_launches(module, tensors, [])
            specs[proj, tokens] = specialize_launch(module.kernel_name, Path(module.__file__), fn, launch)
    for (proj, tokens), report in zip(specs, compile_all(list(specs.values())), strict=True):
        print(f"{proj} {LLAMA_3_1_8B[proj]} tokens {tokens}: {report.registers} registers, {report.spills} B spilled, "
              f"{report.shared_memory} B shared, {report.mma}")
        assert report.spills == 0, (proj, tokens, report)
        assert report.mma, "the tile's dot is on the tensor cores"
        assert all(i.startswith("wgmma") and i.endswith(".e4m3.e4m3") for i in report.mma), (proj, tokens, report.mma)


def test_a_scale_neither_per_token_nor_per_tensor_has_no_kernel_form() -> None:
    """A weight scale per K column verifies (the reference broadcasts it) but is no scale the
    kernel applies after its K loop: the op runs as its reference (`NoKernelForm`)."""
    x = create_ssa_value(TensorType(Float8E4M3FNType(), [2, 64]))
    w = create_ssa_value(TensorType(Float8E4M3FNType(), [32, 64]))
    xs = create_ssa_value(TensorType(Float32Type(), [2, 1]))
    result = TensorType(BFloat16Type(), [2, 32])
    op = ad.LinearFp8Op.build(operands=[x, w, xs, create_ssa_value(TensorType(Float32Type(), [1, 64])), []],
                              result_types=[result])
    with pytest.raises(NoKernelForm, match=r"weight scale \[1, 64\]"):
        EMITTER.check(op)
    EMITTER.check(ad.LinearFp8Op.build(operands=[x, w, xs, create_ssa_value(TensorType(Float32Type(), [32, 1])), []],
                                       result_types=[result]))
