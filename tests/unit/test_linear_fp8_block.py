"""`ad.linear_fp8_block`'s reference (`torch.ops.ad_mlir.linear_fp8_block`) against the
format's arithmetic written out independently in float64, and against the dequantized linear
(what transformers runs on a CPU) within the activation quantization's error; and the path from
a fine-grained FP8 checkpoint to the op: the export routes transformers' `FP8Linear` through it
with the fp8 weight and its scales as graph weights, and the importer makes the `ad` op."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers.integrations.finegrained_fp8 import FP8Linear

from ad_mlir.dialects import ad
from ad_mlir.frontends.export import export_inference, export_model
from ad_mlir.frontends.fx_import import import_program
from ad_mlir.semantics import torch_ops  # noqa: F401 (registers torch.ops.ad_mlir.*)
from ad_mlir.zoo.checkpoints import load_causal_lm
from ad_mlir.zoo.fp8_blocks import dequantize_blocks, quantize_blocks
from ad_mlir.zoo.quantized import write_fp8_block_checkpoint
from ad_mlir.zoo.tiny import TinyConfig, build_model

E4M3_HALF_STEP = 2.0**-4
"""Rounding to e4m3 (3 mantissa bits) moves a normal value by at most 2^-4 of it."""


def _expected(x: torch.Tensor, fp8: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """The format in float64, one token and one group at a time: s = amax / 448, q = x / s
    rounded to e4m3, out = sum over groups of s * (q . dequantized weight row)."""
    bn, bk = block
    w = dequantize_blocks(fp8, scale_inv, block).double()
    rows = x.reshape(-1, x.shape[-1]).float()
    out = torch.zeros(rows.shape[0], fp8.shape[0], dtype=torch.float64)
    for m, row in enumerate(rows):
        for start in range(0, row.numel(), bk):
            group = row[start:start + bk]
            s = group.abs().max() / 448
            q = (group / max(s, torch.tensor(1e-12))).to(torch.float8_e4m3fn).double()
            out[m] += s.double() * (w[:, start:start + bk] @ q)
    return out.view(*x.shape[:-1], -1)


CASES = {
    "fp32_3d": (torch.float32, (2, 5, 64), 48, (16, 32), False),
    "bf16_bias": (torch.bfloat16, (7, 64), 32, (16, 16), True),
    "ragged_blocks": (torch.float32, (3, 50), 40, (16, 32), True),
    "decode_row": (torch.bfloat16, (1, 128), 64, (32, 64), False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_reference_is_the_block_scaled_format(case: str) -> None:
    """Tolerance: the reference adds the same exact fp8 products in fp32, block by block (error
    ~K * 2^-24 relative to the sum of magnitudes), then rounds to the input dtype (bf16: 2^-8)."""
    dtype, shape, n, block, with_bias = CASES[case]
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g) * torch.logspace(-2, 1, shape[-1])).to(dtype)
    fp8, scale_inv = quantize_blocks(torch.randn(n, shape[-1], generator=g), block)
    bias = torch.randn(n, generator=g).to(dtype) if with_bias else None
    got = torch.ops.ad_mlir.linear_fp8_block(x, fp8, scale_inv, bias, list(block))
    assert got.dtype == dtype and got.shape == (*shape[:-1], n)
    expected = _expected(x, fp8, scale_inv, block)
    if bias is not None:
        expected = expected.to(dtype).double() + bias.double()
    rtol = 2.0**-8 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got.double(), expected, rtol=rtol, atol=rtol * expected.abs().max().item() * 2**-4)


def test_reference_is_the_dequantized_linear_within_the_activation_rounding() -> None:
    """Against `x @ dequantized_weight.T` (transformers' CPU path: weights dequantized, the
    activations not quantized): each group's rounding moves x_k by at most 2^-4 |x_k| + s * 2^-10
    (half the subnormal step), so the outputs differ by at most that times |w| summed over k."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(9, 96, generator=g)
    fp8, scale_inv = quantize_blocks(torch.randn(80, 96, generator=g), (16, 32))
    w = dequantize_blocks(fp8, scale_inv, (16, 32))
    got = torch.ops.ad_mlir.linear_fp8_block(x, fp8, scale_inv, None, [16, 32])
    plain = x @ w.T
    s = x.view(9, 3, 32).abs().amax(-1, keepdim=True) / 448
    rounding = (x.view(9, 3, 32).abs() * E4M3_HALF_STEP + s * 2.0**-10).view(9, 96)
    bound = rounding @ w.abs().T
    assert bool(((got - plain).abs() <= bound * (1 + 1e-5) + 1e-6).all())
    assert (got - plain).abs().max() > 0, "the activations are quantized, not passed through"


def test_an_all_zero_token_gives_zeros_not_nan() -> None:
    fp8, scale_inv = quantize_blocks(torch.randn(16, 32), (16, 16))
    x = torch.zeros(2, 32)
    x[1] = torch.randn(32)
    got = torch.ops.ad_mlir.linear_fp8_block(x, fp8, scale_inv, None, [16, 16])
    assert torch.equal(got[0], torch.zeros(16)) and got[1].abs().sum() > 0


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = build_model(TinyConfig(family="llama", layers=1, dtype="bfloat16"))
    return write_fp8_block_checkpoint(model, tmp_path_factory.mktemp("fp8") / "ckpt", (16, 32))


def test_export_keeps_fp8_weights_and_the_import_makes_the_op(checkpoint: Path) -> None:
    """Every quantized linear exports as `ad_mlir.linear_fp8_block` on its fp8 weight and fp32
    scales (graph weights, not constants or dequantized copies); the import makes
    `ad.linear_fp8_block` of those arguments; only the LM head stays an `ad.linear`."""
    model, _ = load_causal_lm(str(checkpoint))
    ep = export_model(model)
    calls = [n for n in ep.graph.nodes if n.op == "call_function"]
    routed = [n for n in calls if n.target is torch.ops.ad_mlir.linear_fp8_block.default]
    assert len(routed) == 7
    for node in routed:
        weight, scales = node.args[1], node.args[2]
        assert weight.meta["val"].dtype == torch.float8_e4m3fn and scales.meta["val"].dtype == torch.float32
        assert weight.name in ep.graph_signature.inputs_to_parameters
    assert sum(n.target is torch.ops.aten.linear.default for n in calls) == 1  # the LM head
    fn = import_program(ep).module.ops.first
    ops = [op for op in fn.body.block.ops if isinstance(op, ad.LinearFp8BlockOp)]
    assert len(ops) == 7 and all(op.blocks() == (16, 32) for op in ops)
    params = {arg: fn.arg_attrs.data[i].data["ad.param"].data for i, arg in enumerate(fn.args)
              if "ad.param" in fn.arg_attrs.data[i].data}
    assert all(params[op.weight].endswith("_proj.weight") and params[op.weight_scale_inv].endswith(
        "_proj.weight_scale_inv") for op in ops)
    assert [type(op).__name__ for op in fn.body.block.ops if isinstance(op, ad.LinearOp)] == ["LinearOp"]


def test_transformers_fp8linear_exports_as_the_op_too() -> None:
    """transformers' own `FP8Linear` (as its loader makes it on a GPU, not our subclass) routes
    through the same op: its forward would call a Hub kernel."""
    layer = FP8Linear(64, 48, block_size=(16, 32))
    fp8, scale_inv = quantize_blocks(torch.randn(48, 64), (16, 32))
    layer.weight, layer.weight_scale_inv = torch.nn.Parameter(fp8, requires_grad=False), torch.nn.Parameter(scale_inv)
    x = torch.randn(3, 64)
    ep = export_inference(layer, {"input": x}, None)
    (node,) = [n for n in ep.graph.nodes if n.op == "call_function"]
    assert node.target is torch.ops.ad_mlir.linear_fp8_block.default
    torch.testing.assert_close(ep.module()(input=x), torch.ops.ad_mlir.linear_fp8_block(x, fp8, scale_inv, None,
                                                                                       [16, 32]))
