"""torch's own RMSNorm (`aten.rms_norm`, `nn.RMSNorm`), which torch.export keeps as one op, becomes
`ad.rms_norm` (`match-rmsnorm`'s `MatchTorchRmsNorm`) and computes what eager does: fp32 at
torch.testing's defaults, bf16 within half a bf16 ulp (torch and the op both compute in fp32 and
round once)."""

from __future__ import annotations

import pytest
import torch

from ad_mlir.frontends.fx_import import import_program
from ad_mlir.passes.pipeline import run_pipeline
from ad_mlir.semantics.reference import evaluate


def _names(program) -> list[str]:  # noqa: ANN001 (an ImportedProgram)
    return [op.target.data if op.name == "ad.torch_op" else op.name for op in program.function.body.block.ops]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("affine", [True, False])
def test_torch_rms_norm_becomes_the_op(affine: bool, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    module = torch.nn.RMSNorm(96, eps=1e-5 if affine else None, elementwise_affine=affine)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_()
    module = module.to(dtype).eval()
    x = (torch.randn(3, 5, 96) * 2 + 0.5).to(dtype)
    program = import_program(torch.export.export(module, (x,)))
    assert "aten.rms_norm.default" in _names(program)
    run_pipeline(program.module, "canonicalize,match-rmsnorm")
    assert _names(program).count("ad.rms_norm") == 1 and "aten.rms_norm.default" not in _names(program)
    with torch.no_grad():
        got, expected = evaluate(program.module, program.weights, [x])[0], module(x)
    assert got.dtype == expected.dtype
    if dtype == torch.float32:
        torch.testing.assert_close(got, expected)
    else:
        torch.testing.assert_close(got.float(), expected.float(), rtol=2.0**-8, atol=1e-5)
