"""The engine in its own thread: HTTP handlers (asyncio) submit requests and read each one's
updates from an asyncio queue; the thread steps the engine while it has work and sleeps
otherwise. Requests and aborts reach the engine through a command queue, so only the engine's
thread touches it. The Prometheus metrics are kept here, where the times are known.

Every accepted request ends with an update that has a finish reason: the engine ends a request
whose own work or forward call failed ("error", the others go on); a failure anywhere else in a
step ends every request the engine holds, and the engine, emptied, keeps serving."""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ad_mlir.llm.engine import BaseEngine, Engine, PagedEngine, RequestUpdate, SamplingParams

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    """The server's Prometheus metrics, in a registry of their own (one per server)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.running = Gauge("ad_mlir_requests_running", "Requests holding a cache slot", registry=r)
        self.waiting = Gauge("ad_mlir_requests_waiting", "Requests waiting for a cache slot", registry=r)
        self.slots_in_use = Gauge("ad_mlir_cache_slots_in_use", "Cache slots held by requests (a paged "
                                  "cache: its per-sequence state slots)", registry=r)
        self.pages_in_use = Gauge("ad_mlir_cache_pages_in_use", "Pages of a paged cache held by requests", registry=r)
        self.pages_free = Gauge("ad_mlir_cache_pages_free", "Pages of a paged cache that can be taken "
                                "(cached prefixes nobody holds included)", registry=r)
        self.prefix_queries = Counter("ad_mlir_prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                                      registry=r)
        self.prefix_hits = Counter("ad_mlir_prefix_cache_hits", "Prompt tokens found in the prefix cache", registry=r)
        self.preemptions = Counter("ad_mlir_preemptions", "Requests preempted (pages freed, recomputed later)",
                                   registry=r)
        self.drafted_tokens = Counter("ad_mlir_spec_decode_draft_tokens", "Tokens drafted for speculative "
                                      "decoding and fed to be verified", registry=r)
        self.accepted_tokens = Counter("ad_mlir_spec_decode_accepted_tokens", "Drafted tokens accepted (the "
                                       "acceptance rate: accepted over drafted)", registry=r)
        self.draft_steps = Counter("ad_mlir_spec_decode_draft_steps", "Decodes that fed a draft (tokens per such "
                                   "step: 1 + accepted over draft steps)", registry=r)
        self.prompt_tokens = Counter("ad_mlir_prompt_tokens", "Prompt tokens prefilled", registry=r)
        self.generated_tokens = Counter("ad_mlir_generation_tokens", "Tokens generated", registry=r)
        self.finished = Counter("ad_mlir_requests_finished", "Requests finished, by reason", ["reason"], registry=r)
        self.ttft = Histogram("ad_mlir_time_to_first_token_seconds", "From arrival to the first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("ad_mlir_inter_token_latency_seconds", "Between two tokens of a request",
                             buckets=LATENCY_BUCKETS, registry=r)


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    updates: asyncio.Queue[RequestUpdate]
    arrival: float
    last_token: float | None = None
    prompt_tokens: int = 0


@dataclass
class EngineRunner:
    """Steps `engine` in a daemon thread (see the module's docstring)."""

    engine: BaseEngine
    metrics: Metrics = field(default_factory=Metrics)
    idle_wait_s: float = 0.05
    _commands: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    _streams: dict[str, _Stream] = field(default_factory=dict)
    _wake: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    _ids: itertools.count = field(default_factory=itertools.count)
    _thread: threading.Thread | None = None
    _counted: dict[str, int] = field(default_factory=dict)
    """The engine's counts already added to the metrics."""
    _after_first: dict[str, list[tuple[str, list[int], SamplingParams]]] = field(default_factory=dict)
    """Choices held back until their first choice has a token (`submit_choices`), by its id."""

    def start(self) -> EngineRunner:
        self._thread = threading.Thread(target=self._loop, name="ad-mlir-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def submit(self, prompt: Sequence[int], params: SamplingParams) -> tuple[str, asyncio.Queue[RequestUpdate]]:
        """Queue a request (a `RequestError`, before it queues, where the engine refuses it); its
        updates arrive on the returned queue, the last one with a finish_reason. Call from the
        event loop."""
        ids, updates = self.submit_choices(prompt, [params])
        return ids[0], updates

    def submit_choices(self, prompt: Sequence[int], choices: Sequence[SamplingParams]
                       ) -> tuple[list[str], asyncio.Queue[RequestUpdate]]:
        """Queue one request per choice on the same prompt (OpenAI's `n`; ids `cmpl-<k>-<i>`, or
        `cmpl-<k>` for one); the updates of all of them arrive on the one returned queue, each
        request's last with a finish_reason. Where the prompt fills a page of a prefix-caching
        paged engine, the choices after the first enter once the first has a token: its prompt's
        full pages are cached by then and they share them, prefilling only the rest (requests that
        enter the cache in the same step share nothing)."""
        prompt = [int(t) for t in prompt]
        for params in choices:
            self.engine.check_request(prompt, params)
        base = f"cmpl-{next(self._ids)}"
        ids = [base] if len(choices) == 1 else [f"{base}-{i}" for i in range(len(choices))]
        loop, updates, now = asyncio.get_running_loop(), asyncio.Queue(), time.perf_counter()
        for request_id in ids:
            self._streams[request_id] = _Stream(loop, updates, now, prompt_tokens=len(prompt))
        self._commands.put(("add", list(zip(ids, choices, strict=True)), prompt))
        self._wake.set()
        return ids, updates

    def abort(self, request_id: str) -> None:
        """Drop a request that is not finished (a client that went away); its slot is freed."""
        if request_id in self._streams:
            self._commands.put(("abort", request_id))
            self._wake.set()

    @property
    def in_flight(self) -> int:
        """Requests submitted and not finished."""
        return len(self._streams)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._run_commands()
            if not self.engine.has_work:
                self._wake.wait(self.idle_wait_s)
                self._wake.clear()
                continue
            try:
                updates = self.engine.step()
            except Exception as e:  # noqa: BLE001 (the scheduler failed: its requests end, the server goes on)
                log.exception("engine step failed outside a model call: ending every request it holds")
                updates = self.engine.fail_all(e)
            now = time.perf_counter()
            for update in updates:
                self._deliver(update, now)
            self._gauge()

    def _run_commands(self) -> None:
        ran = False
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            ran = True
            if command[0] == "add":
                self._add_choices(command[1], command[2])
            elif self.engine.abort(command[1]) or self._drop_held(command[1]):
                self._deliver(RequestUpdate(command[1], finish_reason="abort"), time.perf_counter())
        if ran:  # the idle loop wakes every idle_wait_s: the gauges change only with a command or a step
            self._gauge()

    def _add_choices(self, choices: list[tuple[str, SamplingParams]], prompt: list[int]) -> None:
        (first, params), rest = choices[0], choices[1:]
        self._add(first, prompt, params)
        if rest and self._prompt_pages_shared(prompt):
            self._after_first[first] = [(request_id, prompt, p) for request_id, p in rest]
            return
        for request_id, p in rest:
            self._add(request_id, prompt, p)

    def _prompt_pages_shared(self, prompt: list[int]) -> bool:
        """Later requests with this prompt would share a full page of it in the engine's cache."""
        engine = self.engine
        return isinstance(engine, PagedEngine) and engine.blocks.prefix_caching and \
            len(prompt) > engine.llm.page_size

    def _drop_held(self, request_id: str) -> bool:
        """Drop a choice still held back for its first one; False if it is not held."""
        for held in self._after_first.values():
            for i, (held_id, _, _) in enumerate(held):
                if held_id == request_id:
                    del held[i]
                    return True
        return False

    def _add(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        try:
            self.engine.add(prompt, params, request_id=request_id)
        except Exception as e:  # noqa: BLE001 (checked at the door; whatever still fails ends this request)
            self._deliver(RequestUpdate(request_id, finish_reason="error", error=e), time.perf_counter())
            return
        self.metrics.prompt_tokens.inc(len(prompt))

    def _deliver(self, update: RequestUpdate, now: float) -> None:
        stream = self._streams.get(update.request_id)
        if stream is None:
            return
        if update.token_ids:
            self.metrics.generated_tokens.inc(len(update.token_ids))
            if stream.last_token is None:
                self.metrics.ttft.observe(now - stream.arrival)
            else:
                self.metrics.itl.observe(now - stream.last_token)
            stream.last_token = now
        if update.finish_reason:
            self.metrics.finished.labels(update.finish_reason).inc()
            del self._streams[update.request_id]
        stream.loop.call_soon_threadsafe(stream.updates.put_nowait, update)
        for request_id, prompt, params in self._after_first.pop(update.request_id, []):
            self._add(request_id, prompt, params)  # the first choice's prompt is in the cache (or it ended)

    def _gauge(self) -> None:
        m, engine = self.metrics, self.engine
        m.running.set(len(engine.running))
        m.waiting.set(len(engine.waiting))
        if isinstance(engine, Engine):
            m.slots_in_use.set(engine.llm.max_batch - len(engine.free_slots))
        elif isinstance(engine, PagedEngine):
            m.pages_in_use.set(engine.pages_in_use)
            m.pages_free.set(engine.pages_free)
            m.slots_in_use.set(engine.state_slots_in_use)
            for name in ("prefix_queries", "prefix_hits", "preemptions", "drafted_tokens", "accepted_tokens",
                         "draft_steps"):  # the engine counts; the metric follows
                total = getattr(engine, name)
                getattr(m, name).inc(total - self._counted.get(name, 0))
                self._counted[name] = total
