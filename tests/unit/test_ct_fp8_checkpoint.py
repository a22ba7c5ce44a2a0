"""compressed-tensors FP8-dynamic checkpoints (`ad_mlir/zoo/ct_fp8.py`): the writer's on-disk
layout (what Red Hat / Neural Magic's FP8-dynamic models ship), our loader keeping the fp8 bytes
and scales, the eager linear's arithmetic, and the refusal of every `quantization_config` we do
not load, naming the field.

The writer's bytes were checked against compressed-tensors 0.20.1 itself (`calculate_qparams`
then `quantize`, outside this repository, which does not depend on it): equal scales and fp8
bytes for both strategies; transformers 5.24 with that library dequantizes such a checkpoint on
a CPU to `(fp8.to(scale.dtype) * scale).float()` (`dequantized` below)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import safetensors.torch
import torch

from ad_mlir.zoo.checkpoints import load_causal_lm
from ad_mlir.zoo.ct_fp8 import Fp8ChannelLinear, channel_linear, quantize_tokens, write_fp8_dynamic_checkpoint
from ad_mlir.zoo.tiny import TinyConfig, build_model

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")


def dequantized(fp8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The weight as transformers' compressed-tensors quantizer dequantizes it on a CPU."""
    return (fp8.to(scale.dtype) * scale).float()


@pytest.fixture(scope="module", params=["channel", "tensor"])
def written(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module,
                                                                                                 Path, str]:
    """A tiny bf16 Llama (2 layers, hidden 64, intermediate 128) and its FP8-dynamic checkpoint."""
    model = build_model(TinyConfig(family="llama", layers=2, dtype="bfloat16"))
    directory = write_fp8_dynamic_checkpoint(model, tmp_path_factory.mktemp("ct") / "ckpt", request.param)
    return model, directory, request.param


def test_writer_writes_the_fp8_dynamic_layout(written) -> None:
    model, directory, strategy = written
    config = json.loads((directory / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "compressed-tensors" and config["format"] == "float-quantized"
    group = config["config_groups"]["group_0"]
    assert group["targets"] == ["Linear"] and config["ignore"] == ["lm_head"]
    assert {k: group["weights"][k] for k in ("num_bits", "type", "strategy", "symmetric", "dynamic")} == \
        {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True, "dynamic": False}
    assert {k: group["input_activations"][k] for k in ("num_bits", "type", "strategy", "symmetric", "dynamic")} == \
        {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True, "dynamic": True}
    tensors = safetensors.torch.load_file(str(directory / "model.safetensors"))
    quantized = {f"model.layers.{i}.{name}" for i in range(2) for name in LINEARS}
    assert {k.removesuffix(".weight_scale") for k in tensors if k.endswith(".weight_scale")} == quantized
    for name in quantized:
        weight, scale = tensors[f"{name}.weight"], tensors[f"{name}.weight_scale"]
        assert weight.dtype == torch.float8_e4m3fn and scale.dtype == torch.bfloat16
        assert tuple(scale.shape) == ((weight.shape[0], 1) if strategy == "channel" else (1,))
    assert not any(k.endswith("input_scale") for k in tensors), "dynamic activations have no stored scale"
    assert tensors["lm_head.weight"].dtype == torch.bfloat16


def test_written_weights_are_the_model_s_within_e4m3_rounding(written) -> None:
    """Each row's (or the tensor's) largest weight maps to 448 (so the scale is amax / 448), and
    dequantized each weight is the original within half an e4m3 step, 2^-4 of its value, or half
    the subnormal step 2^-10 of the scale near 0, plus the bf16 rounding of the product (2^-9)."""
    model, directory, strategy = written
    tensors = safetensors.torch.load_file(str(directory / "model.safetensors"))
    for name in LINEARS:
        original = model.get_submodule(f"model.layers.1.{name}").weight.float()
        fp8, scale = tensors[f"model.layers.1.{name}.weight"], tensors[f"model.layers.1.{name}.weight_scale"]
        amax = fp8.float().abs().amax(dim=1) if strategy == "channel" else fp8.float().abs().amax()
        assert bool((amax == 448).all()), name
        got = dequantized(fp8, scale)
        bound = original.abs() * (2.0**-4 + 2.0**-9) + scale.float() * 2.0**-10
        assert bool(((got - original).abs() <= bound).all()), name
        assert (got != original).any(), "bf16 weights do not all fit e4m3"


def test_loader_keeps_the_fp8_weights_and_their_scales(written) -> None:
    """`load_causal_lm` (fp32 on a CPU) and a later cast to bf16 leave every quantized linear's
    fp8 bytes as the file has them, its scale widened exactly to fp32; the rest follows the cast."""
    _, directory, strategy = written
    tensors = safetensors.torch.load_file(str(directory / "model.safetensors"))
    model, _ = load_causal_lm(str(directory))
    for dtype in (torch.float32, torch.bfloat16):
        model = model.to(dtype)
        for i in range(2):
            for name in LINEARS:
                key = f"model.layers.{i}.{name}"
                module = model.get_submodule(key)
                assert isinstance(module, Fp8ChannelLinear) and module.weight.dtype == torch.float8_e4m3fn
                assert torch.equal(module.weight.view(torch.uint8), tensors[f"{key}.weight"].view(torch.uint8))
                assert module.weight_scale.dtype == torch.float32
                assert torch.equal(module.weight_scale, tensors[f"{key}.weight_scale"].float())
        assert type(model.lm_head) is torch.nn.Linear and model.lm_head.weight.dtype == dtype
        assert model.model.norm.weight.dtype == dtype


def test_channel_linear_is_the_fp8_product_times_both_scales() -> None:
    """Against the format's arithmetic in float64: each token quantized with amax / 448 (its
    largest element maps to 448), the fp8 x fp8 product exact, times the token's and the
    channel's scales. fp32 sums of K = 96 products and the fp32 scale products: within 1e-5
    relative to the row's magnitude. An all-zero token gives zeros."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 96, generator=gen) * torch.tensor([1.0, 1e-3, 50.0, 0.0, 1.0])[:, None]
    weight = (torch.randn(24, 96, generator=gen) * 100).to(torch.float8_e4m3fn)
    scale = torch.rand(24, 1, generator=gen) + 0.01
    bias = torch.randn(24, generator=gen)
    q, s = quantize_tokens(x)
    assert torch.equal(q.float().abs().amax(-1)[[0, 1, 2, 4]], torch.full((4,), 448.0))
    expected = (q.double() @ weight.double().T) * s.double() * scale.double().T + bias.double()
    got = channel_linear(x, weight, scale, bias)
    magnitude = (q.double().abs() @ weight.double().abs().T * s.double() * scale.double().T).amax(-1, keepdim=True)
    assert bool(((got.double() - expected).abs() <= 1e-5 * magnitude + 1e-6).all())
    assert torch.equal(got[3], bias), "an all-zero token contributes nothing"
    assert (got.double() - (x.double() @ dequantized(weight, scale).double().T + bias.double())).abs().max() > 0, \
        "the activations are quantized"


REFUSED = [
    ("format", "pack-quantized"),
    ("config_groups.group_0.weights.strategy", "group"),
    ("config_groups.group_0.weights.strategy", "block"),
    ("config_groups.group_0.weights.num_bits", 4),
    ("config_groups.group_0.weights.type", "int"),
    ("config_groups.group_0.weights.symmetric", False),
    ("config_groups.group_0.weights.group_size", 128),
    ("config_groups.group_0.input_activations.dynamic", False),
    ("config_groups.group_0.input_activations.strategy", "tensor"),
    ("config_groups.group_0.input_activations", None),
    ("config_groups.group_0.targets", ["re:.*mlp.*"]),
    ("config_groups.group_0.output_activations", {"num_bits": 8}),
    ("kv_cache_scheme", {"num_bits": 8, "type": "float", "strategy": "tensor"}),
]


def _set(config: dict, path: str, value: object) -> None:
    *parents, last = path.split(".")
    for key in parents:
        config = config[key]
    config[last] = value


@pytest.mark.parametrize(("field", "value"), REFUSED, ids=[f"{f}={json.dumps(v)}" for f, v in REFUSED])
def test_unsupported_quantization_config_is_refused_naming_the_field(written, tmp_path: Path, field: str,
                                                                    value: object) -> None:
    _, directory, _ = written
    config = json.loads((directory / "config.json").read_text())
    _set(config["quantization_config"], field, value)
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(directory / "model.safetensors", tmp_path)
    with pytest.raises(ValueError, match=rf"quantization_config\.{re.escape(field)} = {re.escape(json.dumps(value))}"):
        load_causal_lm(str(tmp_path))


def test_a_second_config_group_is_refused(written, tmp_path: Path) -> None:
    _, directory, _ = written
    config = json.loads((directory / "config.json").read_text())
    groups = config["quantization_config"]["config_groups"]
    groups["group_1"] = groups["group_0"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(directory / "model.safetensors", tmp_path)
    with pytest.raises(ValueError, match=r"quantization_config\.config_groups = .*must hold one group"):
        load_causal_lm(str(tmp_path))


def test_static_input_scales_and_wrong_scales_are_refused_naming_the_tensor(written, tmp_path: Path) -> None:
    _, directory, strategy = written
    tensors = safetensors.torch.load_file(str(directory / "model.safetensors"))
    shutil.copy(directory / "config.json", tmp_path)
    key = "model.layers.1.mlp.down_proj.input_scale"
    safetensors.torch.save_file({**tensors, key: torch.ones(1)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"{key}: static activation scales are not supported"):
        load_causal_lm(str(tmp_path))
    key = "model.layers.1.mlp.down_proj.weight_scale"
    wrong = torch.ones(64, 2, dtype=torch.bfloat16)
    safetensors.torch.save_file({**tensors, key: wrong}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"{key} is torch.bfloat16 \[64, 2\], expected a float"):
        load_causal_lm(str(tmp_path))
