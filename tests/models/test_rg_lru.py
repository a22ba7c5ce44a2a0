"""RecurrentGemma's RG-LRU (its recurrent blocks' linear recurrence h_t = a_t h_{t-1} + x_t per
channel, beside a padded temporal convolution; its other layers sliding-window attention). HF's
`RecurrentGemmaRglru._rnn_scan` loops over time steps in Python; while exporting it is routed
through the opaque `ad_mlir.rg_lru_scan` (`frontends/export_patches.py`), everything before the
scan (the gates, the reset at position 0, the input normalization) left as ordinary ops."""

from __future__ import annotations

import pytest
import torch
from kernel_guard import graph_kernels
from test_generate import (
    PROMPTS,
    _assert_interpreted_tokens_are_hf,
    _assert_logits_close,
    _assert_step_logits_match,
    _hf_tokens,
)
from test_paged import NUM_PAGES, PAGE_SIZE, _assert_tokens_are_hf, _run_schedule
from transformers import AutoModelForCausalLM, RecurrentGemmaConfig
from transformers.models.recurrent_gemma.modeling_recurrent_gemma import RecurrentGemmaRglru

import ad_mlir
from ad_mlir.bench.families import sweep_family
from ad_mlir.dialects import ad
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.semantics import torch_ops

CONFIG = RecurrentGemmaConfig(
    vocab_size=1000, hidden_size=64, lru_width=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, num_hidden_layers=2, block_types=["recurrent", "attention"], attention_window_size=16,
    conv1d_width=4, initializer_range=0.5, w_init_variance_scale=1.0, pad_token_id=0)
"""A recurrent block (its convolution of 4 and its RG-LRU of width 64) and a sliding-window
attention layer, with a wide init so that greedy tokens vary and a wrong or missing state shows.
RecurrentGemma's init reads `w_init_variance_scale`, not `initializer_range`: at its default
(0.01) the embeddings' std is 0.05 and HF's greedy tokens repeat the prompt's last; at 1.0 they
vary (logits up to ~15, as the other families' tests)."""
SLOTS = 3
"""State slots: `test_paged._run_schedule`'s three sequences at once; the slot form's tests run
three prompts through them too."""


def test_the_opaque_scan_is_hf_rnn_scan_with_its_resets() -> None:
    """Two rows, one restarting mid-sequence (a packed document boundary): the op on HF's gate
    times `~reset` equals HF's loop, bit for bit (the same fp32 products and sums in the same order)."""
    gen = torch.Generator().manual_seed(0)
    x, a = torch.randn(2, 9, 16, generator=gen), torch.rand(2, 9, 16, generator=gen)
    reset = torch.zeros(2, 9, 1, dtype=torch.bool)
    reset[:, 0], reset[1, 4] = True, True
    expected, _ = RecurrentGemmaRglru._rnn_scan(None, x, a, reset, None)
    assert torch.equal(torch_ops.rg_lru_scan(x, a * ~reset), expected)
    assert not torch.equal(torch_ops.rg_lru_scan(x, a), expected), "the reset mid-sequence matters"


def test_recurrent_gemma_exports_with_a_dynamic_length_and_matches_eager() -> None:
    """The family sweep's fp32 check (two lengths, one export): within torch.testing's fp32
    defaults on the logits, as every family of the matrix."""
    row = sweep_family("recurrent_gemma", bf16=False)
    assert row.status == "ok", row.reason
    assert sorted(row.reference_error) == sorted(row.interpreter_error) == [5, 11]
    for error in (*row.reference_error.values(), *row.interpreter_error.values()):
        assert error <= 1e-5


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(CONFIG).eval()


@pytest.fixture(scope="module")
def slots(model: torch.nn.Module) -> ad_mlir.LLM:
    return ad_mlir.LLM(model, max_batch=2, max_seq_len=48)


def test_the_rg_lru_state_is_cached_per_slot_in_fp32(slots: ad_mlir.LLM) -> None:
    """Beside the convolution's state and the attention's K/V cache: one fp32 [slots, width] state
    (HF keeps it in fp32 too)."""
    assert {name: (tuple(c.shape), c.dtype) for name, c in slots.caches.items() if name in slots.slot_states} == {
        "conv_state_0": ((2, 64, 3), torch.float32), "rg_lru_state_0": ((2, 64), torch.float32)}
    ops = [type(op) for op in slots.program.function.body.walk()]
    assert ops.count(ad.CachedRgLruOp) == ops.count(ad.CachedCausalConv1dOp) == ops.count(ad.CachedAttentionOp) == 1


def test_greedy_tokens_match_hf_generate(model: torch.nn.Module, slots: ad_mlir.LLM) -> None:
    """Three prompts in two slots, 16 new tokens: a slot is reused, its state reset by the new prompt."""
    with reference_kernels():
        outputs = slots.generate(PROMPTS, max_new_tokens=16)
    assert [out.token_ids for out in outputs] == [_hf_tokens(model, prompt, 16) for prompt in PROMPTS]


def test_step_logits_match_hf_prefill_and_decode(model: torch.nn.Module, slots: ad_mlir.LLM) -> None:
    """Prefills of 7 and 11 tokens, then 4 decode steps of both rows, against HF's full-prefix
    forward within `_assert_logits_close`'s fp32 tolerance (1e-5 per unit of the largest logit)."""
    _assert_step_logits_match(model, slots)


def test_a_decode_step_without_the_rg_lru_state_is_wrong(model: torch.nn.Module, slots: ad_mlir.LLM) -> None:
    """What the tests above would catch: the same decode step with the slot's RG-LRU state zeroed
    (the convolution's and the K/V kept) moves the logits far beyond their tolerance (1.5e-4 on
    logits up to ~15; measured: 0.99 off)."""
    prompt = PROMPTS[0]
    with torch.no_grad(), reference_kernels():
        first = int(slots.step(torch.tensor([prompt]), torch.arange(len(prompt))[None], [0], [0])[0, -1].argmax())
        slots.caches["rg_lru_state_0"][0].zero_()
        stale = slots.step(torch.tensor([[first]]), torch.tensor([[len(prompt)]]), [0], [len(prompt)])[0, -1]
        expected = model(torch.tensor([[*prompt, first]])).logits[0, -1]
    assert (stale - expected).abs().max() > 0.1


def test_a_prompt_prefilled_in_two_chunks_equals_one_prefill(model: torch.nn.Module, slots: ad_mlir.LLM) -> None:
    """The second chunk (start > 0, no position 0 to reset at) continues from the state, the
    convolution's inputs and the K/V the first left."""
    prompt = torch.tensor([PROMPTS[2]])
    with torch.no_grad(), reference_kernels():
        slots.step(prompt[:, :4], torch.arange(4)[None], [1], [0])
        chunked = slots.step(prompt[:, 4:], torch.arange(4, prompt.shape[1])[None], [1], [4])
        _assert_logits_close(chunked, model(prompt).logits[:, 4:])


@pytest.fixture(scope="module")
def paged(model: torch.nn.Module) -> ad_mlir.LLM:
    return ad_mlir.LLM(model, max_batch=SLOTS, max_seq_len=24, page_size=PAGE_SIZE, num_pages=NUM_PAGES)


def test_the_paged_form_keeps_the_state_in_state_slots(model: torch.nn.Module, paged: ad_mlir.LLM) -> None:
    """`test_paged._run_schedule`'s flattened steps (chunks beside decodes, state slots not in the
    sequences' order), every logit asked for against HF's full-prefix forward within 1e-5 per unit
    of the largest logit, the tokens fed back HF's greedy ones. On the kernels' reference: the
    varlen kernel is checked against HF's whole sequences and on ragged steps in
    tests/unit/test_rg_lru_kernel.py (these steps in the interpreter cost ~12 s)."""
    assert paged.num_state_slots == SLOTS and paged.caches["rg_lru_state_0"].shape == (SLOTS, 64)
    lru = [op for op in paged.program.function.body.walk() if isinstance(op, ad.CachedRgLruOp)]
    assert len(lru) == 1 and lru[0].query_starts is not None
    _assert_tokens_are_hf(model, _run_schedule(model, paged, 1e-5))


def test_in_the_interpreter(model: torch.nn.Module, slots: ad_mlir.LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kernel in the Triton interpreter, the RG-LRU's and the convolution's among them, the
    reference refused: three prompts in two slots, 6 new tokens."""
    kernels = graph_kernels(slots.graph)
    assert any(name.startswith("cached_rg_lru") for name in kernels), kernels
    assert any(name.startswith("cached_causal_conv1d") for name in kernels), kernels
    _assert_interpreted_tokens_are_hf(model, slots, monkeypatch, PROMPTS, 6)
