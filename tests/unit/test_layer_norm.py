"""LayerNorm: the spellings models use reach `ad.layer_norm` (import of `aten.layer_norm`,
`match-layernorm` for the spelled-out forms), and the residual add joins it
(`fuse-add-layernorm`), computing what eager computes.

`ad.layer_norm`'s meaning is `torch.ops.ad_mlir.layer_norm`: F.layer_norm's math step by step
(test_llm_ops.py compares the two). Against eager the graph therefore differs only by the order
of the row sums: fp32 within torch.testing's defaults; bf16 within one bf16 rounding of the
result (2^-8 relative, both round to nearest)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ad_mlir.frontends.fx_import import import_program
from ad_mlir.runtime.reference import evaluate


def _assert_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape
    if expected.dtype == torch.float32:
        torch.testing.assert_close(got, expected)
    else:
        torch.testing.assert_close(got.float(), expected.float(), rtol=2.0**-8, atol=1e-5)


class Nemotron1P(torch.nn.LayerNorm):
    """Nemotron's LayerNorm1P: the weight is stored as `w` and applied as `w + 1`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight + 1.0, self.bias, self.eps)


class NoAffine(torch.nn.Module):
    """OLMo's form: F.layer_norm in fp32 without weight or bias, cast back."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.float(), x.shape[-1:], None, None, 1e-5).to(x.dtype)


SPELLINGS = {
    "nn_layer_norm": lambda: torch.nn.LayerNorm(96),
    "no_bias": lambda: torch.nn.LayerNorm(96, bias=False),
    "no_affine": lambda: torch.nn.LayerNorm(96, elementwise_affine=False),
    "one_plus_weight": lambda: Nemotron1P(96),
    "functional_fp32": NoAffine,
}


def _randomized(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_()
    return module.to(dtype).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_layer_norm_spellings_import_as_one_op(spelling: str, dtype: torch.dtype) -> None:
    module = _randomized(SPELLINGS[spelling](), dtype)
    x = (torch.randn(3, 5, 96) * 2 + 0.5).to(dtype)
    program = import_program(torch.export.export(module, (x,)))
    names = [op.target.data if op.name == "ad.torch_op" else op.name for op in program.function.body.block.ops]
    assert names.count("ad.layer_norm") == 1 and not any("layer_norm" in n for n in names if n.startswith("aten")), names
    with torch.no_grad():
        _assert_close(evaluate(program.module, program.weights, [x])[0], module(x))


def test_layer_norm_over_two_dims_stays_opaque() -> None:
    """`ad.layer_norm` normalizes the last dim only: any other normalized shape is carried as
    the torch op it is (and still computes the same)."""
    module = _randomized(torch.nn.LayerNorm((5, 96)), torch.float32)
    x = torch.randn(3, 5, 96)
    program = import_program(torch.export.export(module, (x,)))
    names = [op.target.data if op.name == "ad.torch_op" else op.name for op in program.function.body.block.ops]
    assert "ad.layer_norm" not in names and "aten.layer_norm.default" in names
    with torch.no_grad():
        assert torch.equal(evaluate(program.module, program.weights, [x])[0], module(x))
