"""The block-scaled FP8 linear's kernel template (`codegen/templates/linear_fp8_block_kernel.py`)
against `ad.linear_fp8_block`'s torch reference (`torch_ops.linear_fp8_block`, itself checked
against the format's arithmetic in test_linear_fp8_block.py), in the Triton interpreter on CPU
(conftest sets TRITON_INTERPRET=1 where CUDA is absent) or on the GPU; and its PTX for sm_90 at
Qwen3-8B-FP8's sizes, compiled without a GPU: no spills.

The kernel module is called directly (its `launch`), so nothing can fall back to the reference.

Two kinds of input. On the e4m3 grid: every activation group is e4m3 values times a power of
two whose amax is 448 times that power, so its scale is the power and `x / s` needs no rounding:
the interpreter's own conversion to e4m3 (not torch's: a tie goes to the odd neighbour, a carry
into the next binade is lost, DESIGN.md) cannot differ, and the kernel must equal the
reference up to the order of fp32 additions within a block's dot. Random: the same, with the
interpreter's conversion made torch's (`codegen.interpreter.nearest_e4m3_rounding`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from template_modules import template_builder
from xdsl.dialects.builtin import BFloat16Type, Float8E4M3FNType, Float32Type, TensorType
from xdsl.utils.test_value import create_ssa_value

from ad_mlir.codegen.interpreter import nearest_bf16_rounding, nearest_e4m3_rounding
from ad_mlir.codegen.ptx import compile_all, record_launches, specialize_launch
from ad_mlir.codegen.templates.linear_fp8_block_kernel import (
    EMITTER,
    LinearFp8BlockSpec,
    emit_linear_fp8_block_module,
)
from ad_mlir.dialects import ad
from ad_mlir.dialects.decompositions import NoKernelForm
from ad_mlir.semantics import torch_ops
from ad_mlir.zoo.fp8_blocks import quantize_blocks

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Callable[[LinearFp8BlockSpec], ModuleType]:
    return template_builder(tmp_path_factory.mktemp("fp8_block_kernels"), "linear_fp8_block",
                            emit_linear_fp8_block_module)


def _on_e4m3_grid(rows: int, k: int, block_k: int, g: torch.Generator) -> torch.Tensor:
    """[rows, k] fp32 activations whose groups quantize exactly (see the module docstring)."""
    values = (torch.randn(rows, k, generator=g) * 64).to(torch.float8_e4m3fn).float()
    groups = values.view(rows, -1, block_k) if k % block_k == 0 else None
    assert groups is not None
    peak = groups.abs().argmax(-1, keepdim=True)
    groups.scatter_(-1, peak, 448.0 * torch.sign(groups.gather(-1, peak) + 0.5))
    power = torch.exp2(torch.randint(-12, -4, (rows, k // block_k, 1), generator=g).float())
    return (groups * power).view(rows, k)


def _weights(spec: LinearFp8BlockSpec, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    fp8, scale_inv = quantize_blocks(torch.randn(spec.n, spec.k, generator=g) * spec.k**-0.5,
                                     (spec.block_n, spec.block_k))
    bias = torch.randn(spec.n, generator=g).to(spec.dtype) if spec.bias else None
    return fp8, scale_inv, bias


def _run(module: ModuleType, x: torch.Tensor, fp8: torch.Tensor, scale_inv: torch.Tensor,
         bias: torch.Tensor | None) -> torch.Tensor:
    tensors = [t.to(DEVICE) for t in (x, fp8, scale_inv, *([bias] if bias is not None else []))]
    with nearest_bf16_rounding():
        out, = module.launch(getattr(module, module.kernel_name), tensors, [])
    return out.cpu()


GRID_CASES = {
    # (spec, tokens): several N and K blocks; ragged M (37 rows: 3 row blocks of 16, the last partial)
    "fp32_ragged_m": (LinearFp8BlockSpec(96, 128, 32, 32, torch.float32, False), 37),
    "fp32_decode": (LinearFp8BlockSpec(96, 128, 32, 32, torch.float32, False), 1),
    "bf16_bias": (LinearFp8BlockSpec(64, 96, 16, 32, torch.bfloat16, True), 5),
    "block_n_below_tile": (LinearFp8BlockSpec(160, 64, 16, 16, torch.float32, False), 3),
}


@pytest.mark.parametrize("case", sorted(GRID_CASES))
def test_kernel_equals_the_reference_on_the_e4m3_grid(build, case: str) -> None:  # noqa: ANN001
    """fp32: the same exact fp8 products, added in another order within a block (2^-20 of the
    output's scale); bf16: one rounding of that to bf16, the bias added and rounded again, each
    half an ulp (2^-8) in both, so at most one ulp apart (2^-7)."""
    spec, tokens = GRID_CASES[case]
    g = torch.Generator().manual_seed(0)
    fp8, scale_inv, bias = _weights(spec, g)
    x = _on_e4m3_grid(tokens, spec.k, spec.block_k, g).to(spec.dtype)
    got = _run(build(spec), x, fp8, scale_inv, bias)
    expected = torch_ops.linear_fp8_block(x, fp8, scale_inv, bias, [spec.block_n, spec.block_k])
    assert got.dtype == spec.dtype and got.shape == expected.shape
    tol = 2.0**-7 if spec.dtype == torch.bfloat16 else 2.0**-20
    torch.testing.assert_close(got.float(), expected.float(), rtol=tol, atol=tol * expected.abs().max().item())


@pytest.mark.parametrize("tokens", [1, 23])
def test_kernel_equals_the_reference_on_random_activations(build, tokens: int) -> None:  # noqa: ANN001
    """Random bf16 activations shaped as the model calls it ([batch, seq, K]); ragged N and K
    blocks (N 72 = 4.5 blocks of 16, K 80 = 2.5 blocks of 32); a bias. With the interpreter's
    conversion to e4m3 made torch's (`nearest_e4m3_rounding`), the kernel quantizes exactly as
    the reference does (the same fp32 amax, division and rounding), so the tolerance is the
    grid case's: a bf16 ulp for the two roundings at the store."""
    spec = LinearFp8BlockSpec(72, 80, 16, 32, torch.bfloat16, True)
    g = torch.Generator().manual_seed(1)
    fp8, scale_inv, bias = _weights(spec, g)
    x = torch.randn(1, tokens, spec.k, generator=g).to(spec.dtype)
    with nearest_e4m3_rounding():
        got = _run(build(spec), x, fp8, scale_inv, bias).float()
    expected = torch_ops.linear_fp8_block(x, fp8, scale_inv, bias, [16, 32]).float()
    assert got.shape == (1, tokens, spec.n)
    torch.testing.assert_close(got, expected, rtol=2.0**-7, atol=2.0**-7 * expected.abs().max().item())


def _meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


QWEN3_8B = {  # (N, K) of Qwen3-8B-FP8's projections (hidden 4096, 32 / 8 heads of 128, intermediate 12288)
    "q_o": (4096, 4096),
    "k_v": (1024, 4096),
    "gate_up": (12288, 4096),
    "qkv_fused": (6144, 4096),
    "gate_up_fused": (24576, 4096),
    "down": (4096, 12288),
}


def test_ptx_for_sm90_at_qwen3_8b_sizes_has_no_spills(build) -> None:  # noqa: ANN001
    """bf16, blocks [128, 128], each projection alone and as `fuse-gemms` makes them (Q/K/V,
    gate/up): a decode step of 1 token and a prefill of 2048, compiled for sm_90 as the runtime
    specializes them (in one compiler process); both on Hopper's fp8 MMA (wgmma on e4m3 operands:
    the decode tile swapped)."""
    specs = {}
    for proj, (n, k) in QWEN3_8B.items():
        module = build(LinearFp8BlockSpec(n, k, 128, 128, torch.bfloat16, False))
        fn = getattr(module, module.kernel_name)
        for tokens in (1, 2048):
            tensors = [_meta(tokens, k), _meta(n, k, dtype=torch.float8_e4m3fn),
                       _meta(n // 128, k // 128, dtype=torch.float32)]
            (launch,) = record_launches(module, tensors, [])
            specs[proj, tokens] = specialize_launch(module.kernel_name, Path(module.__file__), fn, launch)
    for (proj, tokens), report in zip(specs, compile_all(list(specs.values())), strict=True):
        print(f"{proj} {QWEN3_8B[proj]} tokens {tokens}: {report.registers} registers, {report.spills} B spilled, "
              f"{report.shared_memory} B shared, {report.mma}")
        assert report.spills == 0, (proj, tokens, report)
        assert report.mma, "the tile's dot is on the tensor cores"
        assert all(i.startswith("wgmma") and i.endswith(".e4m3.e4m3") for i in report.mma), (proj, tokens, report.mma)


def test_a_k_block_wider_than_a_tile_has_no_kernel_form() -> None:
    """[128, 256] blocks verify (the format allows them) but the kernel's tiles hold K blocks up
    to 128: the op then runs as its reference (`NoKernelForm`), never as a wrong kernel."""
    x = create_ssa_value(TensorType(BFloat16Type(), [2, 512]))
    w = create_ssa_value(TensorType(Float8E4M3FNType(), [256, 512]))
    ws = create_ssa_value(TensorType(Float32Type(), [2, 2]))
    op = ad.LinearFp8BlockOp(x, w, ws, None, [128, 256], TensorType(BFloat16Type(), [2, 256]))
    op.verify()
    with pytest.raises(NoKernelForm, match="K block 256"):
        EMITTER.check(op)
    EMITTER.check(ad.LinearFp8BlockOp(x, w, create_ssa_value(TensorType(Float32Type(), [2, 4])), None, [128, 128],
                                      TensorType(BFloat16Type(), [2, 256])))
