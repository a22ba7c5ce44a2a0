"""A compressed-tensors FP8-dynamic linear (`zoo/ct_fp8.py`'s `Fp8ChannelLinear`) through the
export and the import: its forward becomes `ad.quantize_fp8_dynamic` (per token) and
`ad.linear_fp8` on the fp8 weight and its scale as graph weights, whose torch references
compute exactly the module's eager forward (the same fp32 operations in the same order)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ad_mlir.dialects import ad
from ad_mlir.frontends.export import export_inference, export_model
from ad_mlir.frontends.fx_import import import_program
from ad_mlir.semantics import torch_ops  # noqa: F401 (registers torch.ops.ad_mlir.*)
from ad_mlir.zoo.checkpoints import load_causal_lm
from ad_mlir.zoo.ct_fp8 import Fp8ChannelLinear, quantize_weight, write_fp8_dynamic_checkpoint
from ad_mlir.zoo.tiny import TinyConfig, build_model


@pytest.mark.parametrize(("strategy", "dtype"), [("channel", torch.float32), ("tensor", torch.bfloat16)])
def test_the_routed_ops_compute_the_eager_forward_exactly(strategy: str, dtype: torch.dtype) -> None:
    layer = Fp8ChannelLinear(96, 40, strategy, bias=True)
    fp8, scale = quantize_weight(torch.randn(40, 96, generator=torch.Generator().manual_seed(0)), strategy)
    layer.weight = torch.nn.Parameter(fp8, requires_grad=False)
    layer.weight_scale = torch.nn.Parameter(scale.float(), requires_grad=False)
    layer.bias = torch.nn.Parameter(torch.randn(40))
    layer = layer.to(dtype)
    x = torch.randn(2, 3, 96, generator=torch.Generator().manual_seed(1)).to(dtype)
    ep = export_inference(layer, {"input": x}, None)
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert torch.ops.ad_mlir.quantize_fp8_dynamic.default in targets
    assert torch.ops.ad_mlir.linear_fp8.default in targets
    assert torch.equal(ep.module()(input=x), layer(x))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = build_model(TinyConfig(family="llama", layers=1, dtype="bfloat16"))
    return write_fp8_dynamic_checkpoint(model, tmp_path_factory.mktemp("ct") / "ckpt")


def test_export_keeps_fp8_weights_and_the_import_makes_the_ops(checkpoint: Path) -> None:
    """Each of the 7 projections is `ad.linear_fp8` on a weight argument in f8E4M3FN and its
    f32 [N, 1] scale, its input an `ad.quantize_fp8_dynamic per_token`; only the LM head stays an
    `ad.linear`."""
    model, _ = load_causal_lm(str(checkpoint))
    fn = import_program(export_model(model)).module.ops.first
    params = {arg: fn.arg_attrs.data[i].data["ad.param"].data for i, arg in enumerate(fn.args)
              if "ad.param" in fn.arg_attrs.data[i].data}
    ops = [op for op in fn.body.block.ops if isinstance(op, ad.LinearFp8Op)]
    assert len(ops) == 7
    for op in ops:
        assert params[op.weight].endswith("_proj.weight") and params[op.weight_scale].endswith("_proj.weight_scale")
        assert str(op.weight.type.element_type) == "f8E4M3FN"
        assert op.weight_scale.type.get_shape() == (op.weight.type.get_shape()[0], 1)
        assert isinstance(op.input.owner, ad.QuantizeFp8DynamicOp) and op.input.owner.per_token is not None
    assert sum(isinstance(op, ad.LinearOp) for op in fn.body.block.ops) == 1
