"""Inkling's text model generating through the K/V cache: its attention adds a relative position
bias that each token computes from its own hidden state (`InklingRelativeLogits`: r_proj's
relative states times a bank of bias-vs-distance profiles, gathered by query-key distance and 0
past `rel_extent`), which the cached attention takes as its `distance_bias` operand; its keys and
values pass short convolutions first (cached as `ad.cached_causal_conv1d`). Built from the config
class with wide random weights (greedy tokens vary): one sliding layer (window 4, the bias over 4
distances) and one full layer (the bias over 6 distances, and log scaling: the query and the
bias times tau = 1 + alpha log(max(position + 1, n_floor) / n_floor), from the step's real
positions), both reached by the prompts; tokens
against HF `generate` (three prompts in two slots), per-step logits (prefill and 4 decode steps)
against HF's full-prefix forward, with the kernels as their reference and in the Triton
interpreter; the paged form (`ad.cached_attention` over pages with the bias, positions from `position_ids`)
once, its tokens against HF's (its kernel in tests/unit/test_paged_attention.py).

Inkling2's layers add a sink logit per token and head (`sink_proj` of the hidden state, the
cached attention's `sinks` [batch, heads, seq], slot form only) to the same bias; its full layers'
keys and values pass dynamic short convolutions (taps computed per token) over
`F.pad(x, (3, 0))[..., -(seq + 3):].unfold(-1, 4, 1)`, whose pad becomes a cached token window of
the 3 tokens before a step (`ad.cached_token_window`): tokens against HF `generate` (three
prompts in two slots), per-step logits (prefill and 4 decode steps), a prefill in three chunks
against HF's full-prefix forward, and a decode without its window seen to be wrong."""

from __future__ import annotations

import pytest
import torch
from test_generate import (
    _assert_interpreted_tokens_are_hf,
    _assert_logits_close,
    _assert_step_logits_match,
    _hf_tokens,
)

import ad_mlir
from ad_mlir.bench.families import greedy_only
from ad_mlir.dialects import ad
from ad_mlir.passes.cache.interface import PerSequenceState
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.zoo.small import model_from_config, small_config

PROMPTS = [[5, 9, 13, 3, 7, 40, 41], [3, 4], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]
WINDOW, EXTENT = 4, 6
"""The sliding layer's window (its bias's extent too, as HF builds it) and the full layer's
`rel_extent`: the 7- and 11-token prompts and every decode reach past both."""


def _inkling(**settings: object) -> torch.nn.Module:
    config = small_config("inkling_text", hidden_size=64)
    config.initializer_range = 0.5
    for name, value in {"layer_types": ["hybrid_sliding", "hybrid"], "sliding_window_size": WINDOW,
                        "rel_extent": EXTENT, "swa_num_attention_heads": 4, "swa_num_key_value_heads": 2,
                        "swa_head_dim": 16, "head_dim": 16, "log_scaling_n_floor": 2, "log_scaling_alpha": 0.5,
                        **settings}.items():
        setattr(config, name, value)
    return model_from_config(config)


@pytest.fixture(scope="module")
def inkling() -> tuple[torch.nn.Module, ad_mlir.LLM]:
    model = _inkling()
    return model, ad_mlir.LLM(model, max_batch=2, max_seq_len=32)


def test_each_attention_takes_its_bias_by_distance(inkling) -> None:  # noqa: ANN001
    """One cached attention per layer, with its window and a [batch, heads, seq, extent] bias;
    the gather by distance is gone."""
    _, llm = inkling
    ops = list(llm.program.function.body.walk())
    cached = [op for op in ops if isinstance(op, ad.CachedAttentionOp)]
    assert [(op.window.value.data if op.window else None, op.distance_bias.type.get_shape()[1],
             op.distance_bias.type.get_shape()[3]) for op in cached] == [(WINDOW, 4, WINDOW), (None, 4, EXTENT)]
    assert not any(isinstance(op, ad.TorchOp) and op.target.data == "aten.gather.default"
                   and len(op.inputs[0].type.get_shape()) == 4 for op in ops)


def test_generates_hf_greedy_tokens(inkling) -> None:  # noqa: ANN001
    model, llm = inkling
    with reference_kernels():
        outputs = llm.generate(PROMPTS, max_new_tokens=8)
    assert [out.token_ids for out in outputs] == [_hf_tokens(model, prompt, 8) for prompt in PROMPTS]


def test_step_logits_match_hf_prefill_and_decode(inkling) -> None:  # noqa: ANN001
    _assert_step_logits_match(*inkling)


def test_in_the_interpreter(inkling, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The cached attention's kernel with the bias (prefill and split-K decode) in the Triton
    interpreter, the reference refused: two prompts (7 tokens: past both extents), 3 new tokens."""
    model, llm = inkling
    _assert_interpreted_tokens_are_hf(model, llm, monkeypatch, PROMPTS[:2], 3)


def test_the_paged_form_generates_hf_greedy_tokens(inkling) -> None:  # noqa: ANN001
    model, _ = inkling
    llm = ad_mlir.LLM(model, max_batch=2, max_seq_len=32, page_size=4)
    assert sum(isinstance(op, ad.CachedAttentionOp) and op.query_starts is not None and op.distance_bias is not None
               for op in llm.program.function.body.walk()) == 2
    with reference_kernels():
        outputs = llm.generate(PROMPTS, max_new_tokens=8)
    assert [out.token_ids for out in outputs] == [_hf_tokens(model, prompt, 8) for prompt in PROMPTS]


def test_the_bias_and_the_log_scaling_decide_its_tokens(inkling) -> None:  # noqa: ANN001
    """What the tests above would catch: the same weights without the relative bias (its
    profiles zeroed), or without log scaling, generate other tokens, so a cached attention that
    dropped the bias, or positions that restart at each step, would be seen."""
    model, _ = inkling
    unbiased, unscaled = _inkling(), _inkling(log_scaling_n_floor=None)
    with torch.no_grad():
        for layer in unbiased.model.layers:
            layer.self_attn.rel_logits_proj.proj.zero_()
    expected = [_hf_tokens(model, p, 8) for p in PROMPTS]
    assert [_hf_tokens(unbiased, p, 8) for p in PROMPTS] != expected
    assert [_hf_tokens(unscaled, p, 8) for p in PROMPTS] != expected


def _inkling2(layer_types: list[str]) -> torch.nn.Module:
    config = small_config("inkling2_text", layers=len(layer_types), hidden_size=64)
    config.initializer_range = 0.5
    for name, value in {"layer_types": layer_types, "sliding_window_size": WINDOW, "rel_extent": EXTENT,
                        "swa_num_attention_heads": 4, "swa_num_key_value_heads": 2, "swa_head_dim": 16}.items():
        setattr(config, name, value)
    return greedy_only(model_from_config(config).eval())


@pytest.fixture(scope="module")
def inkling2() -> tuple[torch.nn.Module, ad_mlir.LLM]:
    """A sliding layer (window 4, the bias over 4 distances) and a full one (the bias over 6
    distances, keys and values through dynamic short convolutions of kernel 4), each with sinks
    per token."""
    model = _inkling2(["hybrid_sliding", "hybrid"])
    return model, ad_mlir.LLM(model, max_batch=2, max_seq_len=32)


def test_inkling2_takes_sinks_per_token(inkling2) -> None:  # noqa: ANN001
    _, llm = inkling2
    cached = [op for op in llm.program.function.body.walk() if isinstance(op, ad.CachedAttentionOp)]
    assert [(op.window.value.data if op.window else None, op.sinks.type.get_shape()[1],
             op.distance_bias.type.get_shape()[3]) for op in cached] == [(WINDOW, 4, WINDOW), (None, 4, EXTENT)]
    assert all(len(op.sinks.type.get_shape()) == 3 for op in cached)


def test_inkling2_caches_the_dynamic_convolutions_token_windows(inkling2) -> None:  # noqa: ANN001
    """The full layer's key and value convolutions read the 3 tokens before a step from a window
    each [slots, channels, 3] (2 kv heads x 16 channels); the pad and its cut are gone, the
    unfold reads the window."""
    _, llm = inkling2
    assert {name: tuple(c.shape) for name, c in llm.caches.items() if name.startswith("token_window")} \
        == {"token_window_0": (2, 32, 3), "token_window_1": (2, 32, 3)}
    ops = list(llm.program.function.body.walk())
    windows = [op for op in ops if isinstance(op, ad.CachedTokenWindowOp)]
    assert [op.result.get_unique_use().operation.target.data for op in windows] == ["aten.unfold.default"] * 2
    assert not any(isinstance(op, ad.TorchOp) and op.target.data == "aten.pad.default" for op in ops)


def test_inkling2_generates_hf_greedy_tokens(inkling2) -> None:  # noqa: ANN001
    """Three prompts in two slots: a reused slot starts its windows from zeros, as the pad does."""
    model, llm = inkling2
    with reference_kernels():
        outputs = llm.generate(PROMPTS, max_new_tokens=8)
    assert [out.token_ids for out in outputs] == [_hf_tokens(model, prompt, 8) for prompt in PROMPTS]


def test_inkling2_step_logits_match_hf_prefill_and_decode(inkling2) -> None:  # noqa: ANN001
    _assert_step_logits_match(*inkling2)


def test_an_inkling2_prompt_prefilled_in_three_chunks_equals_one_prefill(inkling2) -> None:  # noqa: ANN001
    """The later chunks (start > 0) continue from the windows the earlier left; the middle one of
    a single token, fewer than the window's 3, keeps the two rows before it in the window."""
    model, llm = inkling2
    prompt = torch.tensor([PROMPTS[2]])
    with torch.no_grad(), reference_kernels():
        expected = model(prompt).logits
        for first, last in ((0, 4), (4, 5), (5, prompt.shape[1])):
            logits = llm.step(prompt[:, first:last], torch.arange(first, last)[None], [1], [first])
            _assert_logits_close(logits, expected[:, first:last])


@pytest.mark.parametrize("window", ["token_window_0", "token_window_1"])
def test_an_inkling2_decode_step_without_a_window_is_wrong(inkling2, window: str) -> None:  # noqa: ANN001
    """What the logits tests above would catch: the same decode step with the key or the value
    window zeroed moves the logits beyond their tolerance. Only the step's own key or value is
    wrong then, one of 8 in a layer whose whole attention moves the logits by 0.25 (measured): the
    tokens test alone would not see it (measured: 5.8e-4 (keys) and 5.0e-4 (values) off on
    logits up to 13.8, against an atol of 1.4e-4 there)."""
    model, llm = inkling2
    prompt = PROMPTS[0]
    with torch.no_grad(), reference_kernels():
        first = int(llm.step(torch.tensor([prompt]), torch.arange(len(prompt))[None], [0], [0])[0, -1].argmax())
        llm.caches[window][0].zero_()
        stale = llm.step(torch.tensor([[first]]), torch.tensor([[len(prompt)]]), [0], [len(prompt)])[0, -1]
        expected = model(torch.tensor([[*prompt, first]])).logits[0, -1]
    with pytest.raises(AssertionError, match="Tensor-likes are not close"):
        _assert_logits_close(stale, expected)


def test_inkling2_paged_form_is_refused_by_its_sinks() -> None:
    """`ad.cached_attention` over pages takes sinks per head only: the paged form refuses the sinks per token
    by name, as a `PerSequenceState` (what `paged_where_possible` falls back to the slot form on).
    One sliding layer: a full layer's token windows are refused first (per-slot states)."""
    with pytest.raises(PerSequenceState, match=r"model\.layers\.0\.self_attn: its sink logits are one per token"):
        ad_mlir.LLM(_inkling2(["hybrid_sliding"]), max_batch=2, max_seq_len=32, page_size=4)
