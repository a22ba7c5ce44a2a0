"""The NVFP4 linear's kernel template (`codegen/templates/linear_nvfp4_kernel.py`) against
`ad.linear_nvfp4`'s torch reference (`torch_ops.linear_nvfp4`, itself checked against the
dequantized weight in float64 in test_linear_nvfp4.py), in the Triton interpreter on CPU
(conftest sets TRITON_INTERPRET=1 where CUDA is absent) or on the GPU; and its PTX for sm_90 at
Llama-3-8B's sizes, compiled without a GPU: no spills.

The kernel module is called directly (its `launch`), so nothing can fall back to the reference.
The kernel decodes the codes and applies the block scales in registers; those products are
exact in fp32, bf16 and fp16 alike, so kernel and reference multiply the same values and differ
only in the order of the fp32 sums (and, in bf16, the one rounding at the store)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from template_modules import template_builder

from ad_mlir.codegen.interpreter import nearest_bf16_rounding
from ad_mlir.codegen.ptx import compile_all, record_launches, specialize_launch
from ad_mlir.codegen.templates.linear_nvfp4_kernel import (
    LinearNvfp4Spec,
    emit_linear_nvfp4_module,
    tile_blocks,
)
from ad_mlir.semantics import torch_ops
from ad_mlir.zoo import nvfp4

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Callable[[LinearNvfp4Spec], ModuleType]:
    return template_builder(tmp_path_factory.mktemp("nvfp4_kernels"), "linear_nvfp4", emit_linear_nvfp4_module)


def _weights(spec: LinearNvfp4Spec, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Codes, block scales and the global scale of a random weight; for a per-row global scale,
    three parts quantized on their own (as `fuse-gemms` merges Q/K/V), their scales folded."""
    w = torch.randn(spec.n, spec.k, generator=g) * torch.logspace(-2, 0, spec.k) * spec.k**-0.5
    parts = [nvfp4.quantize(part) for part in (w.tensor_split(3) if spec.per_row else (w,))]
    packed, block = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    scale_2 = torch.cat([p[2].expand(len(p[0])) for p in parts]) if spec.per_row else parts[0][2]
    bias = torch.randn(spec.n, generator=g).to(spec.dtype) if spec.bias else None
    return packed, block, scale_2, bias


def _run(module: ModuleType, x: torch.Tensor, *weights: torch.Tensor | None) -> torch.Tensor:
    tensors = [t.to(DEVICE) for t in (x, *weights) if t is not None]
    with nearest_bf16_rounding():
        out, = module.launch(getattr(module, module.kernel_name), tensors, [])
    return out.cpu()


CASES = {
    # (spec, tokens): N and K not multiples of the tile (N 80 of 64-wide decode tiles; K 144 = 2.25
    # tiles of 64, whole 16-element groups); ragged M (37 rows of 64- and 16-row tiles)
    "fp32_prefill_ragged": (LinearNvfp4Spec(80, 144, torch.float32, False, False), 37),
    "fp32_decode": (LinearNvfp4Spec(80, 144, torch.float32, False, False), 1),
    "bf16_decode_bias": (LinearNvfp4Spec(96, 208, torch.bfloat16, False, True), 2),
    "bf16_prefill_per_row": (LinearNvfp4Spec(144, 80, torch.bfloat16, True, True), 23),
    "fp16_per_row": (LinearNvfp4Spec(48, 64, torch.float16, True, False), 5),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_equals_the_reference(build, case: str) -> None:  # noqa: ANN001
    """fp32: the same exact products added in another order (K <= 208 terms: well under 2^-18 of
    the output's scale); bf16 / fp16: that, then one rounding at the store in each, half an ulp
    (2^-9 / 2^-12 relative) apiece, so at most one ulp apart."""
    spec, tokens = CASES[case]
    g = torch.Generator().manual_seed(0)
    packed, block, scale_2, bias = _weights(spec, g)
    x = torch.randn(1, tokens, spec.k, generator=g).to(spec.dtype)
    got = _run(build(spec), x, packed, block, scale_2, bias)
    expected = torch_ops.linear_nvfp4(x, packed, block, scale_2, bias)
    assert got.dtype == spec.dtype and got.shape == expected.shape == (1, tokens, spec.n)
    tol = {torch.float32: 2.0**-18, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}[spec.dtype]
    torch.testing.assert_close(got.float(), expected.float(), rtol=tol, atol=tol * expected.abs().max().item())


def test_the_kernel_decodes_every_code() -> None:
    """Each of the 16 codes in both nibbles of a byte, one block scale of 1 and a global scale of
    1: the output row is the code values' dot with a one-hot input, so a wrong nibble order, sign
    or exponent shows as a wrong value."""
    build = template_builder(Path(__import__("tempfile").mkdtemp()), "linear_nvfp4_codes", emit_linear_nvfp4_module)
    spec = LinearNvfp4Spec(16, 32, torch.float32, False, False)
    codes = torch.arange(32, dtype=torch.uint8).remainder(16).view(1, 32).expand(16, 32).roll(1, 1).contiguous()
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    block = torch.ones(16, 2, dtype=torch.float8_e4m3fn)
    x = torch.eye(32)
    got = _run(build(spec), x, packed, block, torch.tensor(1.0))
    values = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6])
    assert torch.equal(got.T, values[codes.long()])


def _meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


LLAMA3_8B = {  # (N, K) of Llama-3-8B's projections (hidden 4096, 32 / 8 heads of 128, intermediate 14336)
    "q_o": (4096, 4096),
    "gate_up_fused": (28672, 4096),
    "down": (4096, 14336),
}
"""N and K are the kernel's constants, not its tiles: k/v (1024) and Q/K/V merged (6144) compile to
the same registers (measured)."""


def test_ptx_for_sm90_at_llama3_8b_sizes_has_no_spills(build) -> None:  # noqa: ANN001
    """bf16, each projection alone and as `fuse-gemms` makes them (Q/K/V, gate/up: a global scale
    per row): a decode step of 1 token and a prefill of 2048, compiled for sm_90 as the runtime
    specializes them; the decoded tile on the tensor cores (bf16 MMA)."""
    specs = {}
    for proj, (n, k) in LLAMA3_8B.items():
        per_row = proj.endswith("fused")
        module = build(LinearNvfp4Spec(n, k, torch.bfloat16, per_row, False))
        fn = getattr(module, module.kernel_name)
        for tokens in (1, 2048):
            tensors = [_meta(tokens, k), _meta(n, k // 2, dtype=torch.uint8), _meta(n, k // 16, dtype=torch.float8_e4m3fn),
                       _meta(*((n,) if per_row else ()), dtype=torch.float32)]
            (launch,) = record_launches(module, tensors, [])
            specs[proj, tokens] = specialize_launch(module.kernel_name, Path(module.__file__), fn, launch)
    for (proj, tokens), report in zip(specs, compile_all(list(specs.values())), strict=True):
        tile = tile_blocks(LinearNvfp4Spec(*LLAMA3_8B[proj], torch.bfloat16, False, False), tokens)
        print(f"{proj} {LLAMA3_8B[proj]} tokens {tokens} {tile}: {report.registers} registers, {report.spills} B "
              f"spilled, {report.shared_memory} B shared, {report.mma}")
        assert report.spills == 0, (proj, tokens, report)
        assert report.mma and all("bf16" in i for i in report.mma), (proj, tokens, report.mma)
