"""MXFP4 checkpoints as gpt-oss ships them (`ad_mlir/zoo/mxfp4.py`, E2M1 codes in `zoo/fp4.py`):
the writer's on-disk layout, read back by transformers' own loader (which dequantizes it on a CPU
with `convert_moe_packed_tensors`: the independent reading of the layout) and by ours (which keeps
the bytes and scales); the E2M1 rounding; gpt-oss's expert math on the quantized weights against
transformers' `GptOssExperts` on the dequantized ones; and the refusal of what we do not load, naming the field or tensor."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import safetensors.torch
import torch
import transformers
from transformers.integrations.mxfp4 import FP4_VALUES, convert_moe_packed_tensors

from ad_mlir.zoo import fp4, mxfp4
from ad_mlir.zoo.checkpoints import load_causal_lm
from ad_mlir.zoo.small import model_from_config, small_config

EXPERTS = "model.layers.{}.mlp.experts"


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    """A 2-layer gpt-oss built small (hidden 128, intermediate 256, 4 experts, top 2) in bf16,
    expert biases not zero, and its MXFP4 checkpoint."""
    model = model_from_config(small_config("gpt_oss", 2))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.experts.gate_up_proj_bias.normal_()
            layer.mlp.experts.down_proj_bias.normal_()
    model = model.to(torch.bfloat16)
    return model, mxfp4.write_mxfp4_checkpoint(model, tmp_path_factory.mktemp("mxfp4") / "ckpt")


def test_e2m1_table_and_nibble_order_are_transformers() -> None:
    """The 16 values are transformers' `FP4_VALUES`; the low nibble holds the even element (its
    `convert_moe_packed_tensors` puts `blk & 0x0F` at columns 0::2)."""
    assert fp4.e2m1_values().tolist() == list(FP4_VALUES)
    packed = torch.tensor([[0x71, 0x0F]], dtype=torch.uint8)
    assert fp4.unpack_codes(packed).tolist() == [[1, 7, 15, 0]]
    assert torch.equal(fp4.pack_codes(fp4.unpack_codes(packed)), packed)
    codes = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(fp4.e2m1_values()[codes.long()], torch.tensor(FP4_VALUES))


def test_e2m1_rounds_to_nearest_even_and_saturates() -> None:
    """Each value maps to the nearest code; a value halfway between two goes to the even code
    (mantissa bit 0); beyond 6 saturates to 6."""
    x = torch.tensor([0.24, 0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.1, 7.0, 100.0, -0.75, -2.5, -0.1])
    expected = [0.0, 0.0, 0.5, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, 6.0, -1.0, -2.0, -0.0]
    assert fp4.e2m1_values()[fp4.round_to_codes(x).long()].tolist() == expected
    grid = torch.tensor(FP4_VALUES)
    assert torch.equal(fp4.e2m1_values()[fp4.round_to_codes(grid).long()], grid), "the table's values are their own codes"


def test_writer_writes_gpt_oss_s_layout(written) -> None:  # noqa: ANN001
    model, directory = written
    config = json.loads((directory / "config.json").read_text())
    assert config["quantization_config"] == {"quant_method": "mxfp4", "modules_to_not_convert": mxfp4.NOT_CONVERTED}
    tensors = safetensors.torch.load_file(str(directory / "model.safetensors"))
    for i in range(2):
        name = EXPERTS.format(i)
        shapes = {f"{name}.{k}": (t.dtype, tuple(t.shape)) for k, t in (
            (k.removeprefix(name + "."), v) for k, v in tensors.items() if k.startswith(name))}
        assert shapes == {
            f"{name}.gate_up_proj_blocks": (torch.uint8, (4, 512, 4, 16)),
            f"{name}.gate_up_proj_scales": (torch.uint8, (4, 512, 4)),
            f"{name}.gate_up_proj_bias": (torch.bfloat16, (4, 512)),
            f"{name}.down_proj_blocks": (torch.uint8, (4, 128, 8, 16)),
            f"{name}.down_proj_scales": (torch.uint8, (4, 128, 8)),
            f"{name}.down_proj_bias": (torch.bfloat16, (4, 128)),
        }
    assert tensors["model.layers.0.self_attn.q_proj.weight"].dtype == torch.bfloat16
    assert tensors["model.layers.0.mlp.router.weight"].dtype == torch.bfloat16


def test_written_experts_are_the_model_s_within_mxfp4_rounding(written) -> None:  # noqa: ANN001
    """Read with transformers' `convert_moe_packed_tensors` (its dequantizing load's function),
    each weight is the original within half an E2M1 step of its block's scale: at most 2^-2 of
    the block's amax (the step between 4 and 6 is 2 of 8 = 2^(floor(log2 amax) - 2 + 3)), or the
    clipped rest above 6 (amax / 4 below it: 8 - 6). Each block's largest magnitude lands in
    [4, 8) times its scale, so no block's scale is off by a power of two."""
    model, directory = written
    tensors = safetensors.torch.load_file(str(directory / "model.safetensors"))
    for proj in mxfp4.PROJECTIONS:
        blocks, scales = tensors[f"model.layers.1.mlp.experts.{proj}_blocks"], tensors[f"model.layers.1.mlp.experts.{proj}_scales"]
        original = getattr(model.model.layers[1].mlp.experts, proj).float()  # [E, in, out]
        got = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
        assert got.shape == original.shape
        amax = original.transpose(1, 2).unflatten(-1, (-1, 32)).abs().amax(-1)  # [E, out, blocks]
        bound = (amax / 4).repeat_interleave(32, -1).transpose(1, 2)
        assert ((got - original).abs() <= bound).all()
        scale = torch.ldexp(torch.ones(scales.shape), scales.int() - 127)
        assert ((amax >= 4 * scale) & (amax < 8 * scale)).all()
        assert ((got - original).norm() / original.norm()) < 0.15  # gaussian weights: ~0.115


def test_transformers_and_our_loader_read_the_same_weights(written) -> None:  # noqa: ANN001
    """transformers dequantizes the experts on a CPU; ours keeps the uint8 bytes and scales through
    the cast to fp32, and dequantizes them (`mx_dequantize`) to the same values, bit for bit."""
    _, directory = written
    dequantized = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    ours, _ = load_causal_lm(str(directory))
    tensors = safetensors.torch.load_file(str(directory / "model.safetensors"))
    for i in range(2):
        experts = ours.model.layers[i].mlp.experts
        assert isinstance(experts, mxfp4.Mxfp4Experts)
        for proj in mxfp4.PROJECTIONS:
            blocks, scales = getattr(experts, f"{proj}_blocks"), getattr(experts, f"{proj}_scales")
            assert torch.equal(blocks, tensors[f"{EXPERTS.format(i)}.{proj}_blocks"])
            assert torch.equal(scales, tensors[f"{EXPERTS.format(i)}.{proj}_scales"])
            theirs = getattr(dequantized.model.layers[i].mlp.experts, proj)
            assert torch.equal(mxfp4.mx_dequantize(blocks, scales, torch.float32).transpose(1, 2), theirs)
            assert getattr(experts, f"{proj}_bias").dtype == torch.float32


def test_experts_math_is_gpt_oss_s_on_the_dequantized_weights(written) -> None:  # noqa: ANN001
    """`gpt_oss_experts` on the MXFP4 tensors against transformers' `GptOssExperts` (its grouped
    form, what the model runs) holding the dequantized weights, in fp32 and bf16 on the same
    routing: the interleaved gate/up, the clamped SwiGLU (inputs wide enough to reach the limit),
    the biases; the error relative to the largest output. fp32: only the order of sums differs
    (measured 4.0e-7; bound 1e-6); bf16: the same roundings at the same points, the GEMMs' inner
    order apart (measured: equal; bound one bf16 ulp of the largest output, 2^-7)."""
    _, directory = written
    dequantized = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    ours, _ = load_causal_lm(str(directory))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 128, generator=g) * 20
    for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 2.0**-7)):
        hf_experts = dequantized.model.layers[0].mlp.experts.to(dtype)
        experts = ours.model.layers[0].mlp.experts.to(dtype)
        logits = dequantized.model.layers[0].mlp.router.to(dtype)(x.to(dtype))[0]
        weights, chosen = mxfp4.gpt_oss_route(logits, 2)
        with torch.no_grad():
            gate_up = x.to(dtype) @ hf_experts.gate_up_proj[0] + hf_experts.gate_up_proj_bias[0]
            assert gate_up.abs().max() > experts.limit, "the clamp is reached"
            theirs = hf_experts(x.to(dtype), chosen, weights).float()
            got = experts(x.to(dtype), chosen, weights).float()
        error = (got - theirs).abs().max() / theirs.abs().max()
        assert error <= tol, f"{dtype}: {error:.3g}"


def _rewrite(directory: Path, tmp_path: Path, quantization: dict | None = None,
             tensors: dict | None = None) -> Path:
    target = tmp_path / "edited"
    target.mkdir()
    config = json.loads((directory / "config.json").read_text())
    if quantization is not None:
        config["quantization_config"] = quantization
    (target / "config.json").write_text(json.dumps(config))
    written = safetensors.torch.load_file(str(directory / "model.safetensors"))
    safetensors.torch.save_file({**written, **(tensors or {})}, str(target / "model.safetensors"))
    return target


@pytest.mark.parametrize(("quantization", "message"), [
    ({"quant_method": "mxfp4", "dequantize": True}, 'quantization_config.dequantize = true: not supported'),
    ({"quant_method": "mxfp4", "modules_to_not_convert": "lm_head"},
     'quantization_config.modules_to_not_convert = "lm_head": must be a list of module names'),
])
def test_refuses_what_it_does_not_load(written, tmp_path: Path, quantization: dict, message: str) -> None:  # noqa: ANN001
    _, directory = written
    with pytest.raises(ValueError, match=re.escape(message)):
        load_causal_lm(str(_rewrite(directory, tmp_path, quantization)))


def test_refuses_mxfp4_on_another_model(tmp_path: Path) -> None:
    model = model_from_config(small_config("llama", 1))
    model.config.quantization_config = {"quant_method": "mxfp4"}
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=re.escape('quantization_config.quant_method = "mxfp4": ad-mlir loads MXFP4 '
                                                   "for gpt_oss's experts only")):
        load_causal_lm(str(tmp_path))


@pytest.mark.parametrize(("key", "value", "message"), [
    ("model.layers.0.mlp.experts.gate_up_proj_scales", torch.zeros(4, 512, 5, dtype=torch.uint8),
     "gate_up_proj_scales is torch.uint8 [4, 512, 5], expected uint8 [4, 512, 4]"),
    ("model.layers.0.mlp.experts.down_proj_blocks", torch.zeros(4, 128, 8, 16, dtype=torch.int8),
     "down_proj_blocks is torch.int8 [4, 128, 8, 16], expected uint8"),
    ("model.layers.0.mlp.experts.down_proj_scales", torch.full((4, 128, 8), 255, dtype=torch.uint8),
     "down_proj_scales holds 255 (E8M0's NaN)"),
])
def test_refuses_a_wrong_tensor_naming_it(written, tmp_path: Path, key: str, value: torch.Tensor,  # noqa: ANN001
                                          message: str) -> None:
    _, directory = written
    with pytest.raises(ValueError, match=re.escape(message)):
        load_causal_lm(str(_rewrite(directory, tmp_path, tensors={key: value})))
