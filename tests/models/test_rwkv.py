"""RWKV's time mixing (the WKV recurrence: per channel a decayed sum of e^k v over the past
tokens, divided by the same sum of e^k, the current token weighted by its bonus e^u, with a
running maximum for stability; beside it a shift by one token into the key, value and
receptance). HF's `rwkv_linear_attention_cpu` loops over time steps in Python; while exporting,
`RwkvSelfAttention.forward` without a state routes it through the opaque `ad_mlir.wkv_scan`
(`frontends/export_patches.py`), the token shift, the projections and the decay `-exp(time_decay)`
left as ordinary ops, and so is the token shift of both mixings, as a shift by a concatenation
(`cat([zeros, x])[:, :-1]`), which the cache pass holds as a token window. Cached, the recurrence
is `ad.cached_wkv` over an fp32 state [slots, 3, width] (`passes/cache/wkv.py`). Paged
(`LLM(page_size=)`: states alone, no page pool), both ops take `query_starts` over state slots."""

from __future__ import annotations

import pytest
import test_paged
import torch
from kernel_guard import kernel_calls, kernels_ran, reference_calls
from test_generate import (
    PROMPTS,
    _assert_logits_close,
    _assert_step_logits_match,
    _hf_tokens,
)
from test_paged import NUM_PAGES, PAGE_SIZE, _assert_tokens_are_hf, _run_schedule
from transformers import AutoModelForCausalLM, RwkvConfig
from transformers.models.rwkv.modeling_rwkv import rwkv_linear_attention_cpu

import ad_mlir
from ad_mlir.bench.families import sweep_family
from ad_mlir.dialects import ad
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.semantics import torch_ops

CONFIG = RwkvConfig(vocab_size=1000, hidden_size=64, attention_hidden_size=64, intermediate_size=128,
                    num_hidden_layers=2, context_length=64, pad_token_id=0)
"""Two blocks of width 64. RWKV's init ignores `initializer_range` (orthogonal weights, HF's decay
and bonus ramps): under it HF's greedy tokens already vary (`_hf_tokens` asserts it; logits up
to ~2)."""


def test_the_opaque_scan_is_hf_wkv_loop() -> None:
    """Keys wide enough that the running maximum moves both ways: the op equals HF's loop bit
    for bit (the same fp32 operations in the same order)."""
    gen = torch.Generator().manual_seed(0)
    decay, bonus = torch.randn(16, generator=gen), torch.randn(16, generator=gen)
    k, v = 8 * torch.randn(2, 9, 16, generator=gen), torch.randn(2, 9, 16, generator=gen)
    expected, _ = rwkv_linear_attention_cpu(decay, bonus, k, v)
    assert torch.equal(torch_ops.wkv_scan(-torch.exp(decay), bonus, k, v), expected)


def test_the_cached_op_continues_hf_state() -> None:
    """Two rows in slots 2 and 0, 4 tokens then 5: the cached op's outputs equal HF's loop over
    the 9 tokens bit for bit, and its state after them HF's (num, den, max), row by row."""
    gen = torch.Generator().manual_seed(1)
    decay, bonus = torch.randn(16, generator=gen), torch.randn(16, generator=gen)
    k, v = 8 * torch.randn(2, 9, 16, generator=gen), torch.randn(2, 9, 16, generator=gen)
    expected, hf_state = rwkv_linear_attention_cpu(decay, bonus, k, v, return_state=True)
    state, slots = torch.full((3, 3, 16), float("nan")), torch.tensor([2, 0])
    w = -torch.exp(decay)
    first = torch_ops.cached_wkv(w, bonus, k[:, :4], v[:, :4], state, slots, torch.tensor([0, 0]))
    rest = torch_ops.cached_wkv(w, bonus, k[:, 4:], v[:, 4:], state, slots, torch.tensor([4, 4]))
    assert torch.equal(torch.cat([first, rest], dim=1), expected)
    assert torch.equal(state[slots], torch.stack(hf_state, dim=1))


def test_rwkv_exports_with_a_dynamic_length_and_matches_eager() -> None:
    """The family sweep's fp32 check (two lengths, one export): within torch.testing's fp32
    defaults on the logits, as every family of the matrix."""
    row = sweep_family("rwkv", bf16=False)
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


def test_the_wkv_state_is_cached_per_slot_in_fp32(slots: ad_mlir.LLM) -> None:
    """Per block one fp32 [slots, 3, width] state (num, den, max: HF keeps them in fp32 too) and
    two token windows of one token (the time mixing's and the channel mixing's token shifts)."""
    states = {name: (tuple(c.shape), c.dtype) for name, c in slots.caches.items() if name in slots.slot_states}
    assert {name: shape for name, shape in states.items() if name.startswith("wkv")} == {
        f"wkv_state_{i}": ((2, 3, 64), torch.float32) for i in range(2)}
    assert {name: shape for name, shape in states.items() if name.startswith("token_window")} == {
        f"token_window_{i}": ((2, 1, 64), torch.float32) for i in range(4)}
    ops = [type(op) for op in slots.program.function.body.walk()]
    assert ops.count(ad.CachedWkvOp) == 2 and ops.count(ad.CachedTokenWindowOp) == 4


def test_greedy_tokens_match_hf_generate(model: torch.nn.Module, slots: ad_mlir.LLM) -> None:
    """Three prompts in two slots, 16 new tokens: a slot is reused, its state reset by the new prompt."""
    with reference_kernels():
        outputs = slots.generate(PROMPTS, max_new_tokens=16)
    assert [out.token_ids for out in outputs] == [_hf_tokens(model, prompt, 16) for prompt in PROMPTS]


def test_step_logits_match_hf_prefill_and_decode(model: torch.nn.Module, slots: ad_mlir.LLM) -> None:
    """Prefills of 7 and 11 tokens, then 4 decode steps of both rows, against HF's full-prefix
    forward within `_assert_logits_close`'s fp32 tolerance (1e-5 per unit of the largest logit)."""
    _assert_step_logits_match(model, slots)


def test_a_decode_step_without_the_wkv_state_is_wrong(model: torch.nn.Module, slots: ad_mlir.LLM) -> None:
    """What the tests above would catch: the same decode step with the slot's WKV states emptied
    (the token windows kept) moves the logits far beyond their tolerance (2e-5 on logits up to ~2;
    measured: 1.09 off)."""
    prompt = PROMPTS[0]
    with torch.no_grad(), reference_kernels():
        first = int(slots.step(torch.tensor([prompt]), torch.arange(len(prompt))[None], [0], [0])[0, -1].argmax())
        for i in range(2):
            slots.caches[f"wkv_state_{i}"][0] = torch_ops._wkv_empty_state(torch.zeros(64))
        stale = slots.step(torch.tensor([[first]]), torch.tensor([[len(prompt)]]), [0], [len(prompt)])[0, -1]
        expected = model(torch.tensor([[*prompt, first]])).logits[0, -1]
    assert (stale - expected).abs().max() > 0.1


def test_a_prompt_prefilled_in_two_chunks_equals_one_prefill(model: torch.nn.Module, slots: ad_mlir.LLM) -> None:
    """The second chunk (start > 0) continues from the WKV states and the token windows the first left."""
    prompt = torch.tensor([PROMPTS[2]])
    with torch.no_grad(), reference_kernels():
        slots.step(prompt[:, :4], torch.arange(4)[None], [1], [0])
        chunked = slots.step(prompt[:, 4:], torch.arange(4, prompt.shape[1])[None], [1], [4])
        _assert_logits_close(chunked, model(prompt).logits[:, 4:])


def test_in_the_interpreter(model: torch.nn.Module, slots: ad_mlir.LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kernel in the Triton interpreter, no region on its reference semantics: three prompts
    in two slots, 6 new tokens, HF's. The graph calls the WKV kernel of both blocks; its only
    reference ops are the four token windows (`ad.cached_token_window` has no kernel template), so
    `kernel_guard.graph_kernels`, which refuses any reference op, is not asked."""
    assert reference_calls(slots.graph) == ["ad_mlir.cached_token_window.default"] * 4
    assert sum(name.startswith("cached_wkv") for name in kernel_calls(slots.graph)) == 2
    with kernels_ran(monkeypatch) as launches:
        outputs = slots.generate(PROMPTS, max_new_tokens=6)
    assert [out.token_ids for out in outputs] == [_hf_tokens(model, prompt, 6) for prompt in PROMPTS]
    assert sum(n for name, n in launches.items() if name.startswith("cached_wkv")) > 0, launches


@pytest.fixture(scope="module")
def paged(model: torch.nn.Module) -> ad_mlir.LLM:
    return ad_mlir.LLM(model, max_batch=3, max_seq_len=24, page_size=PAGE_SIZE, num_pages=NUM_PAGES)


def test_the_paged_form_keeps_the_states_in_state_slots(paged: ad_mlir.LLM) -> None:
    """No attention, so no page pool: the WKV states and the token windows in pools of 3 state
    slots, every cached op over the flattened step (`query_starts`)."""
    assert paged.page_size == PAGE_SIZE and set(paged.caches) == set(paged.slot_states)
    assert {name: tuple(c.shape)[0] for name, c in paged.caches.items()} == dict.fromkeys(paged.caches, 3)
    cached = [op for op in paged.program.function.body.walk()
              if isinstance(op, (ad.CachedWkvOp, ad.CachedTokenWindowOp))]
    assert len(cached) == 6 and all(op.query_starts is not None for op in cached)


def test_flattened_steps_match_hf(model: torch.nn.Module, paged: ad_mlir.LLM) -> None:
    """test_paged's flattened steps (prefill chunks beside decodes, a prompt over two steps, state
    slots not in the sequences' order): every logit asked for against HF's full-prefix forward
    within the slot form's 1e-5 per unit of the largest logit; the greedy tokens HF's."""
    _assert_tokens_are_hf(model, _run_schedule(model, paged, 1e-5))


def test_flattened_steps_that_forget_the_states_are_seen(model: torch.nn.Module, paged: ad_mlir.LLM,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: with the state pools (WKV states and token windows) zeroed before each
    step, a chunk or decode that continues a sequence differs from HF's."""
    forward = paged.forward_flat

    def forgetful(*args: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
        for state in paged.caches.values():
            state.zero_()
        return forward(*args, **kwargs)

    monkeypatch.setattr(paged, "forward_flat", forgetful)
    with pytest.raises(AssertionError, match="Tensor-likes are not close"):
        _run_schedule(model, paged, 1e-5)


def test_paged_in_the_interpreter(model: torch.nn.Module, paged: ad_mlir.LLM,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The first four flattened steps with the WKV kernel's varlen form in the Triton interpreter
    (the token windows on their torch meaning, as in the slot form): HF's tokens so far."""
    monkeypatch.setattr(test_paged, "SCHEDULE", test_paged.SCHEDULE[:4])
    generated = _run_schedule(model, paged, 1e-5, lambda: kernels_ran(monkeypatch))
    assert [len(tokens) for tokens in generated] == [3, 4, 2]
    for prompt, tokens in zip(PROMPTS, generated, strict=True):
        assert tokens == _hf_tokens(model, prompt, 8)[:len(tokens)]


def test_paged_generate_gives_hf_tokens(model: torch.nn.Module, paged: ad_mlir.LLM) -> None:
    """`LLM.generate` on the paged scheduler: three prompts at once, 10 new tokens each."""
    with reference_kernels():
        outputs = paged.generate(PROMPTS, max_new_tokens=10)
    assert [out.token_ids for out in outputs] == [_hf_tokens(model, prompt, 10) for prompt in PROMPTS]
