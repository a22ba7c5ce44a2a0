"""Speculative decoding (`ad_mlir.llm.speculative`, `PagedEngine(speculative=...)`).

The greedy tokens must be exactly plain decoding's (HF `generate` of a wide-init tiny Llama,
whose tokens vary). Drafts come from an oracle that knows HF's tokens and drafts them with every
third one wrong, so each step both accepts and rejects; the rejected drafts' K/V sit in the pages
past the rolled-back length until the next step writes over them. That runs on the engine's test
double of a paged model (which checks that every position read was written in the sequence's
own context) and on the compiled paged model, where every verified row's logits are also
compared with HF's forward of the same tokens. The n-gram proposer is checked on token lists,
and through `LLM.generate` on a prompt that repeats itself. Sampling: `verify`'s tokens follow
the model's distribution whatever the draft (a chi-square test over many seeded draws)."""

from __future__ import annotations

import copy
import itertools
import math
import re
import urllib.request
from collections.abc import Sequence

import pytest
import torch
from engine_steps import checked_step
from test_engine import CharTokenizer
from test_generate import WIDE, _assert_logits_close, _family_model, _hf_tokens
from test_paged_engine import GREEDY, NEW, PagedTokens, _prompts, _run
from test_serve import _post, _serving

import ad_mlir
from ad_mlir.llm.engine import PagedEngine, SamplingParams, make_engine
from ad_mlir.llm.sampling import sampling_probs
from ad_mlir.llm.speculative import DraftModelProposer, NgramProposer, verify
from ad_mlir.serve.app import build_app
from ad_mlir.serve.runner import EngineRunner
from ad_mlir.zoo.small import small_model
from ad_mlir.zoo.tiny import TinyConfig, build_model

PROMPTS = ((3, 17, 9, 41, 5), (60, 2, 33), (11, 12, 13, 14, 15, 16, 17))


class Oracle:
    """Drafts the true continuation (HF's greedy tokens after the sequence's prompt) with every
    third drafted token replaced by a wrong one: accepted drafts, and a rejection in most steps."""

    def __init__(self, hf: dict[tuple[int, ...], list[int]], vocab: int) -> None:
        self.hf, self.vocab, self.drafts = hf, vocab, 0

    def propose(self, sequences: Sequence[Sequence[int]], limits: Sequence[int]) -> list[list[int]]:
        return [self._draft(tokens, limit) for tokens, limit in zip(sequences, limits, strict=True)]

    def _draft(self, tokens: Sequence[int], limit: int) -> list[int]:
        prompt = next(p for p in self.hf if tuple(tokens[:len(p)]) == p)
        truth = self.hf[prompt][len(tokens) - len(prompt):][:min(limit, 4)]
        draft = []
        for token in truth:
            self.drafts += 1
            draft.append((token + 1) % self.vocab if self.drafts % 3 == 0 else token)
        return draft


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return _family_model("llama")


@pytest.fixture(scope="module")
def paged(model: torch.nn.Module) -> ad_mlir.LLM:
    """The compiled paged form (kernels as their torch reference on the CPU), drafting by n-gram."""
    return ad_mlir.LLM(model, max_batch=2, max_seq_len=32, page_size=4, num_pages=16, speculative=NgramProposer())


@pytest.fixture(scope="module")
def hf(model: torch.nn.Module) -> dict[tuple[int, ...], list[int]]:
    return {tuple(p): _hf_tokens(model, list(p), NEW) for p in PROMPTS}


def _generate(engine: PagedEngine, prompts: Sequence[Sequence[int]], params: SamplingParams = GREEDY) -> list[list[int]]:
    requests = [engine.add(p, params) for p in prompts]
    while engine.has_work:
        checked_step(engine)
    return [r.output.token_ids for r in requests]


def test_the_ngram_proposer_drafts_what_followed_the_latest_longest_match() -> None:
    proposer = NgramProposer(num_tokens=3, max_ngram=2)
    assert proposer.lookup([1, 2, 3, 4, 9, 2, 3, 5, 6, 2, 3], limit=8) == [5, 6, 2]  # [2, 3] last seen before 5
    assert proposer.lookup([1, 2, 3, 4, 9, 2, 3, 5, 6, 2, 3], limit=2) == [5, 6]
    assert proposer.lookup([7, 8, 1, 7, 9, 4, 1], limit=8) == [7, 9, 4]  # no [4, 1] before: the 1-gram [1]
    assert proposer.lookup([1, 2, 3], limit=8) == []
    assert proposer.lookup([5, 5], limit=8) == [5]
    assert proposer.lookup([1, 2, 1], limit=0) == []
    with pytest.raises(ValueError, match="min_ngram <= max_ngram"):
        NgramProposer(min_ngram=3, max_ngram=2)


@pytest.mark.parametrize("page_size", [2, 4])
def test_drafts_accepted_and_rejected_give_hfs_tokens_on_the_engine(model: torch.nn.Module, hf: dict,
                                                                     page_size: int) -> None:
    """More prompts than fit at once (pages for two), drafts across page ends; every request
    gets HF's tokens, in fewer steps than plain decoding."""
    oracle = Oracle(hf, model.config.vocab_size)
    plain = PagedTokens(model, num_pages=12 // page_size * 2, page_size=page_size, max_seq_len=24)
    assert _generate(PagedEngine(plain, max_running=2), PROMPTS) == [hf[tuple(p)] for p in PROMPTS]
    llm = PagedTokens(model, num_pages=12 // page_size * 2, page_size=page_size, max_seq_len=24)
    engine = PagedEngine(llm, max_running=2, speculative=oracle)
    assert _generate(engine, PROMPTS) == [hf[tuple(p)] for p in PROMPTS]
    assert 0 < engine.accepted_tokens < engine.drafted_tokens, (engine.accepted_tokens, engine.drafted_tokens)
    assert 1 < engine.tokens_per_draft_step
    assert len(llm.calls) < len(plain.calls), (len(llm.calls), len(plain.calls))
    assert engine.pages_in_use == 0 and not engine.blocks.tables


def test_drafts_with_chunked_prefill_prefix_caching_and_preemption(model: torch.nn.Module) -> None:
    """Four requests with a common first page arriving over time, prefill chunks of at most 8
    tokens a step, a pool of 9 pages (two requests' worth): requests are preempted and recomputed,
    later ones start on the cached first page, drafts are fed beside chunks; every request still
    gets HF's tokens and the pages stay consistent after every step."""
    system = [7, 7, 3, 9]
    prompts = [system + p for p in _prompts(4, [6, 9, 7, 8], seed=1)]
    hf = {tuple(p): _hf_tokens(model, p, NEW) for p in prompts}
    engine = PagedEngine(PagedTokens(model, num_pages=9), max_step_tokens=8,
                         speculative=Oracle(hf, model.config.vocab_size))
    got = _run(engine, {0: prompts[:2], 2: prompts[2:3], 5: prompts[3:]})
    assert [got[f"p{n}"] for n in range(4)] == [hf[tuple(p)] for p in prompts]
    assert engine.preemptions > 0 and engine.prefix_hits > 0
    assert 0 < engine.accepted_tokens < engine.drafted_tokens


def test_what_a_request_gets_is_what_plain_decoding_gives_it(model: torch.nn.Module, hf: dict) -> None:
    """Per request, the updates' tokens, text, finish reasons and log-probabilities with drafts
    equal plain decoding's: log-probabilities (a verified row is a decode's logits), a stop string
    cut inside an accepted draft, penalties (each drafted position's scores see the tokens
    accepted before it), a grammar-free logit bias."""
    prompts = [list(p) for p in PROMPTS]
    stop = CharTokenizer().decode(hf[PROMPTS[1]][3:5])  # text HF's tokens make: the answer ends before it
    params = [SamplingParams(max_tokens=NEW, logprobs=3), SamplingParams(max_tokens=NEW, stop=(stop,)),
              SamplingParams(max_tokens=NEW, presence_penalty=1.5, frequency_penalty=0.5,
                             logit_bias=((hf[PROMPTS[2]][2], -3.0),))]
    results = []
    for speculative in (None, Oracle(hf, model.config.vocab_size)):
        llm = PagedTokens(model, num_pages=36, page_size=2, max_seq_len=24)
        llm.tokenizer = CharTokenizer()
        engine = PagedEngine(llm, speculative=speculative)
        requests = [engine.add(p, q, request_id=f"r{i}") for i, (p, q) in enumerate(zip(prompts, params, strict=True))]
        updates: dict[str, list] = {r.id: [] for r in requests}
        while engine.has_work:
            for u in checked_step(engine):
                updates[u.request_id] += [(t, lp.token, lp.top) if lp else (t, None, None)
                                          for t, lp in itertools.zip_longest(u.token_ids, u.logprobs)]
        results.append(([(r.output.token_ids, r.text, r.output.finish_reason) for r in requests], updates,
                        engine.accepted_tokens))
    (plain, plain_updates, _), (drafted, drafted_updates, accepted) = results
    assert drafted == plain and accepted > 0
    assert plain[1][2] == "stop" and stop not in plain[1][1]
    for (t, token, top), (t2, token2, top2) in zip(plain_updates["r0"], drafted_updates["r0"], strict=True):
        assert (t, token) == (t2, token2) and [i for i, _ in top] == [i for i, _ in top2]
        torch.testing.assert_close(torch.tensor([v for _, v in top2]), torch.tensor([v for _, v in top]))


def test_a_draft_never_passes_max_tokens_or_preempts(model: torch.nn.Module, hf: dict) -> None:
    """Pages for exactly the two sequences' tokens: drafts shrink to what is spare, nothing is
    preempted, and no request gets more than its max_tokens."""
    oracle = Oracle(hf, model.config.vocab_size)
    llm = PagedTokens(model, num_pages=8, page_size=2, max_seq_len=24)
    engine = PagedEngine(llm, speculative=oracle)
    got = _generate(engine, PROMPTS[:2], SamplingParams(max_tokens=5))
    assert got == [hf[tuple(p)][:5] for p in PROMPTS[:2]]
    assert engine.preemptions == 0 and engine.drafted_tokens > 0


def test_a_model_with_per_sequence_states_is_refused(model: torch.nn.Module) -> None:
    llm = PagedTokens(model, num_pages=8)
    llm.num_state_slots = 2
    with pytest.raises(ValueError, match="per-sequence states .*cannot be rolled back"):
        PagedEngine(llm, speculative=NgramProposer())


def test_the_compiled_paged_model_verifies_drafts_with_hfs_logits(model: torch.nn.Module, paged: ad_mlir.LLM,
                                                                   hf: dict) -> None:
    """The compiled paged form (reference kernels): HF's tokens, and every row of logits that
    `forward_flat` returned (each drafted position's included) equals HF's forward of the tokens
    the sequence held there: its true tokens up to its cache start, then the tokens fed (a
    rejected draft's K/V read back by a later step would move them)."""
    llm = paged
    engine = make_engine(llm, speculative=Oracle(hf, model.config.vocab_size))
    steps = []
    forward_flat, schedule = llm.forward_flat, engine._schedule

    def recorded(*inputs: torch.Tensor, **kw: torch.Tensor) -> torch.Tensor:
        logits = forward_flat(*inputs, **kw)
        steps[-1] += ([t.clone() for t in inputs], logits.clone())
        return logits

    def scheduled() -> list:
        chunks = schedule()
        steps.append((tuple(tuple(c.request.output.prompt_token_ids) for c in chunks),))
        return chunks

    llm.forward_flat, engine._schedule = recorded, scheduled
    try:
        assert _generate(engine, PROMPTS) == [hf[tuple(p)] for p in PROMPTS]
    finally:
        del llm.forward_flat
    drafted_rows = 0
    for prompts, (ids, _, query_starts, cache_starts, _, logits_indices), logits in steps:
        for i, (prompt, start) in enumerate(zip(prompts, cache_starts.tolist(), strict=True)):
            fed = ids[0, query_starts[i]:query_starts[i + 1]].tolist()
            truth = list(prompt) + hf[prompt]
            with torch.no_grad():
                expected = model(torch.tensor([truth[:start] + fed])).logits[0, start:]
            rows = [(r, index - query_starts[i]) for r, index in enumerate(logits_indices.tolist())
                    if query_starts[i] <= index < query_starts[i + 1]]
            for r, offset in rows:
                _assert_logits_close(logits[r], expected[offset])
            drafted_rows += len(rows) - 1 if start >= len(prompt) else 0
    assert drafted_rows > 0 and 0 < engine.accepted_tokens < engine.drafted_tokens


def test_a_draft_model_of_the_same_weights_is_always_right(model: torch.nn.Module, hf: dict) -> None:
    """The target itself as the draft model (both the engine's double of a paged model): every
    draft is the next HF token, so all are accepted, steps fall by about the draft length, and
    the draft's own prefix cache finds the pages it wrote in earlier steps."""
    draft = DraftModelProposer(PagedTokens(model, num_pages=24, page_size=2, max_seq_len=24), num_tokens=3)
    llm = PagedTokens(model, num_pages=24, page_size=2, max_seq_len=24)
    engine = PagedEngine(llm, speculative=draft)
    assert _generate(engine, PROMPTS) == [hf[tuple(p)] for p in PROMPTS]
    assert engine.accepted_tokens == engine.drafted_tokens > 0
    assert engine.draft_steps <= -(-(NEW - 1) // 4) * len(PROMPTS)
    assert draft.blocks.prefix_hits > 0 and draft.blocks.pool.num_in_use == 0


def test_another_draft_model_is_partly_right_and_changes_no_token(model: torch.nn.Module, hf: dict) -> None:
    """A draft model of other weights (another seed of the tiny Llama): some drafts accepted,
    some rejected, HF's tokens either way; a draft vocabulary larger than the model's is refused."""
    other = build_model(TinyConfig(family="llama", hf_overrides=WIDE, seed=1))
    llm = PagedTokens(model, num_pages=24, page_size=2, max_seq_len=24)
    engine = PagedEngine(llm, speculative=DraftModelProposer(PagedTokens(other, num_pages=24, page_size=2,
                                                                         max_seq_len=24)))
    assert _generate(engine, PROMPTS) == [hf[tuple(p)] for p in PROMPTS]
    assert engine.drafted_tokens > engine.accepted_tokens
    wide = PagedTokens(other, num_pages=4)
    wide.vocab_size = model.config.vocab_size + 1
    with pytest.raises(ValueError, match="draft model's vocabulary .* larger"):
        PagedEngine(llm, speculative=DraftModelProposer(wide))


def test_a_draft_model_of_a_shorter_context_drafts_within_it(model: torch.nn.Module, hf: dict) -> None:
    """A draft model whose context (10 tokens) ends before the sequences' (up to 15): near and past
    its end it drafts fewer tokens, then none, never feeding a position it has no page for (the
    double reads every position through its block table); HF's tokens all the same."""
    draft = DraftModelProposer(PagedTokens(model, num_pages=30, page_size=2, max_seq_len=10), num_tokens=3)
    engine = PagedEngine(PagedTokens(model, num_pages=24, page_size=2, max_seq_len=24), speculative=draft)
    assert _generate(engine, PROMPTS) == [hf[tuple(p)] for p in PROMPTS]
    assert engine.drafted_tokens > 0 and draft.blocks.pool.num_in_use == 0


def test_a_compiled_draft_model_drafts_for_the_compiled_model(model: torch.nn.Module, paged: ad_mlir.LLM,
                                                               hf: dict) -> None:
    """Both compiled by ad-mlir in the paged form: a one-layer draft (the model's first layer and
    its head) for the two-layer model, through `LLM.generate`: HF's tokens."""
    draft_model = copy.deepcopy(model)
    draft_model.model.layers = draft_model.model.layers[:1]
    draft_model.config.num_hidden_layers = 1
    draft = ad_mlir.LLM(draft_model, max_batch=2, max_seq_len=32, page_size=4, num_pages=24)
    target = ad_mlir.LLM(model, max_batch=2, max_seq_len=32, page_size=4, num_pages=16,
                         speculative=DraftModelProposer(draft, num_tokens=3))
    outputs = target.generate([list(p) for p in PROMPTS], max_new_tokens=NEW)
    assert [o.token_ids for o in outputs] == [hf[tuple(p)] for p in PROMPTS]


def _self_repeating(model: torch.nn.Module, hf: dict) -> list[int]:
    """A prompt holding HF's own continuation of its first part, then that first part again: the
    n-gram lookup drafts HF's tokens."""
    first = list(PROMPTS[0])
    return first + hf[tuple(first)] + first


def test_ngram_lookup_through_llm_generate_gives_plain_decodings_tokens(model: torch.nn.Module, paged: ad_mlir.LLM,
                                                                        hf: dict) -> None:
    prompt = _self_repeating(model, hf)
    expected = _hf_tokens(model, prompt, NEW)
    assert [o.token_ids for o in paged.generate([prompt, list(PROMPTS[1])], max_new_tokens=NEW)] == [
        expected, hf[tuple(PROMPTS[1])]]
    engine = make_engine(paged, speculative=paged.speculative)
    assert _generate(engine, [prompt]) == [expected]
    assert engine.accepted_tokens > 0, "the repeated prompt gives the n-gram lookup something to draft"
    with pytest.raises(ValueError, match="paged engine: give page_size"):
        ad_mlir.LLM(model, max_batch=1, max_seq_len=32, speculative=NgramProposer())


def test_the_server_drafts_and_reports_acceptance(model: torch.nn.Module, paged: ad_mlir.LLM, hf: dict) -> None:
    """`ad-mlir serve --speculative-ngram`'s engine through HTTP: plain decoding's answer, and
    /metrics counts the drafted and accepted tokens."""
    prompt = _self_repeating(model, hf)
    runner = EngineRunner(make_engine(paged, speculative=NgramProposer(3))).start()
    try:
        with _serving(build_app(runner, "llama", None, default_max_tokens=NEW)) as url:
            status, body = _post(f"{url}/v1/completions", {"model": "llama", "prompt": prompt, "max_tokens": NEW})
            with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
                metrics = r.read().decode()
    finally:
        runner.stop()
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == NEW
    accepted = re.search(r"^ad_mlir_spec_decode_accepted_tokens_total (\S+)$", metrics, re.M)
    drafted = re.search(r"^ad_mlir_spec_decode_draft_tokens_total (\S+)$", metrics, re.M)
    assert accepted and drafted, metrics
    assert 0 < float(accepted.group(1)) <= float(drafted.group(1))


@pytest.mark.parametrize(("temperature", "top_p", "top_k"), [(1.0, 1.0, 0), (0.7, 0.8, 0), (1.3, 1.0, 3)])
def test_verified_tokens_follow_the_models_distribution_whatever_the_draft(temperature: float, top_p: float,
                                                                            top_k: int) -> None:
    """20,000 seeded draws of `verify` per draft (the likeliest token, an unlikely one, one that
    top-k/top-p exclude): the counts fit the model's sampling distribution (Pearson's chi-square
    below the 0.999 quantile: a test that fails by chance once in 1000 runs at most, where
    keeping every draft, or never resampling, is off by thousands of sigma)."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    probs = sampling_probs(logits, temperature, top_p, top_k)
    probs = probs / probs.sum()
    generator = torch.Generator().manual_seed(0)
    n = 20_000
    for draft in (0, 4, 5):
        counts = torch.zeros(len(logits))
        for _ in range(n):
            counts[verify(logits, draft, temperature, top_p, generator, top_k)] += 1
        support = probs > 0
        assert counts[~support].sum() == 0, "a token outside top-k/top-p was kept"
        expected = probs[support] * n
        chi2 = float(((counts[support] - expected) ** 2 / expected).sum())
        dof = int(support.sum()) - 1
        assert chi2 < _chi2_999(dof), (draft, chi2, counts.tolist(), expected.tolist())


def _chi2_999(dof: int) -> float:
    """The chi-square distribution's 0.999 quantile (Wilson-Hilferty: within 1% for dof >= 2)."""
    z = 3.0902
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def test_the_serve_command_line_builds_a_drafting_engine(paged: ad_mlir.LLM) -> None:
    """`ad-mlir serve --speculative-ngram 3` gives the paged engine an n-gram proposer of 3
    tokens, `--speculative-model` a draft model compiled paged like the model; the two exclude each
    other; a model the paged engine does not run (the slot form here) stops with the reason."""
    from ad_mlir.serve import cli

    args = cli._parse(["serve", "--model", "llama", "--speculative-ngram", "3", "--port", "0"])
    _, runner = cli._server(args, paged, paged, 0.0)
    runner.stop()
    assert runner.engine.speculative == NgramProposer(3)
    args = cli._parse(["serve", "--model", "llama", "--speculative-model", "llama", "--speculative-tokens", "2"])
    draft = cli._proposer(args, paged)
    assert isinstance(draft, DraftModelProposer) and draft.num_tokens == 2
    assert (draft.model.page_size, draft.model.max_seq_len) == (paged.page_size, paged.max_seq_len)
    with pytest.raises(SystemExit):  # argparse: one way of drafting at a time
        cli._parse(["serve", "--speculative-model", "llama", "--speculative-ngram", "2"])
    slots = ad_mlir.LLM(paged.model, max_batch=1, max_seq_len=16)
    with pytest.raises(SystemExit, match="speculative decoding runs on the paged engine"):
        cli._server(args, slots, slots, 0.0)


def test_the_generate_command_line_drafts_and_refuses_what_cannot(capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m ad_mlir.generate --speculative-ngram 3`: the tiny Llama's greedy tokens, as HF
    generates them; the slot form (`--page-size 0`) and a model with per-sequence states (LFM2 of
    two layers: a short convolution, then attention) are refused, saying why."""
    from ad_mlir.llm import generate
    from ad_mlir.zoo.checkpoints import named_model

    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    command = ["--model", "llama", "--prompt-ids", *map(str, prompt), "--max-new-tokens", "6", "--max-batch", "1",
               "--max-seq-len", "24", "--speculative-ngram", "3"]
    generate.main(command)
    with torch.no_grad():
        expected = named_model("llama").generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)
    assert capsys.readouterr().out.splitlines()[1] == str(expected[0, len(prompt):].tolist())
    with pytest.raises(SystemExit, match="speculative decoding runs on the paged engine"):
        generate.main([*command, "--page-size", "0"])
    with pytest.raises(ValueError, match="per-sequence states"):
        ad_mlir.LLM(small_model("lfm2", layers=2), max_batch=1, max_seq_len=16, page_size=4,
                    speculative=NgramProposer())
