"""Fine-grained (block-scaled) FP8 checkpoints (`ad_mlir/zoo/quantized.py`): the writer's
on-disk layout (what Qwen3-*-FP8 and DeepSeek-V3 ship), read back by transformers' own loader
(which dequantizes on a CPU) and by ours (which keeps the fp8 bytes and the scales), and the
refusal of every `quantization_config` we do not load, naming the field."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import safetensors.torch
import torch
import transformers

from ad_mlir.zoo.checkpoints import load_causal_lm
from ad_mlir.zoo.fp8_blocks import dequantize_blocks, quantize_blocks
from ad_mlir.zoo.quantized import Fp8BlockLinear, write_fp8_block_checkpoint
from ad_mlir.zoo.tiny import TinyConfig, build_model

BLOCK = (16, 32)
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    """A tiny bf16 Llama (2 layers, hidden 64, intermediate 128) and its FP8 checkpoint."""
    model = build_model(TinyConfig(family="llama", layers=2, dtype="bfloat16"))
    return model, write_fp8_block_checkpoint(model, tmp_path_factory.mktemp("fp8") / "ckpt", BLOCK)


def test_writer_writes_the_fine_grained_fp8_layout(written) -> None:
    model, directory = written
    config = json.loads((directory / "config.json").read_text())
    assert config["quantization_config"] == {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                             "weight_block_size": list(BLOCK)}
    tensors = safetensors.torch.load_file(str(directory / "model.safetensors"))
    quantized = {f"model.layers.{i}.{name}" for i in range(2) for name in LINEARS}
    assert {k.removesuffix(".weight_scale_inv") for k in tensors if k.endswith("_scale_inv")} == quantized
    for name in quantized:
        weight, scale = tensors[f"{name}.weight"], tensors[f"{name}.weight_scale_inv"]
        rows, cols = weight.shape
        assert weight.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
        assert tuple(scale.shape) == (-(-rows // BLOCK[0]), -(-cols // BLOCK[1]))
    for name in ("lm_head.weight", "model.embed_tokens.weight", "model.norm.weight",
                 "model.layers.0.input_layernorm.weight"):
        assert tensors[name].dtype == torch.bfloat16, f"{name} stays in the model's dtype"


def test_written_weights_are_the_model_s_within_e4m3_rounding(written) -> None:
    """Dequantized, each weight is the original within half an e4m3 step: 2^-4 of its value
    (3 mantissa bits), or half the subnormal step 2^-9 of the block's scale near 0. A wrong
    scale, a transposed block or a block applied to the wrong rows is far outside it."""
    model, directory = written
    tensors = safetensors.torch.load_file(str(directory / "model.safetensors"))
    for name in LINEARS:
        original = model.get_submodule(f"model.layers.1.{name}").weight.float()
        scale = tensors[f"model.layers.1.{name}.weight_scale_inv"]
        dequantized = dequantize_blocks(tensors[f"model.layers.1.{name}.weight"], scale, BLOCK)
        per_element = scale.repeat_interleave(BLOCK[0], 0).repeat_interleave(BLOCK[1], 1)
        bound = original.abs() * 2.0**-4 + per_element * 2.0**-10
        assert bool(((dequantized - original).abs() <= bound).all()), name
        assert (dequantized != original).any(), "bf16 weights do not all fit e4m3"


def test_ragged_blocks_quantize_and_dequantize_edge_blocks() -> None:
    """N, K not multiples of the block: the edge blocks are the rest (FP8Linear's ceil)."""
    weight = torch.randn(40, 50, generator=torch.Generator().manual_seed(0))
    fp8, scale = quantize_blocks(weight, (16, 32))
    assert fp8.shape == (40, 50) and scale.shape == (3, 2)
    torch.testing.assert_close(scale[2, 1], weight[32:, 32:].abs().amax() / 448, rtol=2.0**-23, atol=0)
    torch.testing.assert_close(dequantize_blocks(fp8, scale, (16, 32)), weight, rtol=2.0**-4, atol=2.0**-10)


def test_transformers_reads_the_checkpoint_as_written(written) -> None:
    """transformers' own loader (on a CPU it dequantizes: `Fp8Dequantize`) gives every weight
    as `fp8 * scale_inv` of what we wrote, bit for bit, and the unquantized tensors as they are:
    our names, dtypes and block layout are the format's."""
    model, directory = written
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    tensors = safetensors.torch.load_file(str(directory / "model.safetensors"))
    for i in range(2):
        for name in LINEARS:
            key = f"model.layers.{i}.{name}"
            expected = dequantize_blocks(tensors[f"{key}.weight"], tensors[f"{key}.weight_scale_inv"], BLOCK)
            assert torch.equal(hf.get_submodule(key).weight, expected), key
    assert torch.equal(hf.lm_head.weight, model.lm_head.weight.float())


def test_loader_keeps_the_fp8_weights_and_their_scales(written) -> None:
    """`load_causal_lm` (fp32 on a CPU) and a later cast to bf16 leave every quantized linear's
    fp8 bytes and fp32 scales as the file has them; the rest follows the cast."""
    _, directory = written
    tensors = safetensors.torch.load_file(str(directory / "model.safetensors"))
    model, _ = load_causal_lm(str(directory))
    for dtype in (torch.float32, torch.bfloat16):
        model = model.to(dtype)
        for i in range(2):
            for name in LINEARS:
                key = f"model.layers.{i}.{name}"
                module = model.get_submodule(key)
                assert isinstance(module, Fp8BlockLinear) and module.block_size == BLOCK
                assert module.weight.dtype == torch.float8_e4m3fn
                assert torch.equal(module.weight.view(torch.uint8), tensors[f"{key}.weight"].view(torch.uint8))
                assert torch.equal(module.weight_scale_inv, tensors[f"{key}.weight_scale_inv"])
        assert type(model.lm_head) is torch.nn.Linear and model.lm_head.weight.dtype == dtype
        assert model.model.norm.weight.dtype == dtype


REFUSED = [
    ("quant_method", "bitsandbytes"),
    ("fmt", "e5m2"),
    ("activation_scheme", "static"),
    ("scale_fmt", "ue8m0"),
    ("weight_block_size", [96, 128]),
    ("weight_block_size", [8, 8]),
    ("weight_block_size", None),
    ("weight_block_size", [128]),
]


@pytest.mark.parametrize(("field", "value"), REFUSED, ids=[f"{f}={json.dumps(v)}" for f, v in REFUSED])
def test_unsupported_quantization_config_is_refused_naming_the_field(written, tmp_path: Path, field: str,
                                                                    value: object) -> None:
    _, directory = written
    config = json.loads((directory / "config.json").read_text())
    config["quantization_config"][field] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(directory / "model.safetensors", tmp_path)
    with pytest.raises(ValueError, match=rf"quantization_config\.{field} = {re.escape(json.dumps(value))}"):
        load_causal_lm(str(tmp_path))


def test_a_scale_of_the_wrong_shape_is_refused_naming_the_tensor(written, tmp_path: Path) -> None:
    _, directory = written
    tensors = safetensors.torch.load_file(str(directory / "model.safetensors"))
    key = "model.layers.1.mlp.down_proj.weight_scale_inv"
    tensors[key] = tensors[key][:, :1].contiguous()
    shutil.copy(directory / "config.json", tmp_path)
    safetensors.torch.save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"{key} is torch.float32 \[4, 1\], expected float32 \[4, 4\]"):
        load_causal_lm(str(tmp_path))


def test_modules_to_not_convert_stay_unquantized_and_tied_embeddings_load_tied(tmp_path: Path) -> None:
    """A Gemma (LM head tied to the embeddings: written once, as `save_pretrained` does) whose
    second layer's MLP the config leaves unquantized: those linears keep bf16 weights and no
    scales, load as plain linears, and transformers reads the same checkpoint to the same weights."""
    model = build_model(TinyConfig(family="gemma", layers=2, dtype="bfloat16"))
    directory = write_fp8_block_checkpoint(model, tmp_path / "gemma-fp8", BLOCK, ["model.layers.1.mlp"])
    config = json.loads((directory / "config.json").read_text())
    assert config["quantization_config"]["modules_to_not_convert"] == ["model.layers.1.mlp"]
    tensors = safetensors.torch.load_file(str(directory / "model.safetensors"))
    assert "lm_head.weight" not in tensors and tensors["model.layers.1.mlp.up_proj.weight"].dtype == torch.bfloat16
    assert "model.layers.1.mlp.up_proj.weight_scale_inv" not in tensors
    ours, _ = load_causal_lm(str(directory))
    assert type(ours.model.layers[1].mlp.up_proj) is torch.nn.Linear
    assert isinstance(ours.model.layers[1].self_attn.q_proj, Fp8BlockLinear)
    assert isinstance(ours.model.layers[0].mlp.up_proj, Fp8BlockLinear)
    assert ours.lm_head.weight is ours.model.embed_tokens.weight
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    assert torch.equal(hf.model.layers[1].mlp.up_proj.weight, ours.model.layers[1].mlp.up_proj.weight)
    assert torch.equal(hf.lm_head.weight, ours.model.embed_tokens.weight)
    q = ours.model.layers[1].self_attn.q_proj
    assert torch.equal(hf.model.layers[1].self_attn.q_proj.weight, dequantize_blocks(q.weight, q.weight_scale_inv,
                                                                                      BLOCK))


def test_a_sharded_checkpoint_loads_through_its_index(written, tmp_path: Path) -> None:
    """Released checkpoints come in shards named by `model.safetensors.index.json`."""
    _, directory = written
    tensors = safetensors.torch.load_file(str(directory / "model.safetensors"))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in shards.items():
        safetensors.torch.save_file({k: tensors[k] for k in keys}, str(tmp_path / file))
    weight_map = {k: file for file, keys in shards.items() for k in keys}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    shutil.copy(directory / "config.json", tmp_path)
    model, _ = load_causal_lm(str(tmp_path))
    module = model.model.layers[1].mlp.gate_proj
    assert torch.equal(module.weight.view(torch.uint8),
                       tensors["model.layers.1.mlp.gate_proj.weight"].view(torch.uint8))
    assert torch.equal(model.model.norm.weight, tensors["model.norm.weight"].float())
