"""Attention forms beyond softmax(q.k * scale + mask), generating through the K/V cache:
gpt-oss's attention sinks (a learned logit per head that joins the softmax, with a sliding window
on alternate layers). Models built from their config classes with wide random weights, so that
greedy tokens vary; tokens against HF `generate` (three prompts in two slots) and per-step logits
(prefill and 4 decode steps) against HF's full-prefix forward, with the kernels as their torch
reference and in the Triton interpreter."""

from __future__ import annotations

import pytest
import torch
from test_generate import _assert_interpreted_tokens_are_hf, _assert_step_logits_match, _hf_tokens

import ad_mlir
from ad_mlir.dialects import ad
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.zoo.small import model_from_config, small_config

PROMPTS = [[5, 9, 13, 3, 7, 40, 41], [3, 4], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]
GPT_OSS_WINDOW = 4
"""gpt-oss's sliding layers' window, reached by the 7- and 11-token prompts and every decode."""


@pytest.fixture(scope="module")
def gpt_oss() -> tuple[torch.nn.Module, ad_mlir.LLM]:
    """Two layers, sliding then full attention, each with sinks; MoE MLPs."""
    config = small_config("gpt_oss")
    config.initializer_range = 0.5
    config.sliding_window = GPT_OSS_WINDOW
    config.layer_types = ["sliding_attention", "full_attention"]
    model = model_from_config(config)
    return model, ad_mlir.LLM(model, max_batch=2, max_seq_len=32)


def test_gpt_oss_caches_its_attention_with_sinks_and_window(gpt_oss) -> None:  # noqa: ANN001
    _, llm = gpt_oss
    cached = [op for op in llm.program.function.body.walk() if isinstance(op, ad.CachedAttentionOp)]
    assert [op.window.value.data if op.window else None for op in cached] == [GPT_OSS_WINDOW, None]
    assert all(op.sinks is not None and op.sinks.type.get_shape() == (4,) for op in cached)
    assert not any(isinstance(op, ad.SoftmaxOp) for op in llm.program.function.body.walk())


def test_gpt_oss_generates_hf_greedy_tokens(gpt_oss) -> None:  # noqa: ANN001
    model, llm = gpt_oss
    with reference_kernels():
        outputs = llm.generate(PROMPTS, max_new_tokens=8)
    assert [out.token_ids for out in outputs] == [_hf_tokens(model, prompt, 8) for prompt in PROMPTS]


def test_gpt_oss_step_logits_match_hf_prefill_and_decode(gpt_oss) -> None:  # noqa: ANN001
    _assert_step_logits_match(*gpt_oss)


def test_gpt_oss_in_the_interpreter(gpt_oss, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The cached attention's kernel with sinks (prefill and split-K decode) in the Triton
    interpreter, the reference refused: three prompts in two slots."""
    model, llm = gpt_oss
    _assert_interpreted_tokens_are_hf(model, llm, monkeypatch, PROMPTS, 4)


def test_gpt_oss_sinks_decide_its_tokens(gpt_oss) -> None:  # noqa: ANN001
    """What the tests above would catch: the same weights with sinks of -inf (no sink) generate
    other tokens, so a cached attention that dropped the sinks would be seen."""
    model, _ = gpt_oss
    sinkless = model_from_config(model.config)
    sinkless.load_state_dict(model.state_dict())
    with torch.no_grad():
        for layer in sinkless.model.layers:
            layer.self_attn.sinks.fill_(float("-inf"))
    assert [_hf_tokens(sinkless, p, 8) for p in PROMPTS] != [_hf_tokens(model, p, 8) for p in PROMPTS]
