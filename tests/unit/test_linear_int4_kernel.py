"""The int4 linear's kernel template (`codegen/templates/linear_int4_kernel.py`) against
`ad.linear_int4`'s torch reference (`torch_ops.linear_int4`, itself checked against the formats'
arithmetic in test_linear_int4.py), in the Triton interpreter on CPU (conftest sets
TRITON_INTERPRET=1 where CUDA is absent) or on the GPU; and its PTX for sm_90 at Llama-3-8B's
sizes, compiled without a GPU: no spills.

The kernel module is called directly (its `launch`), so nothing can fall back to the reference.
The kernel dequantizes as the reference does (exact in fp32, one rounding to x's dtype: the same
values) and multiplies on the same tiles, so it differs from the reference only by the order of
the fp32 additions and, in bf16, by the one rounding of the sum at the store (and again after
the bias), which that order can move by an ulp."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from template_modules import template_builder

from ad_mlir.codegen.interpreter import nearest_bf16_rounding
from ad_mlir.codegen.ptx import compile_all, record_launches, specialize_launch
from ad_mlir.codegen.templates.linear_int4_kernel import (
    LinearInt4Spec,
    emit_linear_int4_module,
    one_group_per_tile,
    tile_blocks,
)
from ad_mlir.semantics import torch_ops
from ad_mlir.zoo.gptq import act_order_groups
from ad_mlir.zoo.int4 import pack_columns, pack_rows, quantize_groups

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Callable[[LinearInt4Spec], ModuleType]:
    return template_builder(tmp_path_factory.mktemp("int4_kernels"), "linear_int4", emit_linear_int4_module)


def _tensors(spec: LinearInt4Spec, g: torch.Generator) -> list[torch.Tensor]:
    """qweight, qzeros, scales (float16), [g_idx], [bias] of a random weight quantized with zero
    points (GPTQ v1's offset when the spec has it)."""
    weight = torch.randn(spec.n, spec.k, generator=g) * spec.k**-0.5
    g_idx = act_order_groups(torch.rand(spec.k, generator=g), spec.group_size) if spec.act_order else None
    codes, zeros, scales = quantize_groups(weight, spec.group_size, False, g_idx, min_zero=spec.zero_offset)
    tensors = [pack_rows(codes), pack_columns(zeros - spec.zero_offset), scales.to(spec.scale_dtype)]
    tensors += [g_idx] if g_idx is not None else []
    tensors += [torch.randn(spec.n, generator=g).to(spec.dtype)] if spec.bias else []
    return tensors


def _reference(spec: LinearInt4Spec, x: torch.Tensor, tensors: list[torch.Tensor]) -> torch.Tensor:
    qweight, qzeros, scales, *rest = tensors
    g_idx = rest.pop(0) if spec.act_order else None
    bias = rest.pop(0) if spec.bias else None
    return torch_ops.linear_int4(x, qweight, qzeros, scales, g_idx, bias, spec.group_size, spec.zero_offset)


CASES = {
    # (spec, tokens). K 200 and N 40 are no multiple of any tile (K: 1.6 decode steps of 128,
    # 3.1 prefill steps of 64; N: 0.6 of 64); 37 tokens are a prefill tile and a ragged one.
    "fp32_groups_decode": (LinearInt4Spec(40, 200, 64, 1, False, torch.float32, torch.float16, True), 3),
    "fp32_act_order_prefill": (LinearInt4Spec(40, 200, 64, 1, True, torch.float32, torch.float16, False), 37),
    "bf16_act_order_decode": (LinearInt4Spec(48, 200, 32, 1, True, torch.bfloat16, torch.float16, True), 1),
    "bf16_groups_prefill": (LinearInt4Spec(48, 256, 128, 0, False, torch.bfloat16, torch.float16, True), 20),
    "bf16_one_group": (LinearInt4Spec(40, 136, 136, 0, False, torch.bfloat16, torch.float16, False), 5),
    "fp32_one_group_prefill": (LinearInt4Spec(40, 136, 136, 1, False, torch.float32, torch.bfloat16, False), 17),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_equals_the_reference(build, case: str) -> None:  # noqa: ANN001
    """fp32: the same fp32 products added in another order (K <= 256 terms): within 2^-20 of the
    output's scale. bf16: the rounding at the store (and after the bias) can land on the
    neighbouring bf16 when the fp32 sums differ in their last bits: one ulp, 2^-7."""
    spec, tokens = CASES[case]
    g = torch.Generator().manual_seed(0)
    tensors = _tensors(spec, g)
    x = torch.randn(1, tokens, spec.k, generator=g).to(spec.dtype)
    module = build(spec)
    with nearest_bf16_rounding():
        got, = module.launch(getattr(module, module.kernel_name), [t.to(DEVICE) for t in (x, *tensors)], [])
    expected = _reference(spec, x, tensors)
    assert got.dtype == spec.dtype and got.shape == expected.shape == (1, tokens, spec.n)
    tol = 2.0**-7 if spec.dtype == torch.bfloat16 else 2.0**-20
    torch.testing.assert_close(got.cpu().float(), expected.float(), rtol=tol, atol=tol * expected.abs().max().item())


def test_the_cases_cover_both_group_loads() -> None:
    """The tests above run the one-row zero point and scale load and the per-row gather."""
    kinds = {one_group_per_tile(spec, tile_blocks(spec, tokens).block_k) for spec, tokens in CASES.values()}
    assert kinds == {True, False}


def _meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


LLAMA3_8B = {  # (N, K) of Llama-3-8B's projections (hidden 4096, 32 / 8 heads of 128, intermediate 14336)
    "q_o": (4096, 4096),
    "qkv_fused": (6144, 4096),
    "gate_up_fused": (28672, 4096),
    "down": (4096, 14336),
}


def test_ptx_for_sm90_at_llama3_8b_sizes_has_no_spills(build) -> None:  # noqa: ANN001
    """bf16 activations, float16 scales in groups of 128 (GPTQ's and AWQ's usual), Q and O, down,
    and the GEMMs `fuse-gemms` makes (Q/K/V, gate/up; K/V's and gate's alone are narrower): a decode step of 1 token and a prefill of 2048, compiled
    for sm_90 as the runtime specializes them; with act-order (g_idx) for two of them. The tile's
    dot is on the tensor cores in bf16."""
    specs = {}
    cases = [(proj, False) for proj in LLAMA3_8B] + [("qkv_fused", True), ("down", True)]
    for proj, act_order in cases:
        n, k = LLAMA3_8B[proj]
        module = build(LinearInt4Spec(n, k, 128, 1, act_order, torch.bfloat16, torch.float16, False))
        fn = getattr(module, module.kernel_name)
        for tokens in (1, 2048):
            tensors = [_meta(tokens, k), _meta(k // 8, n, dtype=torch.int32), _meta(k // 128, n // 8, dtype=torch.int32),
                       _meta(k // 128, n, dtype=torch.float16), *([_meta(k, dtype=torch.int32)] if act_order else [])]
            (launch,) = record_launches(module, tensors, [])
            specs[proj, act_order, tokens] = specialize_launch(module.kernel_name, Path(module.__file__), fn, launch)
    for (proj, act_order, tokens), report in zip(specs, compile_all(list(specs.values())), strict=True):
        print(f"{proj} {LLAMA3_8B[proj]} act_order {act_order} tokens {tokens}: {report.registers} registers, "
              f"{report.spills} B spilled, {report.shared_memory} B shared, {report.mma}")
        assert report.spills == 0, (proj, act_order, tokens, report)
        assert report.mma and all("bf16" in i for i in report.mma), (proj, tokens, report.mma)
