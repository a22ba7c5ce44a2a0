"""GPTQ and AWQ int4 checkpoints (`ad_mlir/zoo/gptq.py`, `ad_mlir/zoo/awq.py`): the writers'
on-disk layouts, read back here by hand from the bits (the formats as their writers define them:
GPTQ packs eight rows of codes a word, row 8i + j in bits 4j..4j+3, its v1 zero points minus one,
packed eight columns a word; AWQ packs eight columns a word in the order 0, 2, 4, 6, 1, 3, 5, 7 and
its zero points as they are), our loader keeping the packed words (AWQ's repacked, losslessly),
and the refusal of every `quantization_config` we do not load, naming the field. transformers'
own loaders for both formats need the `gptqmodel` package, which is not installed: the bit-level
reading in this file stands in for them."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import safetensors.torch
import torch

from ad_mlir.zoo.awq import write_awq_checkpoint
from ad_mlir.zoo.checkpoints import load_causal_lm
from ad_mlir.zoo.gptq import Int4Linear, write_gptq_checkpoint
from ad_mlir.zoo.tiny import TinyConfig, build_model

GROUP = 16
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")


def _nibble(words: torch.Tensor, index: torch.Tensor | int) -> torch.Tensor:
    return (words.to(torch.int64) >> (4 * index)) & 15


def gptq_weight_by_hand(tensors: dict[str, torch.Tensor], name: str, offset: int) -> torch.Tensor:
    """[N, K] from GPTQ's tensors, one bit operation at a time."""
    qweight, qzeros = tensors[f"{name}.qweight"], tensors[f"{name}.qzeros"]
    scales, g_idx = tensors[f"{name}.scales"].double(), tensors[f"{name}.g_idx"].long()
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    rows = torch.arange(k)
    codes = _nibble(qweight[rows // 8], (rows % 8)[:, None])                     # [K, N]
    cols = torch.arange(n)
    zeros = _nibble(qzeros[:, cols // 8], (cols % 8)[None, :]) + offset          # [G, N]
    return ((codes - zeros[g_idx]) * scales[g_idx]).T


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def awq_weight_by_hand(tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    qweight, qzeros, scales = tensors[f"{name}.qweight"], tensors[f"{name}.qzeros"], tensors[f"{name}.scales"]
    nibble_of_column = torch.tensor([AWQ_ORDER.index(c) for c in range(8)])
    n = qweight.shape[1] * 8
    cols = torch.arange(n)
    codes = _nibble(qweight[:, cols // 8], nibble_of_column[cols % 8][None, :])  # [K, N]
    zeros = _nibble(qzeros[:, cols // 8], nibble_of_column[cols % 8][None, :])   # [G, N]
    rows = torch.arange(qweight.shape[0]) // GROUP
    return ((codes - zeros[rows]) * scales.double()[rows]).T


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return build_model(TinyConfig(family="qwen2", layers=2, dtype="float16"))


@pytest.fixture(scope="module")
def gptq_act_order(model, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: ANN001
    return write_gptq_checkpoint(model, tmp_path_factory.mktemp("gptq") / "ckpt", GROUP, sym=False, desc_act=True)


@pytest.fixture(scope="module")
def gptq_sym(model, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: ANN001
    return write_gptq_checkpoint(model, tmp_path_factory.mktemp("gptq") / "ckpt", GROUP)


@pytest.fixture(scope="module")
def awq(model, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: ANN001
    return write_awq_checkpoint(model, tmp_path_factory.mktemp("awq") / "ckpt", GROUP)


def _tensors(directory: Path) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(str(directory / "model.safetensors"))


def _within_half_a_step(original: torch.Tensor, dequantized: torch.Tensor, step: torch.Tensor) -> bool:
    """Round-to-nearest on the group's grid (`step` per element): within half a step, but at the
    top or bottom of the grid, where the rounded zero point can put the range's end half a step
    past code 15 or 0 and the clamp then costs up to a whole step (the formats' quantizers clamp
    alike); most weights are inside the grid."""
    error = (dequantized - original.double()).abs() / step
    return bool((error <= 1 + 1e-3).all()) and (error <= 0.5 + 1e-3).float().mean().item() > 0.9


def test_gptq_writer_writes_the_format_s_layout(model, gptq_sym: Path) -> None:  # noqa: ANN001
    config = json.loads((gptq_sym / "config.json").read_text())["quantization_config"]
    assert {k: config[k] for k in ("quant_method", "bits", "group_size", "sym", "desc_act", "checkpoint_format")} \
        == {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "sym": True, "desc_act": False,
            "checkpoint_format": "gptq"}
    tensors = _tensors(gptq_sym)
    for i in range(2):
        for linear in LINEARS:
            name = f"model.layers.{i}.{linear}"
            n, k = model.get_submodule(name).weight.shape
            assert f"{name}.weight" not in tensors
            assert tensors[f"{name}.qweight"].dtype == torch.int32 and tensors[f"{name}.qweight"].shape == (k // 8, n)
            assert tensors[f"{name}.qzeros"].dtype == torch.int32 and tensors[f"{name}.qzeros"].shape == (k // GROUP,
                                                                                                          n // 8)
            assert tensors[f"{name}.scales"].dtype == torch.float16 and tensors[f"{name}.scales"].shape == (k // GROUP,
                                                                                                            n)
            assert torch.equal(tensors[f"{name}.g_idx"], torch.arange(k, dtype=torch.int32) // GROUP)
            # symmetric: every zero point is 8, which v1 stores as 7 in each nibble
            assert bool((tensors[f"{name}.qzeros"] == 0x77777777).all())
            original = model.get_submodule(name).weight
            step = tensors[f"{name}.scales"].double().repeat_interleave(GROUP, 0).T
            assert _within_half_a_step(original, gptq_weight_by_hand(tensors, name, 1), step), name
    assert tensors["model.layers.0.self_attn.q_proj.bias"].dtype == torch.float16
    for name in ("lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"):
        assert tensors[name].dtype == torch.float16, f"{name} stays in the model's dtype"


def test_gptq_act_order_groups_and_zero_points(model, gptq_act_order: Path) -> None:  # noqa: ANN001
    """With desc_act each group still holds group_size rows, in an order that is not K's; the
    projections of one input share it; the asymmetric zero points differ per group."""
    tensors = _tensors(gptq_act_order)
    prefix = "model.layers.1.self_attn"
    g_idx = tensors[f"{prefix}.q_proj.g_idx"]
    assert torch.equal(torch.bincount(g_idx.long()), torch.full((64 // GROUP,), GROUP))
    assert not torch.equal(g_idx, torch.arange(64, dtype=torch.int32) // GROUP)
    assert torch.equal(tensors[f"{prefix}.k_proj.g_idx"], g_idx) and torch.equal(tensors[f"{prefix}.v_proj.g_idx"],
                                                                                 g_idx)
    assert not torch.equal(tensors[f"{prefix}.o_proj.g_idx"], g_idx)
    assert len(torch.unique(tensors[f"{prefix}.q_proj.qzeros"])) > 1
    for linear in LINEARS:
        name = f"model.layers.1.{linear}"
        step = tensors[f"{name}.scales"].double()[tensors[f"{name}.g_idx"].long()].T
        assert _within_half_a_step(model.get_submodule(name).weight, gptq_weight_by_hand(tensors, name, 1), step)


def test_awq_writer_writes_the_format_s_layout(model, awq: Path) -> None:  # noqa: ANN001
    config = json.loads((awq / "config.json").read_text())["quantization_config"]
    assert {k: config[k] for k in ("quant_method", "bits", "group_size", "zero_point", "version")} == \
        {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm"}
    tensors = _tensors(awq)
    for linear in LINEARS:
        name = f"model.layers.0.{linear}"
        n, k = model.get_submodule(name).weight.shape
        assert tensors[f"{name}.qweight"].shape == (k, n // 8) and tensors[f"{name}.qzeros"].shape == (k // GROUP,
                                                                                                       n // 8)
        assert f"{name}.g_idx" not in tensors
        step = tensors[f"{name}.scales"].double().repeat_interleave(GROUP, 0).T
        assert _within_half_a_step(model.get_submodule(name).weight, awq_weight_by_hand(tensors, name), step), name


def test_loaders_keep_the_codes(gptq_act_order: Path, awq: Path) -> None:
    """`load_causal_lm` and a later cast to bf16: GPTQ's words and scales as the file has them
    (the scales stay float16), the trivial g_idx dropped and the act-order one shared by Q/K/V;
    AWQ's words repacked, dequantizing to exactly the weights its own layout holds."""
    tensors = _tensors(gptq_act_order)
    model, _ = load_causal_lm(str(gptq_act_order))
    model = model.to(torch.bfloat16)
    attention = model.model.layers[1].self_attn
    for linear in LINEARS:
        name = f"model.layers.1.{linear}"
        module = model.get_submodule(name)
        assert isinstance(module, Int4Linear) and module.zero_offset == 1 and module.group_size == GROUP
        assert torch.equal(module.qweight, tensors[f"{name}.qweight"]) and torch.equal(module.qzeros,
                                                                                       tensors[f"{name}.qzeros"])
        assert module.scales.dtype == torch.float16 and torch.equal(module.scales, tensors[f"{name}.scales"])
        assert torch.equal(module.dequantized().double(), gptq_weight_by_hand(tensors, name, 1))
    assert attention.q_proj.g_idx is attention.k_proj.g_idx is attention.v_proj.g_idx
    assert model.lm_head.weight.dtype == torch.bfloat16
    tensors = _tensors(awq)
    model, _ = load_causal_lm(str(awq))
    for linear in LINEARS:
        name = f"model.layers.0.{linear}"
        module = model.get_submodule(name)
        assert module.g_idx is None and module.zero_offset == 0
        assert torch.equal(module.dequantized().double(), awq_weight_by_hand(tensors, name))


def test_awq_modules_to_not_convert_stay_float(model, tmp_path: Path) -> None:  # noqa: ANN001
    """AWQ's `modules_to_not_convert` (a name or a prefix): written as the model's weights, loaded
    as plain linears; the rest quantized."""
    directory = write_awq_checkpoint(model, tmp_path / "skip", GROUP, modules_to_not_convert=["model.layers.0.mlp"])
    assert json.loads((directory / "config.json").read_text())["quantization_config"]["modules_to_not_convert"] == \
        ["model.layers.0.mlp"]
    tensors = _tensors(directory)
    assert tensors["model.layers.0.mlp.up_proj.weight"].dtype == torch.float16
    assert "model.layers.0.mlp.up_proj.qweight" not in tensors
    loaded, _ = load_causal_lm(str(directory))
    assert type(loaded.model.layers[0].mlp.up_proj) is torch.nn.Linear
    assert torch.equal(loaded.model.layers[0].mlp.up_proj.weight, model.model.layers[0].mlp.up_proj.weight.float())
    assert isinstance(loaded.model.layers[1].mlp.up_proj, Int4Linear)
    assert isinstance(loaded.model.layers[0].self_attn.q_proj, Int4Linear)


def test_without_act_order_the_g_idx_is_dropped(gptq_sym: Path) -> None:
    model, _ = load_causal_lm(str(gptq_sym))
    assert all(m.g_idx is None for m in model.modules() if isinstance(m, Int4Linear))


REFUSED = [
    ("gptq", "bits", 8),
    ("gptq", "bits", 3),
    ("gptq", "checkpoint_format", "marlin"),
    ("gptq", "group_size", 12),
    ("gptq", "group_size", None),
    ("gptq", "lm_head", True),
    ("gptq", "pack_dtype", "int16"),
    ("awq", "bits", 8),
    ("awq", "version", "gemv"),
    ("awq", "version", "exllama"),
    ("awq", "zero_point", False),
    ("awq", "group_size", 0),
]


@pytest.mark.parametrize(("fmt", "field", "value"), REFUSED, ids=[f"{f}-{k}={json.dumps(v)}" for f, k, v in REFUSED])
def test_unsupported_quantization_config_is_refused_naming_the_field(gptq_sym: Path, awq: Path, tmp_path: Path,
                                                                    fmt: str, field: str, value: object) -> None:
    directory = gptq_sym if fmt == "gptq" else awq
    config = json.loads((directory / "config.json").read_text())
    config["quantization_config"][field] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(directory / "model.safetensors", tmp_path)
    with pytest.raises(ValueError, match=rf"quantization_config\.{field} = {re.escape(json.dumps(value))}"):
        load_causal_lm(str(tmp_path))


def test_gptq_v2_zero_points_load_without_the_offset(model, tmp_path: Path) -> None:  # noqa: ANN001
    directory = write_gptq_checkpoint(model, tmp_path / "v2", GROUP, sym=False, checkpoint_format="gptq_v2")
    tensors = _tensors(directory)
    loaded, _ = load_causal_lm(str(directory))
    name = "model.layers.0.mlp.down_proj"
    assert loaded.get_submodule(name).zero_offset == 0
    assert torch.equal(loaded.get_submodule(name).dequantized().double(), gptq_weight_by_hand(tensors, name, 0))


def test_a_tensor_of_the_wrong_shape_is_refused_naming_it(gptq_sym: Path, tmp_path: Path) -> None:
    tensors = _tensors(gptq_sym)
    key = "model.layers.1.mlp.down_proj.scales"
    tensors[key] = tensors[key][:, :8].contiguous()
    safetensors.torch.save_file(tensors, str(tmp_path / "model.safetensors"))
    shutil.copy(gptq_sym / "config.json", tmp_path)
    with pytest.raises(ValueError, match=re.escape(f"{key} is torch.float16 [8, 8], expected float [8, 64]")):
        load_causal_lm(str(tmp_path))
