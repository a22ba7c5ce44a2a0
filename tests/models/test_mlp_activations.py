"""The MLP shapes HF exports, through the default pipeline: each model built small (random
weights, biases not zero, fp32) with an activation its config allows, one fused activation op
per layer, its kernel run in the Triton interpreter (the reference fallback refused) and the
logits equal to eager's within torch.testing's fp32 tolerance (the kernels compute in fp32 as
eager does; the spelled-out GELUs of GPT-2 and BLOOM differ from torch's tanh-GELU kernel by a
few fp32 ulps, see passes/patterns/activations.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from kernel_guard import graph_kernels, kernels_ran
from transformers import AutoModelForCausalLM

import ad_mlir
from ad_mlir.frontends.export import export_with_ids
from ad_mlir.zoo.small import small_config

LAYERS = 2
CASES: dict[str, tuple[str, dict[str, Any], str]] = {
    # Phi-3's fused gate_up_proj chunked in two, configured with Gemma's GELU
    "phi3_gelu_tanh": ("phi3", {"hidden_act": "gelu_pytorch_tanh"}, "gelu_tanh_and_mul_"),
    # Nemotron's ReLU^2 (torch.square of relu)
    "nemotron_relu2": ("nemotron", {}, "relu2_"),
    # Falcon with biases: FalconLinear adds the bias after its matmul; the kernel adds it
    "falcon_bias": ("falcon", {"bias": True}, "bias_gelu_"),
    # GPT-2's NewGELUActivation, spelled out, after Conv1D's addmm
    "gpt2_gelu_new": ("gpt2", {}, "gelu_tanh_"),
    # OPT's ReLU
    "opt_relu": ("opt", {}, "relu_"),
    # BLOOM's bloom_gelu_forward, spelled out with the product factored, after a biased linear
    "bloom_gelu": ("bloom", {}, "gelu_tanh_"),
}


def _model(family: str, overrides: dict[str, Any]) -> torch.nn.Module:
    config = small_config(family, layers=LAYERS)
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # HF zero-initializes biases: a bias the kernels dropped would go unseen
        for name, parameter in model.named_parameters():
            if name.endswith(".bias"):
                parameter.normal_(std=0.02)
    return model.eval().float()


@pytest.mark.parametrize("case", sorted(CASES))
def test_activation_kernel_per_layer_and_eager_logits(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    family, overrides, kernel_prefix = CASES[case]
    model = _model(family, overrides)
    ids = torch.randint(1, 1000, (1, 9), generator=torch.Generator().manual_seed(0))
    ep = export_with_ids(model, ids[:, :5], max_seq=64)
    with kernels_ran(monkeypatch):  # the Triton kernels run, not their reference; none dropped
        gm = ad_mlir.compile(ep)
        names = graph_kernels(gm)
        assert sum(k.startswith(kernel_prefix) for k in names) == LAYERS, names
        with torch.no_grad():
            torch.testing.assert_close(gm(ids)[0], model(input_ids=ids).logits)
