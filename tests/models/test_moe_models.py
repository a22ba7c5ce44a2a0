"""MoE models end to end: compiled (`match-moe` in the default pipeline, the MoE kernel in the
Triton interpreter with the reference fallback made to fail) and generating through the cached
graph (`ad_mlir.LLM`: prefill, then decode steps of one token per sequence) the same greedy
tokens as HF's own `generate` (fp32)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

import ad_mlir
from ad_mlir.runtime import kernels
from ad_mlir.zoo.small import small_config

PROMPTS = [[5, 9, 13, 3, 7], [3, 4]]


def _model(family: str) -> torch.nn.Module:
    """One decoder layer of hidden 64 (Qwen2-MoE's shared expert 2 x the experts' size, not its
    default 88 x: fewer virtual experts for the interpreter)."""
    config = small_config(family, layers=1, hidden_size=64)
    if family == "qwen2_moe":
        config.shared_expert_intermediate_size = 2 * config.moe_intermediate_size
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def _hf_tokens(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, use_cache=True)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_moe_models_generate_hf_tokens_with_the_moe_kernel(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model(family)
    llm = ad_mlir.LLM(model, max_batch=2, max_seq_len=32)
    moes = [n.target for n in llm.graph.graph.nodes if "moe" in str(n.target)]
    assert len(moes) == 1 and kernels.registered_kernel(moes[0]) is not None

    def refuse(*_: object) -> None:
        raise AssertionError("a kernel ran its reference semantics")

    monkeypatch.setattr(kernels, "run_reference", refuse)
    outputs = llm.generate(PROMPTS, max_new_tokens=4)
    for prompt, out in zip(PROMPTS, outputs, strict=True):
        assert out.token_ids == _hf_tokens(model, prompt, 4)
