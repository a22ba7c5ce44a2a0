"""Fine-grained FP8 checkpoints of MoE models (`zoo/quantized.py`): the writer's per-expert fp8
linears, as DeepSeek-V3's and Qwen3-MoE's checkpoints hold them, are stacked by the loader into an
`Fp8BlockExperts` whose weights are what transformers' own converters make of the checkpoint
(it dequantizes on a CPU: exactly fp8 * scale_inv per block), whose eager forward is
`ad.moe_fp8_block`'s reference, and what does not fit is refused naming it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import safetensors.torch
import torch
import transformers

from ad_mlir.zoo.checkpoints import load_causal_lm
from ad_mlir.zoo.fp8_blocks import block_linear, dequantize_blocks
from ad_mlir.zoo.quantized import Fp8BlockExperts, write_fp8_block_checkpoint
from ad_mlir.zoo.small import model_from_config, small_config

BLOCK = (16, 32)
EXPERTS = "model.layers.0.mlp.experts"


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-layer Qwen3-MoE built small (hidden 128, 4 experts of 64, top 2) in bf16."""
    torch.manual_seed(0)
    model = model_from_config(small_config("qwen3_moe", 1)).to(torch.bfloat16)
    return write_fp8_block_checkpoint(model, tmp_path_factory.mktemp("fp8moe") / "ckpt", BLOCK)


@pytest.fixture(scope="module")
def loaded(written: Path) -> torch.nn.Module:
    return load_causal_lm(str(written))[0]


def test_the_experts_load_stacked_as_transformers_stacks_them(written: Path, loaded: torch.nn.Module) -> None:
    experts = loaded.get_submodule(EXPERTS)
    assert isinstance(experts, Fp8BlockExperts)
    assert (experts.gate_up_proj.dtype, tuple(experts.gate_up_proj.shape)) == (torch.float8_e4m3fn, (4, 128, 128))
    assert tuple(experts.gate_up_proj_scale_inv.shape) == (4, 128 // 16, 128 // 32)
    assert (experts.down_proj.dtype, tuple(experts.down_proj_scale_inv.shape)) == (torch.float8_e4m3fn, (4, 8, 2))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(written, dtype=torch.float32).get_submodule(EXPERTS)
    for proj in ("gate_up_proj", "down_proj"):
        ours = torch.stack([dequantize_blocks(w, s, BLOCK) for w, s in
                            zip(getattr(experts, proj), getattr(experts, f"{proj}_scale_inv"), strict=True)])
        assert torch.equal(ours, getattr(theirs, proj)), proj


def test_the_experts_forward_is_each_expert_s_two_block_scaled_gemms(loaded: torch.nn.Module) -> None:
    """Token t routed to expert e with weight w adds `w * down_e(silu(gate_e(x)) * up_e(x))`, each
    GEMM `block_linear` (activations quantized per group) on that expert's slice: the loop over
    experts in `block_experts` gathers, routes and sums as a per-token computation does."""
    experts = loaded.get_submodule(EXPERTS)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 128, generator=g)
    ids = torch.stack([torch.randperm(4, generator=g)[:2] for _ in range(5)])
    weights = torch.rand(5, 2, generator=g)
    with torch.no_grad():
        got = experts(x, ids, weights)
    for t in range(5):
        expected = torch.zeros(128)
        for slot in range(2):
            e = int(ids[t, slot])
            gate, up = block_linear(x[t:t + 1], experts.gate_up_proj[e], experts.gate_up_proj_scale_inv[e], None,
                                    BLOCK).chunk(2, -1)
            expected += weights[t, slot] * block_linear(torch.nn.functional.silu(gate) * up, experts.down_proj[e],
                                                        experts.down_proj_scale_inv[e], None, BLOCK)[0]
        torch.testing.assert_close(got[t], expected, rtol=1e-6, atol=1e-6)  # fp32: the order of two additions


def _rewritten(written: Path, directory: Path, config_change: dict | None = None, drop: str | None = None) -> Path:
    directory.mkdir()
    config = json.loads((written / "config.json").read_text())
    config.update(config_change or {})
    (directory / "config.json").write_text(json.dumps(config))
    if drop is None:
        shutil.copy(written / "model.safetensors", directory)
    else:
        tensors = safetensors.torch.load_file(str(written / "model.safetensors"))
        del tensors[drop]
        safetensors.torch.save_file(tensors, str(directory / "model.safetensors"))
    return directory


def test_an_expert_missing_is_refused_naming_it(written: Path, tmp_path: Path) -> None:
    directory = _rewritten(written, tmp_path / "missing", drop=f"{EXPERTS}.2.up_proj.weight_scale_inv")
    with pytest.raises(ValueError, match=rf"{EXPERTS}\.2\.up_proj\.weight_scale_inv is missing, expected "
                                         r"torch\.float32 \[4, 4\] \(weight_block_size \[16, 32\]\)"):
        load_causal_lm(str(directory))


def test_another_activation_is_refused_naming_the_field(written: Path, tmp_path: Path) -> None:
    directory = _rewritten(written, tmp_path / "gelu", {"hidden_act": "gelu"})
    with pytest.raises(ValueError, match=rf"{EXPERTS}: config\.hidden_act = 'gelu'; FP8 experts are loaded with silu"):
        load_causal_lm(str(directory))
