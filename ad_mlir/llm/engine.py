"""Continuous batching over an `LLM`'s cache slots: requests arrive at any time, wait first come
first served for a free slot, and each step runs one batched decode of every sequence that has
its prompt cached, then prefill chunks of waiting prompts within a token budget per step (a long
prompt is cut into chunks over several steps, so it does not stall the running decodes).

A step is two kinds of forward call, not one flattened batch: the compiled graph takes
rectangular [batch, seq] inputs, so decodes (seq 1) and each prefill chunk go apart. Each slot
reserves `max_seq_len` tokens (no pages yet), so a request that fits when it is added always
fits: nothing is ever preempted.

`Engine.step` returns what each request got in that step (`RequestUpdate`): new tokens, the new
text (with a tokenizer; text that could begin a stop string is held back until it cannot), and
why it finished. `LLM.generate` and the server (`ad_mlir/serve/`) both drive this loop.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch


def sample(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None,
           top_k: int = 0) -> int:
    """Greedy (argmax) at temperature 0; else from softmax(logits / temperature) over the `top_k`
    most likely tokens (0: all), keeping the smallest set of most likely tokens whose probability
    reaches `top_p`. Runs on the CPU (the generator is a CPU one; the token is read on the host
    anyway)."""
    logits = logits.cpu()
    if temperature <= 0:
        return int(logits.argmax())
    if 0 < top_k < logits.numel():
        logits = logits.masked_fill(logits < logits.topk(top_k).values[-1], float("-inf"))
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        keep = sorted_probs.cumsum(0) - sorted_probs < top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs, 1, generator=generator))


@dataclass
class GenerationOutput:
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    """The new tokens only."""
    text: str | None = None
    """The new tokens decoded (None without a tokenizer)."""
    finish_reason: str = ""
    """"stop" (EOS or a stop string), "length" (max tokens) or "abort"."""


class CachedModel(Protocol):
    """What the engine needs of a compiled model with caches (`LLM`)."""

    max_batch: int
    max_seq_len: int
    eos: set[int]
    tokenizer: Any

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, slots: Sequence[int],
             starts: Sequence[int]) -> torch.Tensor: ...

    def decode(self, tokens: Sequence[int], slots: Sequence[int], starts: Sequence[int],
               free: Sequence[int]) -> torch.Tensor: ...


@dataclass(frozen=True)
class SamplingParams:
    """How one request's tokens are chosen and when it stops."""

    max_tokens: int = 32
    """New tokens at most ("length" when reached)."""
    temperature: float = 0.0
    """0: greedy (argmax); else logits / temperature are sampled."""
    top_p: float = 1.0
    """Keep the smallest set of most likely tokens whose probability reaches top_p."""
    top_k: int = 0
    """Keep the k most likely tokens (0: all)."""
    seed: int | None = None
    """Seeds this request's own generator (same seed, same prompt: same tokens)."""
    stop: tuple[str, ...] = ()
    """Strings that end the output ("stop"); the text ends before the first one."""
    ignore_eos: bool = False
    """Run to max_tokens through EOS tokens (benchmarks)."""

    def __post_init__(self) -> None:
        checks = [(self.max_tokens >= 1, f"max_tokens must be at least 1, got {self.max_tokens}"),
                  (self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}"),
                  (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
                  (self.top_k >= 0, f"top_k must be >= 0, got {self.top_k}"),
                  (all(self.stop), "a stop string may not be empty")]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


@dataclass
class Request:
    id: str
    params: SamplingParams
    output: GenerationOutput
    generator: torch.Generator | None
    slot: int | None = None
    cached: int = 0
    """Tokens of this request the slot holds."""
    text: str = ""
    """All of the new tokens' text (a tokenizer's decode), stop string cut off when found."""
    sent_text: int = 0
    """Characters of `text` already returned in updates."""

    @property
    def prefilled(self) -> bool:
        return self.cached >= len(self.output.prompt_token_ids)


@dataclass
class RequestUpdate:
    """What a request got in one step."""

    request_id: str
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    """"stop" (EOS or a stop string), "length" (max_tokens) or "abort"; None while it runs."""


class Engine:
    """The scheduler over `llm`'s slots (see the module's docstring). `max_step_tokens` bounds
    the tokens one step feeds: every running decode, then prefill chunks of the waiting prompts
    in arrival order within what is left (at least one token of prefill per step)."""

    def __init__(self, llm: CachedModel, max_step_tokens: int = 256) -> None:
        if max_step_tokens < 1:
            raise ValueError(f"max_step_tokens must be at least 1, got {max_step_tokens}")
        self.llm = llm
        self.max_step_tokens = max_step_tokens
        self.waiting: deque[Request] = deque()
        """Requests without a slot, in arrival order."""
        self.running: list[Request] = []
        """Requests holding a slot (prefilling or decoding), in arrival order."""
        self.free_slots = list(range(llm.max_batch))
        self._ids = itertools.count()

    # -- requests ----------------------------------------------------------------------

    def add(self, prompt: Sequence[int], params: SamplingParams, request_id: str | None = None) -> Request:
        """Queue a request; one that can never fit a slot is refused here, before it queues."""
        prompt = [int(t) for t in prompt]
        self.check_fits(prompt, params)
        generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        request = Request(request_id or f"req-{next(self._ids)}", params, GenerationOutput(prompt), generator)
        self.waiting.append(request)
        return request

    def check_fits(self, prompt: Sequence[int], params: SamplingParams) -> None:
        """Raises ValueError, saying why, for a request that can never fit a slot."""
        if not prompt:
            raise ValueError("the prompt is empty")
        need = len(prompt) + params.max_tokens
        if need > self.llm.max_seq_len:
            raise ValueError(f"the prompt has {len(prompt)} tokens: with max_tokens={params.max_tokens} it needs "
                             f"{need} > max_seq_len={self.llm.max_seq_len} cache positions")

    def abort(self, request_id: str) -> bool:
        """Drop a request (waiting or running) and free its slot; False if it is not here."""
        for request in [*self.waiting, *self.running]:
            if request.id == request_id:
                request.output.finish_reason = "abort"
                self._release(request)
                return True
        return False

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step ----------------------------------------------------------------------

    def step(self) -> list[RequestUpdate]:
        """Admit waiting requests to free slots, decode every prefilled request once, prefill
        chunks within the budget; returns the updates of the requests that got tokens or ended."""
        self._admit()
        updates: dict[str, RequestUpdate] = {}
        decoding = [r for r in self.running if r.prefilled]
        if decoding:
            # a prefilled request has sampled a token already (its last prefill chunk did)
            logits = self.llm.decode([r.output.token_ids[-1] for r in decoding], [r.slot for r in decoding],
                                     [r.cached for r in decoding], self.free_slots)
            for i, request in enumerate(decoding):
                request.cached += 1
                updates[request.id] = self._append(request, logits[i])
        budget = max(self.max_step_tokens - len(decoding), 1)
        for request in [r for r in self.running if not r.prefilled]:
            if budget <= 0:
                break
            chunk = request.output.prompt_token_ids[request.cached: request.cached + budget]
            logits = self.llm.step(torch.tensor([chunk]), torch.arange(request.cached, request.cached + len(chunk))[None],
                                   [request.slot], [request.cached])
            request.cached += len(chunk)
            budget -= len(chunk)
            if request.prefilled:
                updates[request.id] = self._append(request, logits[0, -1])
        for request in [r for r in self.running if r.output.finish_reason]:
            self._release(request)
        return list(updates.values())

    def _admit(self) -> None:
        while self.waiting and self.free_slots:
            request = self.waiting.popleft()
            request.slot = self.free_slots.pop(0)
            self.running.append(request)

    def _release(self, request: Request) -> None:
        if request in self.waiting:
            self.waiting.remove(request)
        if request in self.running:
            self.running.remove(request)
            self.free_slots.insert(0, request.slot)
            request.slot = None

    def _append(self, request: Request, logits: torch.Tensor) -> RequestUpdate:
        params = request.params
        token = sample(logits, params.temperature, params.top_p, request.generator, params.top_k)
        request.output.token_ids.append(token)
        update = RequestUpdate(request.id, [token])
        if token in self.llm.eos and not params.ignore_eos:
            request.output.finish_reason = "stop"
        elif len(request.output.token_ids) >= params.max_tokens:
            request.output.finish_reason = "length"
        if self.llm.tokenizer is not None:
            update.text = self._new_text(request)
        update.finish_reason = request.output.finish_reason or None
        return update

    def _new_text(self, request: Request) -> str:
        """The text this token adds, cut at a stop string (which finishes the request); held
        back while it ends in an incomplete character or could begin a stop string."""
        text = self.llm.tokenizer.decode(request.output.token_ids, skip_special_tokens=True)
        stops = [i for i in (text.find(s) for s in request.params.stop) if i >= 0]
        if stops:
            text = text[:min(stops)]
            request.output.finish_reason = "stop"
        request.text = text
        end = len(text)
        if not request.output.finish_reason:
            end = _safe_end(text, request.params.stop)
        new, request.sent_text = text[request.sent_text:end], max(end, request.sent_text)
        return new


def _safe_end(text: str, stops: Sequence[str]) -> int:
    """How much of `text` can be sent now: not a trailing replacement character (a token that
    ends inside a multi-byte character), nor a tail that a stop string could start with."""
    base = len(text.rstrip("\ufffd"))
    end = base
    for stop in stops:
        held = next((n for n in range(min(len(stop) - 1, base), 0, -1) if text[:base].endswith(stop[:n])), 0)
        end = min(end, base - held)
    return end
