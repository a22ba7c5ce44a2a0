"""ModelOpt NVFP4 checkpoints (`ad_mlir/zoo/modelopt.py`, the arithmetic in `zoo/nvfp4.py` and
the e2m1 codes in `zoo/fp4.py`): e2m1 rounding and packing, the writer's on-disk layout (what
nvidia/Llama-3.1-8B-Instruct-FP4 ships), its weights within NVFP4's rounding of the model's,
our loader keeping the packed codes and the scales through casts, both config layouts (config.json's
`quantization_config`, or hf_quant_config.json alone), and the refusal of every field we do not
load, named. (transformers has no loader for these checkpoints: nothing to read them back with.)"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import safetensors.torch
import torch

from ad_mlir.zoo import fp4, nvfp4
from ad_mlir.zoo.checkpoints import load_causal_lm
from ad_mlir.zoo.modelopt import Nvfp4Linear, write_nvfp4_checkpoint
from ad_mlir.zoo.tiny import TinyConfig, build_model

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")


def test_e2m1_rounding_is_to_nearest_ties_to_even_with_the_sign_kept() -> None:
    """Each midpoint between two magnitudes goes to the even code; past 6 saturates; a negative
    value that rounds to 0 keeps its sign (code 8, -0), as ModelOpt writes it."""
    x = torch.tensor([0.0, 0.24, 0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.1, 9.0, -0.1, -1.6, -100.0])
    codes = fp4.round_to_codes(x)
    assert codes.tolist() == [0, 0, 0, 1, 2, 2, 4, 4, 6, 6, 7, 7, 8, 11, 15]
    assert fp4.e2m1_values()[codes.long()].tolist() == [0, 0, 0, 0.5, 1, 1, 2, 2, 4, 4, 6, 6, -0.0, -1.5, -6]


def test_packing_puts_the_even_element_in_the_low_nibble() -> None:
    codes = torch.tensor([[1, 2, 15, 8]], dtype=torch.uint8)
    packed = fp4.pack_codes(codes)
    assert packed.tolist() == [[0x21, 0x8F]]
    assert torch.equal(fp4.unpack_codes(packed), codes)
    assert fp4.decode(packed).tolist() == [[0.5, 1.0, -6.0, -0.0]]


def test_quantize_follows_the_modelopt_scales() -> None:
    """The global scale is amax / (6 * 448); each block scale is the block's amax / 6 / global in
    e4m3 (so the tensor's largest block scale is 448); an all-zero block gets scale 1 and codes 0."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4, 48, generator=g) * torch.logspace(-2, 1, 48)
    w[1, 16:32] = 0
    packed, block, scale_2 = nvfp4.quantize(w)
    assert packed.shape == (4, 24) and block.shape == (4, 3) and scale_2.shape == ()
    assert scale_2 == w.abs().max() / 2688
    assert block.float().max() == 448
    expected = (w.view(4, 3, 16).abs().amax(-1) / (6 * scale_2)).to(torch.float8_e4m3fn).float()
    expected[1, 1] = 1.0
    assert torch.equal(block.float(), expected)
    assert not fp4.unpack_codes(packed)[1, 16:32].any()


def test_dequantized_weight_is_within_half_an_e2m1_step() -> None:
    """Each element of a block moves by at most half the spacing of the e2m1 grid at its
    magnitude times its block's scale (1 at 4..6, 0.5 at 2..4, 0.25 below 2), plus the block
    scale's own e4m3 rounding (2^-4 of the block's largest value)."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(16, 64, generator=g)
    packed, block, scale_2 = nvfp4.quantize(w)
    deq = nvfp4.dequantize(packed, block, scale_2)
    unit = (block.float() * scale_2).repeat_interleave(16, 1)
    magnitude = (w.abs() / unit)
    half_step = torch.where(magnitude > 4, 1.0, torch.where(magnitude > 2, 0.5, 0.25)) * unit
    block_max = w.view(16, 4, 16).abs().amax(-1).repeat_interleave(16, 1)
    assert bool(((deq - w).abs() <= half_step + block_max * 2.0**-4).all())
    assert (deq != w).any()


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    """A tiny bf16 Qwen2 (biases on q/k/v; 2 layers, hidden 64) and its NVFP4 checkpoint."""
    model = build_model(TinyConfig(family="qwen2", layers=2, dtype="bfloat16"))
    return model, write_nvfp4_checkpoint(model, tmp_path_factory.mktemp("nvfp4") / "ckpt")


def test_writer_writes_the_modelopt_layout(written) -> None:  # noqa: ANN001
    model, directory = written
    hf_quant = json.loads((directory / "hf_quant_config.json").read_text())
    assert hf_quant["producer"]["name"] == "modelopt"
    assert hf_quant["quantization"] == {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                                        "exclude_modules": ["lm_head"]}
    config = json.loads((directory / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "modelopt" and config["quant_algo"] == "NVFP4" and config["ignore"] == ["lm_head"]
    fp4_args = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}
    assert config["config_groups"] == {"group_0": {"weights": fp4_args, "input_activations": fp4_args,
                                                   "targets": ["Linear"]}}
    tensors = safetensors.torch.load_file(str(directory / "model.safetensors"))
    quantized = {f"model.layers.{i}.{name}" for i in range(2) for name in LINEARS}
    assert {k.removesuffix(".weight_scale_2") for k in tensors if k.endswith(".weight_scale_2")} == quantized
    for name in quantized:
        n, k = model.get_submodule(name).weight.shape
        assert (tensors[f"{name}.weight"].dtype, tuple(tensors[f"{name}.weight"].shape)) == (torch.uint8, (n, k // 2))
        scale = tensors[f"{name}.weight_scale"]
        assert (scale.dtype, tuple(scale.shape)) == (torch.float8_e4m3fn, (n, k // 16))
        for scalar in ("weight_scale_2", "input_scale"):
            assert tensors[f"{name}.{scalar}"].dtype == torch.float32 and tensors[f"{name}.{scalar}"].shape == ()
        assert tensors[f"{name}.input_scale"] > 0
    assert tensors["model.layers.0.self_attn.q_proj.bias"].dtype == torch.bfloat16
    for name in ("lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"):
        assert tensors[name].dtype == torch.bfloat16, f"{name} stays in the model's dtype"


def test_loader_keeps_the_packed_codes_and_their_scales(written) -> None:  # noqa: ANN001
    """`load_causal_lm` (fp32 on a CPU) and a later cast to bf16 leave every quantized linear's
    bytes and scales as the file has them; the rest (biases included) follows the cast; the
    eager module computes `nvfp4.linear`."""
    _, directory = written
    tensors = safetensors.torch.load_file(str(directory / "model.safetensors"))
    model, _ = load_causal_lm(str(directory))
    for dtype in (torch.float32, torch.bfloat16):
        model = model.to(dtype)
        for i in range(2):
            for name in LINEARS:
                key = f"model.layers.{i}.{name}"
                module = model.get_submodule(key)
                assert isinstance(module, Nvfp4Linear)
                for part in Nvfp4Linear.QUANTIZED:
                    got, stored = getattr(module, part), tensors[f"{key}.{part}"]
                    assert got.dtype == stored.dtype and torch.equal(got.reshape(-1).view(torch.uint8),
                                                                     stored.reshape(-1).view(torch.uint8))
        assert model.model.layers[0].self_attn.q_proj.bias.dtype == dtype
        assert type(model.lm_head) is torch.nn.Linear and model.lm_head.weight.dtype == dtype
    q = model.model.layers[1].self_attn.q_proj
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    assert torch.equal(q(x), nvfp4.linear(x, q.weight, q.weight_scale, q.weight_scale_2, q.bias))


def test_an_older_export_with_hf_quant_config_alone_loads(written, tmp_path: Path) -> None:  # noqa: ANN001
    """ModelOpt's older exports have no `quantization_config` in config.json: hf_quant_config.json
    says what the checkpoint is."""
    _, directory = written
    config = json.loads((directory / "config.json").read_text())
    del config["quantization_config"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    for name in ("hf_quant_config.json", "model.safetensors"):
        shutil.copy(directory / name, tmp_path)
    model, _ = load_causal_lm(str(tmp_path))
    assert isinstance(model.model.layers[1].mlp.down_proj, Nvfp4Linear)


REFUSED = [
    ("quant_algo", "FP8"),
    ("quant_algo", "W4A8_AWQ"),
    ("quant_algo", "NVFP4_AWQ"),
    ("group_size", 32),
    ("kv_cache_scheme", {"dynamic": False, "num_bits": 8, "type": "float"}),
    ("config_groups.group_0.weights.group_size", 32),
    ("config_groups.group_0.weights.num_bits", 8),
    ("config_groups.group_0.targets", ["Linear", "Embedding"]),
]


def _set(fields: dict, path: str, value: object) -> None:
    *parents, last = path.split(".")
    for part in parents:
        fields = fields[part]
    fields[last] = value


@pytest.mark.parametrize(("field", "value"), REFUSED, ids=[f"{f}={json.dumps(v)}" for f, v in REFUSED])
def test_unsupported_quantization_config_is_refused_naming_the_field(written, tmp_path: Path, field: str,  # noqa: ANN001
                                                                    value: object) -> None:
    _, directory = written
    config = json.loads((directory / "config.json").read_text())
    _set(config["quantization_config"], field, value)
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(directory / "model.safetensors", tmp_path)
    with pytest.raises(ValueError, match=rf"quantization_config\.{re.escape(field)} = {re.escape(json.dumps(value))}"):
        load_causal_lm(str(tmp_path))


def test_hf_quant_config_fields_are_refused_naming_the_file(written, tmp_path: Path) -> None:  # noqa: ANN001
    """An older export with an FP8 KV cache (`kv_cache_quant_algo`, only in hf_quant_config.json)."""
    _, directory = written
    config = json.loads((directory / "config.json").read_text())
    del config["quantization_config"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    hf_quant = json.loads((directory / "hf_quant_config.json").read_text())
    hf_quant["quantization"]["kv_cache_quant_algo"] = "FP8"
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(hf_quant))
    shutil.copy(directory / "model.safetensors", tmp_path)
    with pytest.raises(ValueError, match=r"hf_quant_config\.json: quantization\.kv_cache_quant_algo = \"FP8\": "
                                         "not supported"):
        load_causal_lm(str(tmp_path))


def test_a_block_scale_of_the_wrong_shape_is_refused_naming_the_tensor(written, tmp_path: Path) -> None:  # noqa: ANN001
    _, directory = written
    tensors = safetensors.torch.load_file(str(directory / "model.safetensors"))
    key = "model.layers.1.mlp.down_proj.weight_scale"
    tensors[key] = tensors[key][:, :4].contiguous()
    shutil.copy(directory / "config.json", tmp_path)
    safetensors.torch.save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"{key} is torch.float8_e4m3fn \[64, 4\], expected float8_e4m3fn \[64, 8\]"):
        load_causal_lm(str(tmp_path))


def test_excluded_modules_stay_unquantized(tmp_path: Path) -> None:
    """A Llama whose second layer's MLP is excluded: written unquantized, named in both configs'
    exclusion lists, loaded as plain linears."""
    model = build_model(TinyConfig(family="llama", layers=2, dtype="bfloat16"))
    directory = write_nvfp4_checkpoint(model, tmp_path / "llama", exclude_modules=["model.layers.1.mlp"])
    assert json.loads((directory / "config.json").read_text())["quantization_config"]["ignore"] == [
        "lm_head", "model.layers.1.mlp"]
    tensors = safetensors.torch.load_file(str(directory / "model.safetensors"))
    assert tensors["model.layers.1.mlp.up_proj.weight"].dtype == torch.bfloat16
    assert "model.layers.1.mlp.up_proj.weight_scale" not in tensors
    ours, _ = load_causal_lm(str(directory))
    assert type(ours.model.layers[1].mlp.up_proj) is torch.nn.Linear
    assert isinstance(ours.model.layers[1].self_attn.q_proj, Nvfp4Linear)


def test_quant_algo_is_read_case_blind(written, tmp_path: Path) -> None:  # noqa: ANN001
    """As vLLM reads it: some ModelOpt exports write `nvfp4`."""
    _, directory = written
    config = json.loads((directory / "config.json").read_text())
    config["quantization_config"]["quant_algo"] = "nvfp4"
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(directory / "model.safetensors", tmp_path)
    model, _ = load_causal_lm(str(tmp_path))
    assert isinstance(model.model.layers[0].mlp.gate_proj, Nvfp4Linear)


def test_quantized_moe_experts_are_refused_naming_the_tensor(tmp_path: Path) -> None:
    """ModelOpt writes each expert's projections as NVFP4 linears (`experts.<e>.gate_proj` ...);
    transformers' Qwen2-MoE holds its experts fused (`experts.gate_up_proj`), no linear each: the
    loader refuses NVFP4 experts, naming the format and the first such scale, instead of loading a
    model without its experts."""
    from ad_mlir.zoo.small import small_model

    model = small_model("qwen2_moe", layers=1).to(torch.bfloat16)
    directory = write_nvfp4_checkpoint(model, tmp_path / "moe")
    tensors = safetensors.torch.load_file(str(directory / "model.safetensors"))
    experts = "model.layers.0.mlp.experts"
    gate_up, down = tensors.pop(f"{experts}.gate_up_proj"), tensors.pop(f"{experts}.down_proj")
    for e in range(gate_up.shape[0]):
        gate, up = gate_up[e].chunk(2)
        for name, weight in (("gate_proj", gate), ("up_proj", up), ("down_proj", down[e])):
            packed, block, scale_2 = nvfp4.quantize(weight)
            tensors.update({f"{experts}.{e}.{name}.weight": packed, f"{experts}.{e}.{name}.weight_scale": block,
                            f"{experts}.{e}.{name}.weight_scale_2": scale_2,
                            f"{experts}.{e}.{name}.input_scale": scale_2.clone()})
    safetensors.torch.save_file(tensors, str(directory / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"quantized MoE experts in NVFP4 are not supported \({experts}\.0\.down_proj"
                                         rf"\.weight_scale_2 quantizes an expert of {experts}, Qwen2MoeExperts\)"):
        load_causal_lm(str(directory))
