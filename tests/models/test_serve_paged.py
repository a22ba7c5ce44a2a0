"""The paged server (`ad-mlir serve`'s default: `PagedEngine` over a model compiled with a paged
cache) through HTTP, with the real `openai` client on loopback.

The server serves a wide-init tiny Llama (HF's tokens vary) compiled paged with a pool too small
for the requests sent at once (so they are preempted and recomputed), kernels as their torch
reference, with `LetterTokenizer` (token t is the letter chr(97 + t % 26)). Checked: answers
equal HF's greedy tokens whatever runs beside them; cancellations while waiting, during a
chunked prefill and mid-stream, and a non-streaming client that goes away, each free what the
request held; a soak with bad requests mixed in (each a 400 naming the field) loses and leaks
nothing; stop lists; seeded sampling reproducible; a failure injected into one request's forward
ends it alone with an error, and the server goes on. Multi-byte text is checked on a scripted
model whose bytes split characters across tokens."""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import openai
import pytest
import torch
from test_generate import PROMPTS, _family_model, _hf_tokens
from test_serve import LetterTokenizer, _post, _serving

import ad_mlir
from ad_mlir.llm.engine import PagedEngine
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.serve.app import build_app
from ad_mlir.serve.runner import EngineRunner

NEW = 6
MAX_SEQ = 48
PAGE = 4
PAGES = 12
"""48 tokens in the pool: three requests of 11 prompt and 6 new tokens (4-5 pages each) do not
fit at once."""
LONG = [(7 * i) % 120 + 1 for i in range(36)]
"""A prompt of 36 tokens: 5 chunks of 8 (`--max-step-tokens 8`)."""


@dataclass
class Served:
    model: torch.nn.Module
    llm: ad_mlir.LLM
    runner: EngineRunner
    url: str

    @property
    def engine(self) -> PagedEngine:
        return self.runner.engine

    @property
    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)

    def hf_text(self, prompt: Sequence[int], n: int = NEW) -> str:
        return LetterTokenizer().decode(_hf_tokens(self.model, list(prompt), n))

    def counted(self, reason: str) -> float:
        return self.runner.metrics.finished.labels(reason)._value.get()

    def wait_idle(self, seconds: float = 30) -> None:
        """Nothing in flight, nothing in the engine, every page free."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if not self.runner.in_flight and not self.engine.has_work and self.engine.pages_in_use == 0:
                assert self.engine.pages_free == self.llm.num_pages
                return
            time.sleep(0.05)
        raise AssertionError(f"not idle: {self.runner.in_flight} in flight, {len(self.engine.running)} running, "
                             f"{len(self.engine.waiting)} waiting, {self.engine.pages_in_use} pages in use")


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    model = _family_model("llama")
    llm = ad_mlir.LLM(model, max_batch=3, max_seq_len=MAX_SEQ, page_size=PAGE, num_pages=PAGES)
    llm.tokenizer = LetterTokenizer()
    runner = EngineRunner(PagedEngine(llm, max_step_tokens=8)).start()
    with _serving(build_app(runner, "llama", llm.tokenizer, default_max_tokens=NEW)) as url, reference_kernels():
        yield Served(model, llm, runner, url)  # the engine's thread runs the kernels as their torch reference
    runner.stop()


def _complete(served: Served, prompt: list[int], stream: bool, **fields: object) -> tuple[str, str | None]:
    body = {"model": "llama", "prompt": prompt, "max_tokens": NEW, "temperature": 0, **fields}
    if not stream:
        r = served.client.completions.create(**body)
        return r.choices[0].text, r.choices[0].finish_reason
    chunks = list(served.client.completions.create(**body, stream=True))
    return "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason


def test_concurrency_past_the_pool_preempts_and_every_answer_is_hf(served: Served,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Nine requests at once (three prompts, streamed and not, and the long one in chunks) on a
    pool that holds about two: some are preempted, and each answer is HF's. The engine is held
    in its first step until all nine have arrived, so that they meet in the pool however slowly
    the clients' threads start (on a loaded machine they came one after another)."""
    preempted, gate = served.engine.preemptions, Gate(served.llm, monkeypatch)
    jobs = [(p, stream) for p in PROMPTS for stream in (False, True)] + [(LONG, False), (PROMPTS[2], True),
                                                                        (LONG[:20], True)]
    gate.close()
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = [pool.submit(_complete, served, *job) for job in jobs]
        gate.held()
        _wait_for(lambda: served.runner.in_flight == len(jobs))
        gate.open()
        results = [f.result() for f in futures]
    for (prompt, _), (text, reason) in zip(jobs, results, strict=True):
        assert (text, reason) == (served.hf_text(prompt), "length")
    assert served.engine.preemptions > preempted
    served.wait_idle()


class Gate:
    """Holds the engine's thread at the start of a forward call while closed, so that a test
    can act between two steps: `close(after=n)` lets n more calls through first; `held()` waits
    until the thread is held; `open()` lets it go on."""

    def __init__(self, llm: ad_mlir.LLM, monkeypatch: pytest.MonkeyPatch) -> None:
        self._open, self._held = threading.Event(), threading.Event()
        self._open.set()
        self._after = 0
        real = llm.forward_flat

        def forward_flat(*args: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
            if not self._open.is_set():
                if self._after == 0:
                    self._held.set()
                    assert self._open.wait(30), "the gate was never opened"
                    self._held.clear()
                else:
                    self._after -= 1
            return real(*args, **kwargs)

        monkeypatch.setattr(llm, "forward_flat", forward_flat)

    def close(self, after: int = 0) -> None:
        self._after = after
        self._open.clear()

    def held(self) -> None:
        assert self._held.wait(30), "the engine never reached the gate"

    def open(self) -> None:
        self._open.set()


@dataclass
class Aborts:
    asked: list[str]
    """The requests the server asked the engine to abort (it does at its next step)."""
    done: list[tuple[int, int]]
    """(cached tokens, tokens generated) of each request the engine aborted, when it did."""


@contextlib.contextmanager
def _watching_aborts(served: Served) -> Iterator[Aborts]:
    engine, runner, aborts = served.engine, served.runner, Aborts([], [])
    real_abort, real_ask = engine.abort, runner.abort

    def abort(request_id: str) -> bool:
        request = next((r for r in [*engine.running, *engine.waiting] if r.id == request_id), None)
        if request is not None:
            aborts.done.append((request.cached, len(request.output.token_ids)))
        return real_abort(request_id)

    def ask(request_id: str) -> None:
        aborts.asked.append(request_id)
        real_ask(request_id)

    engine.abort, runner.abort = abort, ask
    try:
        yield aborts
    finally:
        del engine.abort, runner.abort


def _open_stream(served: Served, prompt: list[int], max_tokens: int, stream: bool = True) -> http.client.HTTPConnection:
    """A completion sent and not read: the caller closes it to go away."""
    connection = http.client.HTTPConnection(served.url.removeprefix("http://"), timeout=30)
    connection.request("POST", "/v1/completions", json.dumps(
        {"model": "llama", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream}),
        {"Content-Type": "application/json"})
    return connection


def _wait_for(condition, seconds: float = 30) -> None:  # noqa: ANN001
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_request_cancelled_before_its_first_token_frees_everything(served: Served,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine is held in the first request's first step; a second request arrives, its
    client goes away, and it is aborted while waiting (nothing cached, no token); the first
    still gets HF's tokens."""
    gate = Gate(served.llm, monkeypatch)
    gate.close()
    with _watching_aborts(served) as aborts, ThreadPoolExecutor(1) as pool:
        first = pool.submit(_complete, served, LONG, False)
        gate.held()
        waiting = _open_stream(served, PROMPTS[0], NEW)
        _wait_for(lambda: served.runner.in_flight == 2)
        waiting.close()
        _wait_for(lambda: aborts.asked)
        gate.open()
        assert first.result() == (served.hf_text(LONG), "length")
    assert aborts.done == [(0, 0)], "aborted while waiting: nothing cached, no token"
    served.wait_idle()


def test_a_request_cancelled_during_its_chunked_prefill_frees_its_pages(served: Served,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Held after the first chunk of 8 of a long prompt no other test sends (none of it in the
    prefix cache), its client goes away: it is aborted with part of its prompt cached and no
    token; its pages are free, and what it cached is sound to reuse."""
    prompt = [(11 * i) % 120 + 2 for i in range(36)]
    gate = Gate(served.llm, monkeypatch)
    gate.close(after=1)
    before = served.counted("abort")
    with _watching_aborts(served) as aborts:
        stream = _open_stream(served, prompt, NEW)
        gate.held()
        stream.close()
        _wait_for(lambda: aborts.asked)
        gate.open()
        _wait_for(lambda: aborts.done)
    cached, generated = aborts.done[0]
    assert 0 < cached < len(prompt) and generated == 0, f"aborted with {cached} tokens cached, {generated} generated"
    served.wait_idle()
    assert served.counted("abort") == before + 1
    assert _complete(served, prompt, True) == (served.hf_text(prompt), "length"), "what it cached was sound"


@pytest.mark.parametrize("stream", [True, False], ids=["mid-stream", "non-streaming"])
def test_a_client_that_goes_away_after_its_first_tokens_aborts_its_request(served: Served, stream: bool,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Held after three steps of a 42-token request, its client goes away: streamed, the server
    sees it at once; not streamed, within `DISCONNECT_POLL_S` (the 499 path). It is aborted
    with tokens generated, its pages freed."""
    gate = Gate(served.llm, monkeypatch)
    gate.close(after=3)
    with _watching_aborts(served) as aborts:
        connection = _open_stream(served, PROMPTS[1], MAX_SEQ - 6, stream)
        gate.held()
        connection.close()
        _wait_for(lambda: aborts.asked)
        gate.open()
        _wait_for(lambda: aborts.done)
    assert aborts.done[0][1] >= 2, f"aborted after {aborts.done[0][1]} tokens"
    served.wait_idle()


BAD = [
    ({"prompt": [5, 1000000]}, "prompt", "prompt token 1 is 1000000"),
    ({"prompt": [1] * 40, "max_tokens": 9}, "prompt", "needs 49 > max_seq_len=48"),
    ({"prompt": [5, 9], "top_p": 1.5}, "top_p", "less than or equal to 1"),
    ({"prompt": [5, 9], "temperature": -1}, "temperature", "greater than or equal to 0"),
    ({"prompt": [5, 9], "stop": [""]}, "stop", "a stop string may not be empty"),
]


def test_a_soak_with_bad_requests_mixed_in_loses_and_leaks_nothing(served: Served) -> None:
    """120 requests from 8 clients: a fifth bad (each a 400 naming its field, at once, while the
    others run), a sixth of the good ones cancelled mid-stream; every other answer is HF's, and
    at the end nothing is in flight and every page is free."""
    rng = random.Random(1)
    plan = [("bad", rng.randrange(len(BAD))) if rng.random() < 0.2 else
            ("cancel" if rng.random() < 0.17 else "good", rng.randrange(len(PROMPTS))) for _ in range(120)]

    def run(kind: str, which: int) -> object:
        if kind == "bad":
            return _post(f"{served.url}/v1/completions", {"model": "llama", "max_tokens": NEW, **BAD[which][0]})
        stream = served.client.completions.create(model="llama", prompt=PROMPTS[which], max_tokens=NEW,
                                                  temperature=0, stream=True)
        if kind == "cancel":
            next(iter(stream))
            stream.close()
            return None
        return "".join(c.choices[0].text for c in stream)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda job: run(*job), plan))
    for (kind, which), result in zip(plan, results, strict=True):
        if kind == "bad":
            status, error = result
            _, param, words = BAD[which]
            assert status == 400 and error["error"]["param"] == param and words in error["error"]["message"], error
        elif kind == "good":
            assert result == served.hf_text(PROMPTS[which])
    assert {kind for kind, _ in plan} == {"bad", "good", "cancel"}
    served.wait_idle()


def test_stop_strings_as_a_list_end_the_text_before_the_first_found(served: Served) -> None:
    full = served.hf_text(PROMPTS[0])
    stops = [full[4:6], full[2:4], "zzzzzz"]  # the second is found first
    assert full.find(stops[1]) < full.find(stops[0]) and stops[2] not in full
    for stream in (False, True):
        assert _complete(served, PROMPTS[0], stream, stop=stops) == (full[:full.find(stops[1])], "stop")
        assert _complete(served, PROMPTS[0], stream, stop=full[4:6]) == (full[:full.find(full[4:6])], "stop")
    served.wait_idle()


def test_seeded_sampling_is_reproducible_and_top_p_near_zero_is_greedy(served: Served) -> None:
    """Same seed, same text, whatever runs beside it; other seeds give other texts (so the
    temperature is applied); a top_p so small that only the likeliest token is kept is greedy."""
    def sampled(seed: int, prompt: list[int] = PROMPTS[0]) -> str:
        return _complete(served, prompt, False, temperature=1.5, seed=seed, max_tokens=12)[0]

    with ThreadPoolExecutor(4) as pool:
        texts = list(pool.map(sampled, [7, 7, 8, 9]))
    assert texts[0] == texts[1] == sampled(7)
    assert len(set(texts[1:])) == 3
    assert texts[0] != served.hf_text(PROMPTS[0], 12)
    assert _complete(served, PROMPTS[0], False, temperature=1.5, top_p=1e-6, seed=3)[0] == served.hf_text(PROMPTS[0])
    served.wait_idle()


def test_a_long_prompt_without_max_tokens_is_answered_up_to_the_room_left(served: Served) -> None:
    """The default max_tokens (6) is capped by what fits after the prompt: 44 tokens leave 4."""
    prompt = LONG + LONG[:8]
    r = served.client.completions.create(model="llama", prompt=prompt, temperature=0)
    assert (r.choices[0].text, r.choices[0].finish_reason) == (served.hf_text(prompt, 4), "length")
    assert r.usage.completion_tokens == 4
    served.wait_idle()


def test_a_failed_forward_ends_that_request_alone_and_the_server_goes_on(served: Served,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault injected into the forward calls that feed token 127: that request ends with a
    500 (streamed: an error event, which the client raises), its pages freed; the next requests
    get HF's answers."""
    real = served.llm.forward_flat

    def forward_flat(input_ids: torch.Tensor, *args: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
        if (input_ids == 127).any():
            raise RuntimeError("an injected fault")
        return real(input_ids, *args, **kwargs)

    monkeypatch.setattr(served.llm, "forward_flat", forward_flat)
    errors = served.counted("error")
    for stream in (False, True):
        with pytest.raises(openai.APIError, match="the engine failed on this request: RuntimeError: an injected "
                                                  "fault") as raised:
            _complete(served, [5, 127, 9], stream)
        if not stream:
            assert raised.value.status_code == 500
        served.wait_idle()
    assert served.counted("error") == errors + 2
    assert _complete(served, PROMPTS[2], True) == (served.hf_text(PROMPTS[2]), "length")
    served.wait_idle()


# -- multi-byte text -----------------------------------------------------------------------------


class ByteTokenizer:
    """Token t is the byte t (a byte-level tokenizer's fallback tokens): a character of several
    bytes spans several tokens."""

    eos_token_id = None

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


class ScriptedPaged:
    """A paged model that answers every sequence with the bytes of `TEXT`, one per step (the
    logits a one-hot of the next byte after the tokens it was given)."""

    TEXT = "né 😀 ü ∑ ok"

    def __init__(self) -> None:
        self.page_size, self.num_pages, self.max_seq_len, self.num_state_slots = 4, 16, 64, 0
        self.vocab_size, self.eos, self.tokenizer = 256, set(), ByteTokenizer()
        self.script = list(self.TEXT.encode())

    def forward_flat(self, input_ids: torch.Tensor, position_ids: torch.Tensor, query_starts: torch.Tensor,
                     cache_starts: torch.Tensor, block_tables: torch.Tensor,
                     logits_indices: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(len(logits_indices), 256)
        for row, index in enumerate(logits_indices.tolist()):
            generated = int(position_ids[0, index]) + 1 - PROMPT_BYTES
            logits[row, self.script[generated]] = 1.0
        return logits


PROMPT_BYTES = 2


def test_multi_byte_text_streams_intact() -> None:
    """The script's 2- to 4-byte characters arrive one byte a step: no chunk carries a partial
    character (a replacement character), and the chunks join to the text."""
    llm = ScriptedPaged()
    runner = EngineRunner(PagedEngine(llm)).start()
    try:
        with _serving(build_app(runner, "bytes", llm.tokenizer)) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
            n = len(llm.script)
            chunks = [c.choices[0].text for c in client.completions.create(
                model="bytes", prompt=[104, 105], max_tokens=n, temperature=0, stream=True)]
            whole = client.completions.create(model="bytes", prompt=[104, 105], max_tokens=n, temperature=0)
    finally:
        runner.stop()
    assert "".join(chunks) == ScriptedPaged.TEXT == whole.choices[0].text
    assert not any("\ufffd" in c for c in chunks), chunks
    assert sum(1 for c in chunks if c) < n, "characters of several bytes were held back until whole"
