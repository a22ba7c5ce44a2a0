"""The continuous-batching engine (`ad_mlir.llm.engine`): requests that arrive while others
decode, prompts longer than a step's token budget (chunked prefill beside running decodes),
aborts, stop strings and per-request sampling. Greedy tokens of every request equal HF
`generate` on that prompt alone (a wide-init tiny Llama, whose tokens vary), whatever else ran
beside it; the kernels run as their torch reference."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from engine_steps import checked_step
from test_generate import PROMPTS, _family_model, _hf_tokens

import ad_mlir
from ad_mlir.llm.engine import Engine, RequestError, RequestUpdate, SamplingParams
from ad_mlir.runtime.kernels import reference_kernels

NEW = 8


class CharTokenizer:
    """Token t is the letter chr(97 + t % 26): a tokenizer whose text is easy to reason about."""

    eos_token_id = None

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(97 + t % 26) for t in ids)


@pytest.fixture(scope="module")
def llama() -> tuple[torch.nn.Module, ad_mlir.LLM, list[list[int]]]:
    model = _family_model("llama")
    llm = ad_mlir.LLM(model, max_batch=2, max_seq_len=48)
    return model, llm, [_hf_tokens(model, p, NEW) for p in PROMPTS]


class FedTokens:
    """Counts the tokens each forward call of `llm` feeds, per step of the engine."""

    def __init__(self, llm: ad_mlir.LLM, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[int] = []
        step = llm.step
        monkeypatch.setattr(llm, "step", lambda tokens, *a, **k: self.calls.append(tokens.numel()) or step(tokens, *a, **k))


def _run(engine: Engine, arrivals: dict[int, list[tuple[list[int], SamplingParams]]] | None = None,
         on_step=None, failures_end_requests: bool = False) -> dict[str, list[RequestUpdate]]:  # noqa: ANN001
    """Step until idle, adding `arrivals[i]` before step i; the updates per request. A request
    the engine ends with an error raises it, unless `failures_end_requests`."""
    updates: dict[str, list[RequestUpdate]] = {}
    i = 0
    while engine.has_work or (arrivals and any(k >= i for k in arrivals)):
        for prompt, params in (arrivals or {}).get(i, []):
            engine.add(prompt, params, request_id=f"r{prompt[0]}")
        with reference_kernels():
            for update in engine.step() if failures_end_requests else checked_step(engine):
                updates.setdefault(update.request_id, []).append(update)
        if on_step:
            on_step(engine)
        i += 1
    return updates


def test_requests_arriving_while_others_decode_get_hf_tokens(llama) -> None:
    _, llm, hf = llama
    greedy = SamplingParams(max_tokens=NEW, ignore_eos=True)
    engine = Engine(llm)
    updates = _run(engine, {0: [(PROMPTS[0], greedy)], 3: [(PROMPTS[1], greedy)], 4: [(PROMPTS[2], greedy)]})
    for prompt, expected in zip(PROMPTS, hf, strict=True):
        got = [t for u in updates[f"r{prompt[0]}"] for t in u.token_ids]
        assert got == expected
        assert updates[f"r{prompt[0]}"][-1].finish_reason == "length"
    assert sorted(engine.free_slots) == [0, 1] and not engine.running and not engine.waiting


def test_a_long_prompt_is_prefilled_in_chunks_while_decodes_go_on(llama, monkeypatch: pytest.MonkeyPatch) -> None:
    """Budget 4 tokens per step: the 11-token prompt arrives while the 2-token one decodes; each
    step feeds at most 4 tokens, the decode gets a token in every step of the chunked prefill,
    and both get HF's tokens (chunks of a prefill attend to the cached earlier chunks)."""
    _, llm, hf = llama
    greedy = SamplingParams(max_tokens=NEW, ignore_eos=True)
    engine = Engine(llm, max_step_tokens=4)
    fed = FedTokens(llm, monkeypatch)
    per_step: list[int] = []
    decoded_while_prefilling: list[bool] = []

    def watch(e: Engine) -> None:
        per_step.append(sum(fed.calls))
        fed.calls.clear()
        long = next((r for r in e.running if r.id == f"r{PROMPTS[2][0]}"), None)
        if long is not None and not long.prefilled:
            decoded_while_prefilling.append(len(next(r for r in e.running if r.id == f"r{PROMPTS[1][0]}")
                                                .output.token_ids) > 0)

    updates = _run(engine, {0: [(PROMPTS[1], greedy)], 2: [(PROMPTS[2], greedy)]}, on_step=watch)
    assert max(per_step) <= 4, per_step
    assert len(decoded_while_prefilling) >= 2 and all(decoded_while_prefilling)
    for prompt, expected in ((PROMPTS[1], hf[1]), (PROMPTS[2], hf[2])):
        assert [t for u in updates[f"r{prompt[0]}"] for t in u.token_ids] == expected


def test_an_aborted_request_frees_its_slot_for_the_next(llama) -> None:
    _, llm, hf = llama
    greedy = SamplingParams(max_tokens=NEW, ignore_eos=True)
    engine = Engine(llm)
    a = engine.add(PROMPTS[0], greedy)
    b = engine.add(PROMPTS[1], greedy)
    c = engine.add(PROMPTS[2], greedy)
    with reference_kernels():
        checked_step(engine)
        checked_step(engine)
    assert c in engine.waiting
    assert engine.abort(a.id) and a.output.finish_reason == "abort" and a not in engine.running
    assert not engine.abort("no-such-request")
    with reference_kernels():
        checked_step(engine)
        assert c in engine.running, "the freed slot went to the waiting request"
        while engine.has_work:
            checked_step(engine)
    assert b.output.token_ids == hf[1] and c.output.token_ids == hf[2]
    assert sorted(engine.free_slots) == [0, 1]


def test_a_request_that_cannot_fit_is_refused_before_it_queues(llama) -> None:
    _, llm, _ = llama
    engine = Engine(llm)
    with pytest.raises(ValueError, match=r"the prompt has 40 tokens: with max_tokens=9 it needs 49 > max_seq_len=48"):
        engine.add([1] * 40, SamplingParams(max_tokens=9))
    with pytest.raises(ValueError, match="top_p must be in"):
        SamplingParams(top_p=0)
    assert not engine.has_work


def test_sampling_params_take_openais_ranges_ends_included() -> None:
    """logprobs (OpenAI's top_logprobs) 0 to 20, presence and frequency penalties -2 to 2: the
    ends are taken, one step past them is refused naming the field."""
    SamplingParams(logprobs=20, presence_penalty=2.0, frequency_penalty=2.0)
    SamplingParams(logprobs=0, presence_penalty=-2.0, frequency_penalty=-2.0)
    for param, value in (("logprobs", 21), ("logprobs", -1), ("presence_penalty", 2.5), ("presence_penalty", -2.5),
                         ("frequency_penalty", 2.5), ("frequency_penalty", -2.5)):
        with pytest.raises(RequestError) as refused:
            SamplingParams(**{param: value})
        assert refused.value.param == param


def test_a_stop_string_ends_the_text_before_it_and_streams_nothing_of_it(llama, monkeypatch: pytest.MonkeyPatch) -> None:
    _, llm, hf = llama
    monkeypatch.setattr(llm, "tokenizer", CharTokenizer())
    full = CharTokenizer().decode(hf[0])
    stop = full[3:5]  # the letters of HF's 4th and 5th tokens
    assert stop not in full[:4], "the stop string must first appear at the 4th token for this test"
    engine = Engine(llm)
    updates = _run(engine, {0: [(PROMPTS[0], SamplingParams(max_tokens=NEW, stop=(stop,), ignore_eos=True))]})
    got = updates[f"r{PROMPTS[0][0]}"]
    assert "".join(u.text for u in got) == full[:3]
    assert got[-1].finish_reason == "stop"
    assert [t for u in got for t in u.token_ids] == hf[0][:5]  # it ends once the stop string is complete


def test_sampling_is_per_request_seeded_and_top_k_1_is_greedy(llama) -> None:
    _, llm, hf = llama
    with reference_kernels():
        a = llm.generate(PROMPTS, max_new_tokens=NEW, temperature=1.5, seed=3, ignore_eos=True)
        b = llm.generate(PROMPTS[::-1], max_new_tokens=NEW, temperature=1.5, seed=3, ignore_eos=True)
        top1 = llm.generate(PROMPTS, max_new_tokens=NEW, temperature=1.5, top_k=1, seed=3, ignore_eos=True)
    assert [o.token_ids for o in a] == [o.token_ids for o in b][::-1], "a request's samples depend on others"
    assert [o.token_ids for o in a] != hf
    assert [o.token_ids for o in top1] == hf


def test_a_failed_prefill_call_ends_that_request_alone(llama, monkeypatch: pytest.MonkeyPatch) -> None:
    """The prefill call of the second prompt raises: that request ends with the error and no
    token, its slot goes to the third, and the other two get HF's tokens."""
    _, llm, hf = llama
    real_step = llm.step

    def step(tokens: torch.Tensor, *args, **kwargs) -> torch.Tensor:  # noqa: ANN002, ANN003
        if tokens[0, 0] == PROMPTS[1][0]:
            raise RuntimeError("an injected fault")
        return real_step(tokens, *args, **kwargs)

    monkeypatch.setattr(llm, "step", step)
    greedy = SamplingParams(max_tokens=NEW, ignore_eos=True)
    engine = Engine(llm)
    updates = _run(engine, {0: [(p, greedy) for p in PROMPTS]}, failures_end_requests=True)
    failed = updates[f"r{PROMPTS[1][0]}"]
    assert [(u.token_ids, u.finish_reason, str(u.error)) for u in failed] == [([], "error", "an injected fault")]
    for n in (0, 2):
        assert [t for u in updates[f"r{PROMPTS[n][0]}"] for t in u.token_ids] == hf[n]
    assert sorted(engine.free_slots) == [0, 1] and not engine.has_work


def test_a_failed_decode_call_ends_the_requests_it_fed_and_no_other(llama, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two slots: the third decode call (both first prompts in it) raises; both end with the
    error after three tokens, and the waiting third prompt then runs to HF's tokens."""
    _, llm, hf = llama
    real_decode, calls = llm.decode, []

    def decode(*args, **kwargs) -> torch.Tensor:  # noqa: ANN002, ANN003
        calls.append(len(args[0]))
        if len(calls) == 3:
            raise RuntimeError("an injected fault")
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(llm, "decode", decode)
    greedy = SamplingParams(max_tokens=NEW, ignore_eos=True)
    engine = Engine(llm)
    updates = _run(engine, {0: [(p, greedy) for p in PROMPTS]}, failures_end_requests=True)
    assert calls[2] == 2, "the failed call fed both running requests"
    for n in (0, 1):
        got = updates[f"r{PROMPTS[n][0]}"]
        assert got[-1].finish_reason == "error" and str(got[-1].error) == "an injected fault"
        assert [t for u in got for t in u.token_ids] == hf[n][:3]
    assert [t for u in updates[f"r{PROMPTS[2][0]}"] for t in u.token_ids] == hf[2]
    assert sorted(engine.free_slots) == [0, 1] and not engine.has_work
