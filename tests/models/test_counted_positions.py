"""Decoders that count their positions themselves (no `position_ids` input): BART's learned
positional embedding, a table indexed by arange(past, past + seq) + 2, and Pegasus' sinusoidal
one, indexed by the range alone, generating through the K/V cache. `insert-cached-attention`
gives the range the step's real positions (each row's cache start + 0..seq-1 in the slot form,
the `position_ids` input in the paged form), so a decode step reads the table at its own
position, not at 0. Models built from their config classes with wide random weights, so that
greedy tokens vary; tokens against HF `generate` (three prompts in two slots) and per-step logits
(prefill and 4 decode steps) against HF's full-prefix forward; BART's paged form through
flattened steps that mix prefill chunks and decodes (`test_paged._run_schedule`), with the
kernels as their torch reference and, for BART's slot form, in the Triton interpreter."""

from __future__ import annotations

import pytest
import torch
from test_attention_spellings import PROMPTS
from test_generate import _assert_interpreted_tokens_are_hf, _assert_step_logits_match, _hf_tokens
from test_paged import NUM_PAGES, PAGE_SIZE, _assert_tokens_are_hf, _run_schedule

import ad_mlir
from ad_mlir.bench.families import greedy_only
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.zoo.small import model_from_config, small_config

DECODER = {"decoder_layers": 2, "decoder_ffn_dim": 128, "decoder_attention_heads": 4}
"""The decoder's own sizes (the small config sets the encoder's: `num_hidden_layers` is BART's
`encoder_layers`), so that HF's cache, made for `num_hidden_layers` layers, holds every layer."""


def _decoder(family: str) -> torch.nn.Module:
    config = small_config(family, hidden_size=64, overrides=DECODER)
    config.initializer_range = 0.5
    torch.manual_seed(0)
    return greedy_only(model_from_config(config).eval())  # BART's and Pegasus' force EOS as the last token


@pytest.fixture(scope="module", params=["bart", "pegasus"])
def counted(request: pytest.FixtureRequest) -> tuple[torch.nn.Module, ad_mlir.LLM]:
    model = _decoder(request.param)
    return model, ad_mlir.LLM(model, max_batch=2, max_seq_len=32)


def test_generates_hf_greedy_tokens(counted) -> None:  # noqa: ANN001
    model, llm = counted
    with reference_kernels():
        outputs = llm.generate(PROMPTS, max_new_tokens=8)
    assert [out.token_ids for out in outputs] == [_hf_tokens(model, prompt, 8) for prompt in PROMPTS]


def test_step_logits_match_hf_prefill_and_decode(counted) -> None:  # noqa: ANN001
    _assert_step_logits_match(*counted)


@pytest.mark.parametrize("counted", ["bart"], indirect=True)
def test_in_the_interpreter(counted, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The positions' kernel (the cache starts plus the range, offset and looked up, viewed as
    the rows) in the Triton interpreter: three prompts in two slots."""
    _assert_interpreted_tokens_are_hf(*counted, monkeypatch, PROMPTS, 4)


def test_paged_flattened_steps_match_hf() -> None:
    """The paged form: the positions are the `position_ids` input of each flattened token
    (prefill chunks that start past 0, decodes of several sequences in one step)."""
    model = _decoder("bart")
    llm = ad_mlir.LLM(model, max_batch=3, max_seq_len=24, page_size=PAGE_SIZE, num_pages=NUM_PAGES)
    assert "position_ids" in llm.inputs
    _assert_tokens_are_hf(model, _run_schedule(model, llm, atol=1e-5))
