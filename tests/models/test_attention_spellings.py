"""HF's eager attention in spellings beyond the plain one, generating through the K/V cache:
MiMo-V2-Flash's softmax of the scores less their row max (sinks concatenated on its sliding
layers), GraniteSWA's sinks as an output factor sigmoid(logsumexp(scores) - sink) on unscaled
scores (attention_multiplier 1), GPT-NeoX-Japanese's baddbmm over [batch * heads] rows with a
zero bias and RoPE, and XGLM's (its query scaled before, the key transposed and the softmax run
over [batch * heads] rows, the masked scores clamped at the lowest; sinusoidal positions from
position_ids), and GPT-Neo's unscaled scores under where(a slice of its triangular `bias` buffer,
scores, lowest) plus HF's mask, global and local (a window) layers alternating, and OpenAI-GPT's
scores * mask + (1 - mask) * -1e4 of a slice of its triangular buffer (its key permuted straight to
k^T, no position_ids in HF's cache-less generate): the buffers' values come from the weights the
compiler puts in scope; and GIT's text decoder, whose mask reads its embeddings for their shape
only (token types as zeros_like of them), and Doge's dynamic mask (a bias per key and head,
exp(A * softplus(dt_proj(value))), under HF's mask), cached as one more head dim of the query (1)
and the key (bias / scale). Models built from their config classes with wide random weights, so that
greedy tokens vary; tokens against HF `generate` (three prompts in two slots) and per-step logits
(prefill and 4 decode steps) against HF's full-prefix forward, with the kernels as their torch
reference and in the Triton interpreter."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_generate import _assert_interpreted_tokens_are_hf, _assert_step_logits_match, _hf_tokens

import ad_mlir
from ad_mlir.dialects import ad
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.zoo.small import model_from_config, small_config

PROMPTS = [[5, 9, 13, 3, 7, 40, 41], [3, 4], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]
WINDOW = 4
"""The sliding layers' window, reached by the 7- and 11-token prompts and every decode."""

SETTINGS: dict[str, dict[str, Any]] = {
    "mimo_v2_flash": {"sliding_window": WINDOW},
    "granite_swa": {"sliding_window": WINDOW},
    "gpt_neox_japanese": {},
    "xglm": {},
    "gpt_neo": {"window_size": WINDOW},
    "openai-gpt": {"tie_word_embeddings": False},  # tied, its post-norm logits repeat the last token
    "git": {},
    "doge": {"initializer_range": 0.1, "tie_word_embeddings": False},  # measured: wider or tied, HF repeats a token
}
"""Per family: config settings over the small config (hidden 64, 2 layers)."""

EXPECTED: dict[str, list[dict[str, Any]]] = {
    "mimo_v2_flash": [{"window": None, "sinks": False}, {"window": WINDOW, "sinks": True}],
    "granite_swa": [{"window": None, "sinks": True}, {"window": WINDOW, "sinks": True}],
    "gpt_neox_japanese": [{"window": None, "sinks": False, "rope": True}] * 2,
    "xglm": [{"window": None, "sinks": False}] * 2,
    "gpt_neo": [{"window": None, "sinks": False}, {"window": WINDOW, "sinks": False}],
    "openai-gpt": [{"window": None, "sinks": False}] * 2,
    "git": [{"window": None, "sinks": False}] * 2,
    "doge": [{"window": None, "sinks": False}] * 2,
}
"""Per family and layer: what its cached attention carries."""


@pytest.fixture(scope="module", params=sorted(SETTINGS))
def spelled(request: pytest.FixtureRequest) -> tuple[str, torch.nn.Module, ad_mlir.LLM]:
    config = small_config(request.param, hidden_size=64)
    config.initializer_range = 0.5
    for name, value in SETTINGS[request.param].items():
        setattr(config, name, value)
    model = model_from_config(config)
    with torch.no_grad():  # GraniteSWA's sinks and Doge's A start at 0 (A = 0: every key's bias is 1, a no-op):
        for name, p in model.named_parameters():  # distinct per head, so that a lost sink or bias shows
            if name.endswith(("sinks", ".A")):
                p.normal_(std=1.0)
    return request.param, model, ad_mlir.LLM(model, max_batch=2, max_seq_len=32)


def test_each_attention_is_one_cached_op(spelled) -> None:  # noqa: ANN001
    """The eager chain is gone (no softmax, no matmul over the keys): one cached attention per
    layer, with the window and sinks its layer has."""
    family, _, llm = spelled
    ops = list(llm.program.function.body.walk())
    cached = [op for op in ops if isinstance(op, ad.CachedAttentionOp)]
    found = [{"window": op.window.value.data if op.window else None, "sinks": op.sinks is not None}
             | ({"rope": op.cos is not None} if "rope" in EXPECTED[family][0] else {}) for op in cached]
    assert found == EXPECTED[family]
    assert not any(isinstance(op, ad.SoftmaxOp | ad.MatmulOp | ad.BmmOp) for op in ops)


def test_generates_hf_greedy_tokens(spelled) -> None:  # noqa: ANN001
    _, model, llm = spelled
    with reference_kernels():
        outputs = llm.generate(PROMPTS, max_new_tokens=8)
    assert [out.token_ids for out in outputs] == [_hf_tokens(model, prompt, 8) for prompt in PROMPTS]


def test_step_logits_match_hf_prefill_and_decode(spelled) -> None:  # noqa: ANN001
    _assert_step_logits_match(*spelled[1:])


@pytest.mark.parametrize("spelled", ["granite_swa", "gpt_neox_japanese", "doge"], indirect=True)  # sinks + window;
# RoPE; a head dim of 33 (Doge's key bias as one more dim)
def test_in_the_interpreter(spelled, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The cached attention's kernels (prefill and split-K decode) in the Triton interpreter,
    the reference refused: three prompts in two slots."""
    _, model, llm = spelled
    _assert_interpreted_tokens_are_hf(model, llm, monkeypatch, PROMPTS, 4)
