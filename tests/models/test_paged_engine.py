"""The paged scheduler (`ad_mlir.llm.engine.PagedEngine`) over a test double of a paged model.

`PagedTokens.forward_flat` honours the paged model's contract for real, keeping in each page
position what a model's K/V there depends on: the tokens of the sequence that wrote it, up to
that position. Each new token is written into the page and offset its block table gives for its
position; a sequence's logits come from an HF model run on its tokens read back through its block
table, each position checked to have been written in this sequence's context. So a wrong block
table, a page freed while still in use, a wrong prefix share or a token lost in a preemption
fails a check or feeds HF other tokens (two tests check that such faults are seen). Greedy tokens of every request are compared with HF
`generate` on that prompt alone (a wide-init tiny Llama, whose tokens vary)."""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pytest
import torch
from engine_steps import checked_step
from test_generate import _family_model, _hf_tokens

from ad_mlir.llm import engine as engine_module
from ad_mlir.llm import pages
from ad_mlir.llm.engine import (
    ContextTooLong,
    Engine,
    PagedEngine,
    Request,
    RequestError,
    RequestUpdate,
    SamplingParams,
    make_engine,
)
from ad_mlir.serve.runner import EngineRunner

NEW = 8
PAGE = 4
MAX_SEQ_LEN = 48
GREEDY = SamplingParams(max_tokens=NEW)
"""Stops at EOS, as HF `generate` does."""


class PagedTokens:
    """A paged model whose pages hold, per position, what its K/V depends on: the tokens of the
    sequence that wrote it up to that position (see the module's docstring). `writes[p]` counts
    the tokens ever written into page p; `calls` the tokens fed per call."""

    def __init__(self, model: torch.nn.Module, num_pages: int, page_size: int = PAGE,
                 max_seq_len: int = MAX_SEQ_LEN) -> None:
        self.model = model
        self.num_pages, self.page_size, self.max_seq_len = num_pages, page_size, max_seq_len
        self.num_state_slots = 0
        self.vocab_size = model.config.vocab_size
        self.eos = {model.generation_config.eos_token_id}
        self.tokenizer = None
        self.pages: list[list[tuple[int, ...] | None]] = [[None] * page_size for _ in range(num_pages)]
        self.writes = torch.zeros(num_pages, dtype=torch.int64)
        self.calls: list[int] = []

    def forward_flat(self, input_ids: torch.Tensor, position_ids: torch.Tensor, query_starts: torch.Tensor,
                     cache_starts: torch.Tensor, block_tables: torch.Tensor,
                     logits_indices: torch.Tensor) -> torch.Tensor:
        tensors = (input_ids, position_ids, query_starts, cache_starts, block_tables, logits_indices)
        assert all(t.dtype == torch.int64 for t in tensors)
        seqs, tokens = len(cache_starts), int(query_starts[-1])
        assert input_ids.shape == position_ids.shape == (1, tokens) and query_starts.shape == (seqs + 1,)
        assert block_tables.shape == (seqs, -(-self.max_seq_len // self.page_size))
        self.calls.append(tokens)
        writes: dict[tuple[int, int], tuple[int, ...]] = {}
        reads = []
        for i in range(seqs):
            rows = slice(int(query_starts[i]), int(query_starts[i + 1]))
            start = int(cache_starts[i])
            positions = range(start + rows.stop - rows.start)
            assert position_ids[0, rows].tolist() == list(positions[start:])
            slots = [(int(block_tables[i, p // self.page_size]), p % self.page_size) for p in positions]
            written = self._read(slots[:start]) + input_ids[0, rows].tolist()
            for p in positions[start:]:
                assert slots[p] not in writes, f"two sequences write page {slots[p][0]} offset {slots[p][1]} in one call"
                writes[slots[p]] = tuple(written[: p + 1])
            reads.append((rows, start, slots))
        for (page, offset), context in writes.items():  # every write before any read: a kernel writes K/V first
            self.pages[page][offset] = context
            self.writes[page] += 1
        logits = torch.zeros(tokens, self.model.config.vocab_size)
        wanted = set(logits_indices.tolist())
        for rows, start, slots in reads:
            if wanted & set(range(rows.start, rows.stop)):
                with torch.no_grad():
                    logits[rows] = self.model(torch.tensor([self._read(slots)])).logits[0, start:]
        return logits[logits_indices]

    def _read(self, slots: Sequence[tuple[int, int]]) -> list[int]:
        """The tokens at `slots` (a sequence's positions from 0), each checked to have been
        written in this sequence's context: in a model, K/V written by other tokens."""
        contexts = [self.pages[page][offset] for page, offset in slots]
        assert all(c is not None for c in contexts), "a sequence reads a position nothing wrote"
        tokens = [c[-1] for c in contexts]
        for p, context in enumerate(contexts):
            assert context == tuple(tokens[: p + 1]), f"position {p} holds the K/V of other tokens"
        return tokens


@dataclass
class Setup:
    model: torch.nn.Module
    hf: Callable[[Sequence[int]], list[int]]
    """HF's greedy NEW tokens of a prompt (cached)."""


@pytest.fixture(scope="module")
def setup() -> Setup:
    model = _family_model("llama")
    known: dict[tuple[int, ...], list[int]] = {}

    def hf(prompt: Sequence[int]) -> list[int]:
        if tuple(prompt) not in known:
            known[tuple(prompt)] = _hf_tokens(model, list(prompt), NEW)
        return known[tuple(prompt)]

    return Setup(model, hf)


def _prompts(n: int, lengths: Sequence[int], seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 128) for _ in range(lengths[i % len(lengths)])] for i in range(n)]


def _run(engine: PagedEngine, arrivals: dict[int, list[list[int]]],
         on_step: Callable[[PagedEngine], None] | None = None) -> dict[str, list[int]]:
    """Step until idle, adding `arrivals[i]` (greedy, ids "p<index in order>") before step i;
    each request's tokens, checking the allocator after every step."""
    got: dict[str, list[int]] = {}
    n, i = 0, 0
    while engine.has_work or any(k >= i for k in arrivals):
        for prompt in arrivals.get(i, []):
            engine.add(prompt, GREEDY, request_id=f"p{n}")
            n += 1
        for update in checked_step(engine):
            got.setdefault(update.request_id, []).extend(update.token_ids)
        _check_pages(engine)
        if on_step:
            on_step(engine)
        i += 1
    return got


def _check_pages(engine: PagedEngine) -> None:
    """Each page's count is the number of running requests whose block table holds it; the free
    pages are those nobody holds; a waiting request holds none."""
    pool = engine.blocks.pool
    held = [p for r in engine.running for p in engine.blocks.block_table(r.id)]
    assert pool.refs == [held.count(p) for p in range(pool.num_pages)]
    assert set(pool.free) == {p for p in range(pool.num_pages) if pool.refs[p] == 0}
    assert set(engine.blocks.tables) == {r.id for r in engine.running}
    for r in engine.running:
        assert len(engine.blocks.block_table(r.id)) * engine.llm.page_size >= r.cached


def _assert_idle(engine: PagedEngine) -> None:
    assert not engine.has_work
    assert engine.pages_in_use == 0 and engine.pages_free == engine.llm.num_pages
    assert not engine.blocks.tables and all(r == 0 for r in engine.blocks.pool.refs)


def _check_tokens(setup: Setup, prompts: Sequence[Sequence[int]], got: dict[str, list[int]]) -> None:
    for n, prompt in enumerate(prompts):
        assert got[f"p{n}"] == setup.hf(prompt), f"request p{n}"


def test_make_engine_picks_the_paged_scheduler_for_a_paged_model(setup: Setup) -> None:
    assert isinstance(make_engine(PagedTokens(setup.model, 8)), PagedEngine)

    class Slots:
        """The slot form of a model that could be compiled paged: `forward_flat`, no `page_size`."""

        max_batch, max_seq_len, eos, tokenizer, page_size = 2, 16, set(), None, None

        def forward_flat(self, *inputs: torch.Tensor) -> torch.Tensor:
            raise AssertionError("not paged")

    assert type(make_engine(Slots())) is Engine


def test_requests_arriving_while_others_decode_get_hf_tokens(setup: Setup) -> None:
    prompts = _prompts(4, [7, 2, 11, 5])
    llm = PagedTokens(setup.model, num_pages=32)
    engine = PagedEngine(llm, max_step_tokens=64)
    steps: list[int] = []
    got = _run(engine, {0: prompts[:1], 3: prompts[1:3], 5: prompts[3:]}, on_step=lambda e: steps.append(1))
    _check_tokens(setup, prompts, got)
    assert len(llm.calls) == len(steps), "one forward call per step"
    assert llm.calls[3] == 1 + 2 + 11, "step 3 feeds the running decode and both new prompts"
    assert engine.preemptions == 0
    _assert_idle(engine)


def test_max_running_caps_the_requests_in_the_cache(setup: Setup) -> None:
    """Four requests, at most two in the cache: the others wait (no pages) until one ends, and
    every request still gets HF's tokens."""
    prompts = _prompts(4, [7, 2, 11, 5])
    engine = PagedEngine(PagedTokens(setup.model, num_pages=32), max_step_tokens=64, max_running=2)
    running: list[int] = []
    got = _run(engine, {0: prompts}, on_step=lambda e: running.append(len(e.running)))
    _check_tokens(setup, prompts, got)
    assert max(running) == 2 and engine.preemptions == 0
    _assert_idle(engine)


def test_a_pool_too_small_for_all_preempts_the_youngest_and_loses_nothing(setup: Setup,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Four requests of 10 to 13 tokens (+7 fed back) need 5 pages each at the end: 9 pages hold
    two, so the younger ones are preempted and recomputed from their prompt and generated tokens."""
    prompts = _prompts(4, [10, 13, 11, 12], seed=1)
    engine = PagedEngine(PagedTokens(setup.model, num_pages=9), max_step_tokens=64, prefix_caching=False)
    preempt = engine._preempt
    generated_when_preempted: list[int] = []

    def watch(request: Request) -> None:
        assert request is engine.running[-1], "the youngest running request is preempted"
        generated_when_preempted.append(len(request.output.token_ids))
        preempt(request)

    monkeypatch.setattr(engine, "_preempt", watch)
    got = _run(engine, {0: prompts[:2], 2: prompts[2:]})
    _check_tokens(setup, prompts, got)
    assert engine.preemptions == len(generated_when_preempted) > 0
    assert max(generated_when_preempted) > 1, "a request is recomputed with the tokens it had generated"
    _assert_idle(engine)


def test_preemption_with_prefix_caching_resumes_on_its_own_cached_pages(setup: Setup) -> None:
    prompts = _prompts(4, [10, 13, 11, 12], seed=1)
    engine = PagedEngine(PagedTokens(setup.model, num_pages=9), max_step_tokens=64)
    got = _run(engine, {0: prompts[:2], 2: prompts[2:]})
    _check_tokens(setup, prompts, got)
    assert engine.preemptions > 0 and engine.prefix_hits > 0
    _assert_idle(engine)


def test_sampled_tokens_do_not_change_with_preemption(setup: Setup) -> None:
    """Each request samples from its own seeded generator, and a recomputed request samples no
    token again: on a pool that forces preemptions its tokens are those of a roomy pool."""
    prompts = _prompts(4, [10, 13, 11, 12], seed=1)
    sampled = SamplingParams(max_tokens=NEW, temperature=1.5, seed=3, ignore_eos=True)
    outputs = []
    for num_pages in (40, 9):
        engine = PagedEngine(PagedTokens(setup.model, num_pages=num_pages), max_step_tokens=64)
        requests = [engine.add(p, sampled) for p in prompts]
        while engine.has_work:
            checked_step(engine)
        outputs.append(([r.output.token_ids for r in requests], engine.preemptions))
    (roomy, none), (tight, preempted) = outputs
    assert none == 0 and preempted > 0
    assert tight == roomy
    assert roomy != [setup.hf(p) for p in prompts], "sampled, not greedy"


def test_a_common_system_prompt_is_prefilled_once_and_shared(setup: Setup) -> None:
    """The 13-token system prompt fills 3 pages; requests that arrive after the first one's
    prefill share them (each of those pages written once, 4 tokens, in the whole run)."""
    system = _prompts(1, [13], seed=2)[0]
    prompts = [system + tail for tail in _prompts(4, [3, 5, 1, 6], seed=3)]
    llm = PagedTokens(setup.model, num_pages=40)
    engine = PagedEngine(llm, max_step_tokens=64)
    shared: list[int] = []

    def watch(e: PagedEngine) -> None:
        for r in e.running[1:]:
            shared.extend(e.blocks.block_table(r.id)[:3])

    got = _run(engine, {0: prompts[:1], 2: prompts[1:3], 6: prompts[3:]}, on_step=watch)
    _check_tokens(setup, prompts, got)
    first_pages = set(shared)
    assert len(first_pages) == 3, "every later request shares the first one's 3 system-prompt pages"
    assert llm.writes[sorted(first_pages)].tolist() == [PAGE] * 3, "a shared page was written again"
    assert engine.prefix_hits == 3 * 3 * PAGE
    assert engine.prefix_queries == sum(len(p) for p in prompts)
    assert engine.prefix_hit_rate == engine.prefix_hits / engine.prefix_queries
    _assert_idle(engine)
    assert engine.pages_cached > 0, "finished requests leave their full pages cached, free for eviction"


def test_a_prompt_of_whole_pages_recomputes_its_last_page(setup: Setup) -> None:
    """A prompt equal to a cached one of 12 tokens (3 full pages) shares 2 pages and recomputes
    the third: the last token's logits are needed, and a shared page is never written."""
    prompt = _prompts(1, [12], seed=4)[0]
    llm = PagedTokens(setup.model, num_pages=16)
    engine = PagedEngine(llm, max_step_tokens=64)
    got = _run(engine, {0: [prompt], 1: [prompt]})
    assert got["p0"] == got["p1"] == setup.hf(prompt)
    assert engine.prefix_hits == 2 * PAGE
    assert (llm.writes <= PAGE).all()


def test_a_long_prompt_is_chunked_within_the_step_budget_while_decodes_go_on(setup: Setup) -> None:
    """Budget 4 tokens: the 2-token prompt decodes while the 16-token one is fed in chunks of 3
    (6 steps), one call per step, each call at most 4 tokens, the decode getting a token in each."""
    prompts = _prompts(2, [2, 16], seed=5)
    llm = PagedTokens(setup.model, num_pages=16)
    engine = PagedEngine(llm, max_step_tokens=4)
    decoded: list[int] = []

    def watch(e: PagedEngine) -> None:
        long = next((r for r in e.running if r.id == "p1"), None)
        if long is not None and not long.prefilled:
            decoded.append(len(next(r for r in e.running if r.id == "p0").output.token_ids))

    got = _run(engine, {0: prompts[:1], 1: prompts[1:]}, on_step=watch)
    _check_tokens(setup, prompts, got)
    assert max(llm.calls) <= 4, llm.calls
    assert len(decoded) == 5 and decoded == sorted(set(decoded)), "a decode stalled during the prefill"
    _assert_idle(engine)


def test_an_abort_frees_the_pages(setup: Setup) -> None:
    prompts = _prompts(3, [9, 6, 5], seed=6)
    engine = PagedEngine(PagedTokens(setup.model, num_pages=16), prefix_caching=False)
    for n, prompt in enumerate(prompts):
        engine.add(prompt, GREEDY, request_id=f"p{n}")
    checked_step(engine)
    checked_step(engine)
    before = engine.pages_in_use
    held = len(engine.blocks.block_table("p0"))
    assert engine.abort("p0") and engine.pages_in_use == before - held
    assert engine.abort("p2") and not engine.abort("p0") and not engine.abort("nope")
    while engine.has_work:
        checked_step(engine)
    _assert_idle(engine)


def test_a_request_that_can_never_fit_the_pool_is_refused_at_add(setup: Setup) -> None:
    engine = PagedEngine(PagedTokens(setup.model, num_pages=4))
    with pytest.raises(ContextTooLong, match=r"the prompt has 12 tokens: with max_tokens=6 it needs 5 pages of 4 "
                                         r"tokens > the 4 pages of the cache"):
        engine.add([1] * 12, SamplingParams(max_tokens=6))
    engine.add([1] * 12, SamplingParams(max_tokens=5))  # 16 tokens fed: 4 pages
    with pytest.raises(ContextTooLong, match="max_seq_len=48"):
        engine.add([1] * 45, SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="already queued"):
        engine.add([1], SamplingParams(max_tokens=1), request_id=engine.waiting[0].id)
    assert len(engine.waiting) == 1
    assert engine.max_new_tokens(12) == 5 and engine.max_new_tokens(10) == 7, "16 tokens fed fill the 4 pages"


@pytest.mark.parametrize("prompt, words", [
    ([5, 1000000], "prompt token 1 is 1000000: token ids must be in [0, 128)"),
    ([5, 9, 128], "prompt token 2 is 128"),
    ([-1, 5], "prompt token 0 is -1"),
])
def test_a_token_id_outside_the_vocabulary_is_refused_at_add(setup: Setup, prompt: list[int], words: str) -> None:
    engine = PagedEngine(PagedTokens(setup.model, num_pages=8))
    assert engine.llm.vocab_size == 128
    with pytest.raises(RequestError, match=re.escape(words)) as refused:
        engine.add(prompt, GREEDY)
    assert refused.value.param == "prompt" and not engine.has_work


# -- one request never fails another -----------------------------------------------------------


class FailingCall(PagedTokens):
    """A paged model whose forward call number `fail_at` (from 0) raises, as a kernel fault would."""

    def __init__(self, model: torch.nn.Module, num_pages: int, fail_at: int) -> None:
        super().__init__(model, num_pages)
        self.fail_at = fail_at

    def forward_flat(self, *inputs: torch.Tensor) -> torch.Tensor:
        if len(self.calls) == self.fail_at:
            self.calls.append(-1)
            raise RuntimeError("an injected fault")
        return super().forward_flat(*inputs)


def test_a_failed_forward_ends_only_the_requests_it_fed(setup: Setup) -> None:
    """Two requests in the cache (max_running=2), two waiting; the third call fails: the two it
    fed end with the error and their pages free, the waiting ones then run and get HF's tokens,
    and the engine ends idle with every page free."""
    prompts = _prompts(4, [7, 3, 5, 9], seed=12)
    engine = PagedEngine(FailingCall(setup.model, num_pages=16, fail_at=2), max_running=2)
    for n, prompt in enumerate(prompts):
        engine.add(prompt, GREEDY, request_id=f"p{n}")
    got: dict[str, list[RequestUpdate]] = {}
    while engine.has_work:
        for update in engine.step():
            got.setdefault(update.request_id, []).append(update)
        _check_pages(engine)
    for n in (0, 1):
        last = got[f"p{n}"][-1]
        assert last.finish_reason == "error" and str(last.error) == "an injected fault"
        assert len([t for u in got[f"p{n}"] for t in u.token_ids]) == 2, "two steps ran before the fault"
    for n in (2, 3):
        assert [t for u in got[f"p{n}"] for t in u.token_ids] == setup.hf(prompts[n]), f"p{n}"
    _assert_idle(engine)


def test_a_failure_in_one_requests_sampling_ends_it_alone(setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sampling raises for the one request with a generator (seeded, greedy): it ends with the
    error after its first step; the two fed beside it in every step get HF's tokens."""
    prompts = _prompts(3, [6, 4, 8], seed=13)

    def sample(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None,
               top_k: int = 0) -> int:
        if generator is not None:
            raise RuntimeError("probability tensor contains either inf, nan or element < 0")
        return real_sample(logits, temperature, top_p, generator, top_k)

    real_sample = engine_module.sample
    monkeypatch.setattr(engine_module, "sample", sample)
    engine = PagedEngine(PagedTokens(setup.model, num_pages=16))
    params = [GREEDY, SamplingParams(max_tokens=NEW, seed=1), GREEDY]
    for n, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add(prompt, p, request_id=f"p{n}")
    got: dict[str, list[RequestUpdate]] = {}
    while engine.has_work:
        for update in engine.step():
            got.setdefault(update.request_id, []).append(update)
    assert [(u.token_ids, u.finish_reason) for u in got["p1"]] == [([], "error")]
    assert "probability tensor" in str(got["p1"][0].error)
    for n in (0, 2):
        assert [t for u in got[f"p{n}"] for t in u.token_ids] == setup.hf(prompts[n]), f"p{n}"
    _assert_idle(engine)


def test_random_arrivals_and_aborts_keep_the_pages_consistent(setup: Setup) -> None:
    """60 steps of random arrivals (some sharing a prefix) and aborts on a tight pool: the
    allocator's invariants after every step, HF's tokens for every request that finished."""
    rng = random.Random(7)
    system = _prompts(1, [9], seed=8)[0]
    engine = PagedEngine(PagedTokens(setup.model, num_pages=12), max_step_tokens=12)
    prompts: dict[str, list[int]] = {}
    got: dict[str, list[RequestUpdate]] = {}
    for i in range(60):
        if rng.random() < 0.3:
            prompt = (system if rng.random() < 0.5 else []) + _prompts(1, [rng.randint(1, 8)], seed=i)[0]
            prompts[f"r{i}"] = prompt
            engine.add(prompt, GREEDY, request_id=f"r{i}")
        if rng.random() < 0.1 and engine.running:
            engine.abort(rng.choice([*engine.running, *engine.waiting]).id)
        for update in engine.step():
            got.setdefault(update.request_id, []).append(update)
        _check_pages(engine)
    while engine.has_work:
        for update in engine.step():
            got.setdefault(update.request_id, []).append(update)
    finished = [r for r, updates in got.items() if updates[-1].finish_reason in ("length", "stop")]
    assert len(finished) >= 8
    for r in finished:
        assert [t for u in got[r] for t in u.token_ids] == setup.hf(prompts[r]), r
    _assert_idle(engine)


# -- the comparison sees faults ----------------------------------------------------------------


def test_a_wrong_block_table_gives_other_tokens(setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two requests that use each other's block table from their second decode step on: each
    reads the other's tokens (in a consistent context, so only the tokens show it)."""
    prompts = _prompts(2, [10, 10], seed=9)
    llm = PagedTokens(setup.model, num_pages=16)
    engine = PagedEngine(llm)
    table = engine.blocks.block_table
    other = {"p0": "p1", "p1": "p0"}

    def swapped(seq: str) -> list[int]:
        return table(other[seq] if len(llm.calls) >= 2 and other[seq] in engine.blocks.tables else seq)

    monkeypatch.setattr(engine.blocks, "block_table", swapped)
    got = _run(engine, {0: prompts})
    assert all(got[f"p{n}"][2:] != setup.hf(p)[2:] for n, p in enumerate(prompts))


def test_unchained_page_keys_would_share_wrong_pages(setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keyed by its own tokens only, a page is shared by a prompt that has its tokens after
    other ones: the second request's first page is the first's second. Chained: no hit."""
    first = _prompts(1, [9], seed=10)[0]
    second = first[4:]

    def unchained(tokens: Sequence[int], page_size: int, parent: bytes = b"") -> Iterator[bytes]:
        for start in range(0, len(tokens) - page_size + 1, page_size):
            yield bytes(str(tokens[start: start + page_size]), "ascii")

    engine = PagedEngine(PagedTokens(setup.model, num_pages=16))
    assert _run(engine, {0: [first], 2: [second]})["p1"] == setup.hf(second)
    assert engine.prefix_hits == 0
    monkeypatch.setattr(pages, "chained_hashes", unchained)
    engine = PagedEngine(PagedTokens(setup.model, num_pages=16))
    with pytest.raises(AssertionError, match="holds the K/V of other tokens"):
        _run(engine, {0: [first], 2: [second]})


# -- the server's runner drives it -------------------------------------------------------------


def test_the_server_runner_drives_the_paged_engine_and_reports_pages(setup: Setup) -> None:
    prompts = _prompts(3, [6, 9, 4], seed=11)
    runner = EngineRunner(PagedEngine(PagedTokens(setup.model, num_pages=16))).start()

    async def ask(prompt: list[int]) -> list[int]:
        _, updates = runner.submit(prompt, GREEDY)
        tokens = []
        while True:
            update = await asyncio.wait_for(updates.get(), 60)
            tokens += update.token_ids
            if update.finish_reason:
                return tokens

    async def ask_all() -> list[list[int]]:
        return await asyncio.gather(*(ask(p) for p in prompts))

    try:
        assert asyncio.run(ask_all()) == [setup.hf(p) for p in prompts]
    finally:
        runner.stop()
    metrics = runner.metrics
    assert metrics.pages_in_use._value.get() == 0 and metrics.pages_free._value.get() == 16
    assert metrics.prefix_queries._value.get() == sum(len(p) for p in prompts)
