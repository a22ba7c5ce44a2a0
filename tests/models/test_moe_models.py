"""MoE models end to end: compiled (`match-moe` in the default pipeline, every kernel in the
Triton interpreter, checked by `kernel_guard`) and generating through the cached graph
(`ad_mlir.LLM`: three prompts in two slots, prefill, then decode steps of one token per
sequence) the same greedy tokens as HF's own `generate` (fp32), with per-step logits against
HF's full-prefix forward.

The weights are wide (`initializer_range=0.5`): with the default init, HF's tokens did not
change when the whole MoE block was zeroed, so a dropped MoE went unseen. Now they vary, and a
test checks that zeroing the MoE block changes them."""

from __future__ import annotations

import pytest
import torch
from kernel_guard import graph_kernels, kernels_ran
from test_generate import _assert_logits_close, _assert_step_logits_match
from transformers import AutoModelForCausalLM

import ad_mlir
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.zoo.small import model_from_config, small_config

PROMPTS = [[5, 9, 13, 3, 7], [3, 4], [11, 12, 13, 14, 15, 16]]
NEW_TOKENS = 4


def _model(family: str) -> torch.nn.Module:
    """One decoder layer of hidden 64 (Qwen2-MoE's shared expert 2 x the experts' size, not its
    default 88 x: fewer virtual experts for the interpreter), weights of std 0.5."""
    config = small_config(family, layers=1, hidden_size=64)
    if family == "qwen2_moe":
        config.shared_expert_intermediate_size = 2 * config.moe_intermediate_size
    config.initializer_range = 0.5
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def _hf_tokens(model: torch.nn.Module, prompt: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, use_cache=True)
    return out[0, len(prompt):].tolist()


def _moe_block(model: torch.nn.Module) -> torch.nn.Module:
    return model.model.layers[0].mlp


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_moe_models_generate_hf_tokens_with_the_moe_kernel(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model(family)
    llm = ad_mlir.LLM(model, max_batch=2, max_seq_len=32)
    names = graph_kernels(llm.graph)
    assert sum(name.startswith("moe") for name in names) == 1, names
    hf = [_hf_tokens(model, prompt) for prompt in PROMPTS]
    with kernels_ran(monkeypatch):
        outputs = llm.generate(PROMPTS, max_new_tokens=NEW_TOKENS)
        sequences = [PROMPTS[0] + hf[0][:1], PROMPTS[2] + hf[2][:1]]
        with torch.no_grad():
            for slot, seq in enumerate(sequences):  # prefill, then one decode step of both
                logits = llm.step(torch.tensor([seq[:-1]]), torch.arange(len(seq) - 1)[None], [slot], [0])
                _assert_logits_close(logits, model(torch.tensor([seq[:-1]])).logits)
            logits = llm.step(torch.tensor([[s[-1]] for s in sequences]),
                              torch.tensor([[len(s) - 1] for s in sequences]), [0, 1], [len(s) - 1 for s in sequences])
            for i, seq in enumerate(sequences):
                _assert_logits_close(logits[i, -1], model(torch.tensor([seq])).logits[0, -1])
    assert [out.token_ids for out in outputs] == hf

    zeroed = _moe_block(model)
    monkeypatch.setattr(zeroed, "forward", lambda hidden, *_, **__: torch.zeros_like(hidden))
    assert [_hf_tokens(model, prompt) for prompt in PROMPTS] != hf, "the MoE block decides the tokens"


def test_jetmoe_expert_groups_beside_the_cache_generate_hf_tokens() -> None:
    """JetMoE routes tokens through experts in its attention and MLP by splitting the sorted
    tokens into groups sized by a count over the tokens, and joining the groups back: no position
    mixing, so generation is not refused (it was, by the static check, before the check knew
    that sizes carry no token values and that rejoined split groups keep rows in place)."""
    config = small_config("jetmoe")
    config.initializer_range = 0.5
    torch.manual_seed(0)
    model = model_from_config(config)
    llm = ad_mlir.LLM(model, max_batch=2, max_seq_len=40)
    hf = [_hf_tokens(model, prompt) for prompt in PROMPTS]  # both stop at the EOS token
    assert all(len(set(tokens)) > 1 for tokens in hf)
    with reference_kernels():
        assert [out.token_ids for out in llm.generate(PROMPTS, max_new_tokens=NEW_TOKENS)] == hf
    _assert_step_logits_match(model, llm)
