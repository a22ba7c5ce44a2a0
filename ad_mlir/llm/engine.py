"""Continuous batching: requests arrive at any time, wait first come first served, and each step
feeds every running decode (one token each) and prefill chunks of the other requests within a
token budget per step (a long prompt is cut into chunks over several steps, so it does not stall
the running decodes). Two schedulers share the requests, sampling and stop handling (`BaseEngine`):

- `Engine`, over an `LLM`'s cache slots: each slot reserves `max_seq_len` tokens, so a request
  that fits when it is added always fits and nothing is preempted. A step is two kinds of
  forward call: one batched decode and one call per prefill chunk (the graph takes rectangular
  [batch, seq] inputs). Models with per-slot states (convolutions, recurrent scans) run here.
- `PagedEngine`, over a paged cache (a model compiled in the paged form, `forward_flat`):
  pages are taken as a sequence grows (`ad_mlir.llm.pages`), full pages are shared between
  requests that begin with the same tokens (prefix caching), one flattened forward call per step
  holds every token fed, and when pages run out the youngest running request is preempted: its
  pages are freed and it is recomputed later from its prompt and the tokens it has generated
  (nothing is lost). A model with per-sequence states beside its pages (convolutions, scans)
  gives each running request a state slot of its own (so at most its `num_state_slots` run at
  once), freed when it finishes or is preempted (recomputed from position 0, its state starts
  from zeros again); prefix caching is off for such a model, as a prefix's pages do not hold the
  state after it.

`sample` chooses every token. Before it, a request's `logit_bias` and penalties adjust the
model's logits (`adjust_logits`) and its JSON schema's grammar masks the tokens it does not
allow (`ad_mlir.llm.structured`); the grammar takes the token chosen and, when complete, ends
the request. Log-probabilities, for a request that asks, are of the model's logits as they are
(`token_logprobs`).

`make_engine` picks the one that fits the model. `step` returns what each request got in that
step (`RequestUpdate`): new tokens, the new text (with a tokenizer; text that could begin a stop
string is held back until it cannot), and why it finished. `LLM.generate` and the server
(`ad_mlir/serve/`) both drive this loop.

One request never fails another: a request is checked when it is added (`check_request`: token
ids in the vocabulary, room in the cache), a failure in one request's own work (sampling, its
text) ends that request alone, and a failed forward call ends only the requests it fed; each
ends with finish reason "error" and the exception (`RequestUpdate.error`), its cache freed, and
the engine goes on with the others.
"""

from __future__ import annotations

import abc
import itertools
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ad_mlir.llm.pages import BlockManager, pages_for
from ad_mlir.llm.sampling import sample
from ad_mlir.llm.speculative import Proposer, ReadsHiddenStates, verify
from ad_mlir.llm.structured import GrammarError, GrammarMatcher, Grammars

log = logging.getLogger(__name__)

MAX_LOGPROBS = 20
"""The most alternatives a request may ask log-probabilities of per token (vLLM's default)."""


def adjust_logits(logits: torch.Tensor, params: SamplingParams, generated: Sequence[int]) -> torch.Tensor:
    """`logits` with the request's `logit_bias` added, then its frequency and presence penalties
    taken off each token by how often it was generated so far (OpenAI's and vLLM's rule: the
    new tokens only, not the prompt), in fp32 on the CPU where `sample` runs."""
    logits = logits.float().cpu().clone()
    if params.logit_bias:
        ids, biases = zip(*params.logit_bias, strict=True)
        logits[list(ids)] += torch.tensor(biases)
    if generated and (params.frequency_penalty or params.presence_penalty):
        counts = torch.bincount(torch.tensor(generated), minlength=logits.numel())[:logits.numel()]
        logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0)
    return logits


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability and the most likely tokens' at its step."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    """(token, logprob) of the most likely tokens, most likely first."""


def token_logprobs(logits: torch.Tensor, token: int, top: int) -> TokenLogprob:
    """`token`'s log-probability under log_softmax(`logits`) in fp32, and the `top` most likely
    tokens'. Of the model's logits as they are: before the request's penalties, temperature,
    top-k/top-p and grammar mask (vLLM's default, `raw_logprobs`)."""
    logprobs = torch.log_softmax(logits.float().cpu(), dim=-1)
    values, ids = logprobs.topk(top)
    return TokenLogprob(token, float(logprobs[token]), tuple(zip(ids.tolist(), values.tolist(), strict=True)))


@dataclass
class GenerationOutput:
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    """The new tokens only."""
    text: str | None = None
    """The new tokens decoded (None without a tokenizer)."""
    finish_reason: str = ""
    """"stop" (EOS or a stop string), "length" (max tokens), "abort" or "error"."""


class CachedModel(Protocol):
    """What `Engine` needs of a compiled model with cache slots (`LLM`)."""

    max_batch: int
    max_seq_len: int
    vocab_size: int | None
    """Token ids are in [0, vocab_size) (None: not checked)."""
    eos: set[int]
    tokenizer: Any

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, slots: Sequence[int],
             starts: Sequence[int], last_only: bool = False) -> torch.Tensor: ...

    def decode(self, tokens: Sequence[int], slots: Sequence[int], starts: Sequence[int],
               free: Sequence[int]) -> torch.Tensor: ...


class PagedModel(Protocol):
    """What `PagedEngine` needs of a compiled model with a paged cache of `num_pages` pages of
    `page_size` tokens, which it owns and writes."""

    page_size: int
    num_pages: int
    max_seq_len: int
    vocab_size: int | None
    num_state_slots: int
    """Slots of its per-sequence states (0: it has none, and `forward_flat` takes no `state_slots`)."""
    eos: set[int]
    tokenizer: Any

    def forward_flat(self, input_ids: torch.Tensor, position_ids: torch.Tensor, query_starts: torch.Tensor,
                     cache_starts: torch.Tensor, block_tables: torch.Tensor, logits_indices: torch.Tensor,
                     state_slots: torch.Tensor | None = None) -> torch.Tensor:
        """One forward of the tokens of several sequences as one flat sequence: `input_ids` and
        `position_ids` [1, T]; sequence i's new tokens are rows `query_starts[i]` to
        `query_starts[i + 1]`, after the `cache_starts[i]` tokens its pages hold already;
        `block_tables` [num_seqs, max pages per sequence] lists each one's pages in order (entries
        past its tokens ignored). Writes the new tokens' K/V into those pages; returns the
        logits [len(logits_indices), vocab] of the rows `logits_indices`. With per-sequence
        states, `state_slots` [num_seqs] gives each one's state slot (its state continues there,
        from zeros where its cache start is 0). All inputs are int64 host tensors (the model
        moves them to its device)."""
        ...


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
    logprobs: int | None = None
    """Return each new token's log-probability and the `logprobs` most likely tokens' (None: none)."""
    presence_penalty: float = 0.0
    """Taken off the logit of every token generated so far (OpenAI's range: [-2, 2])."""
    frequency_penalty: float = 0.0
    """Taken off a token's logit once per time it was generated so far ([-2, 2])."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias) pairs added to the logits before sampling ([-100, 100])."""
    json_schema: str | None = None
    """The JSON schema (canonical JSON text) the output must match, token by token
    (`ad_mlir.llm.structured`); the request stops when it is complete."""

    def __post_init__(self) -> None:
        checks = [(self.max_tokens >= 1, "max_tokens", f"max_tokens must be at least 1, got {self.max_tokens}"),
                  (self.temperature >= 0, "temperature", f"temperature must be >= 0, got {self.temperature}"),
                  (0 < self.top_p <= 1, "top_p", f"top_p must be in (0, 1], got {self.top_p}"),
                  (self.top_k >= 0, "top_k", f"top_k must be >= 0, got {self.top_k}"),
                  (all(self.stop), "stop", "a stop string may not be empty"),
                  (self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS, "logprobs",
                   f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}"),
                  (-2 <= self.presence_penalty <= 2, "presence_penalty",
                   f"presence_penalty must be in [-2, 2], got {self.presence_penalty}"),
                  (-2 <= self.frequency_penalty <= 2, "frequency_penalty",
                   f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}"),
                  (all(-100 <= b <= 100 for _, b in self.logit_bias), "logit_bias",
                   "logit_bias values must be in [-100, 100]")]
        for ok, param, message in checks:
            if not ok:
                raise RequestError(message, param)


@dataclass
class Request:
    id: str
    params: SamplingParams
    output: GenerationOutput
    generator: torch.Generator | None
    slot: int | None = None
    cached: int = 0
    """Tokens of this request (prompt, then generated ones) whose K/V the cache holds."""
    text: str = ""
    """All of the new tokens' text (a tokenizer's decode), stop string cut off when found."""
    sent_text: int = 0
    """Characters of `text` already returned in updates."""
    grammar: GrammarMatcher | None = None
    """Where the request is in its JSON schema's grammar (`params.json_schema`)."""

    @property
    def prefilled(self) -> bool:
        return self.cached >= len(self.output.prompt_token_ids)

    @property
    def token_ids(self) -> list[int]:
        """The prompt, then the tokens generated so far."""
        return self.output.prompt_token_ids + self.output.token_ids


class RequestError(ValueError):
    """A request the engine refuses before it queues; `param` names the field at fault."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class ContextTooLong(RequestError):
    """A request whose prompt and max_tokens can never fit the cache."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "prompt")


@dataclass
class RequestUpdate:
    """What a request got in one step."""

    request_id: str
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    """"stop" (EOS or a stop string), "length" (max_tokens), "abort" or "error"; None while it runs."""
    error: Exception | None = None
    """What ended the request, with finish reason "error"."""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    """One per token of `token_ids`, where the request asked for them (`SamplingParams.logprobs`)."""


class BaseEngine(abc.ABC):
    """What both schedulers share: the queues, adding and aborting requests, sampling a token
    and the stop rules. `max_step_tokens` bounds the tokens one step feeds: every running decode,
    then prefill chunks in arrival order within what is left (at least one token of prefill per
    step, so prompts advance however many decodes run)."""

    def __init__(self, llm: CachedModel | PagedModel, max_step_tokens: int = 256) -> None:
        if max_step_tokens < 1:
            raise ValueError(f"max_step_tokens must be at least 1, got {max_step_tokens}")
        self.llm = llm
        self.max_step_tokens = max_step_tokens
        self.waiting: deque[Request] = deque()
        """Requests not in the cache, oldest first (a preempted one goes back to the front)."""
        self.running: list[Request] = []
        """Requests in the cache (prefilling or decoding), in the order they entered it."""
        self.grammars = Grammars(llm)
        """The compiled JSON-schema grammars of structured requests (nothing is built until one comes)."""
        self._ids = itertools.count()

    # -- requests ----------------------------------------------------------------------

    def add(self, prompt: Sequence[int], params: SamplingParams, request_id: str | None = None) -> Request:
        """Queue a request; one `check_request` refuses raises here, before it queues."""
        prompt = [int(t) for t in prompt]
        self.check_request(prompt, params)
        request_id = request_id or f"req-{next(self._ids)}"
        if any(r.id == request_id for r in [*self.waiting, *self.running]):
            raise ValueError(f"a request with id {request_id!r} is already queued")
        generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        request = Request(request_id, params, GenerationOutput(prompt), generator, grammar=self._grammar(params))
        self.waiting.append(request)
        return request

    def check_request(self, prompt: Sequence[int], params: SamplingParams) -> None:
        """Raises `RequestError`, saying why, for an empty prompt, a token id outside the model's
        vocabulary (in the prompt or `logit_bias`), a JSON schema that does not compile and
        (`ContextTooLong`) a request that can never fit the cache."""
        if not prompt:
            raise RequestError("the prompt is empty", "prompt")
        self._check_tokens(prompt, "prompt token", "prompt")
        self._check_tokens([t for t, _ in params.logit_bias], "logit_bias token", "logit_bias")
        self._grammar(params)
        if params.max_tokens > self.max_new_tokens(len(prompt)):
            raise ContextTooLong(f"the prompt has {len(prompt)} tokens: with max_tokens={params.max_tokens} it "
                                 f"needs {self._need(len(prompt), params.max_tokens)}{self._room(len(prompt))}")

    def _check_tokens(self, tokens: Sequence[int], what: str, param: str) -> None:
        vocab = self.llm.vocab_size
        bad = next((i for i, t in enumerate(tokens) if t < 0 or (vocab is not None and t >= vocab)), None)
        if bad is not None:
            raise RequestError(f"{what} {bad} is {tokens[bad]}: token ids must be in [0, {vocab}), the model's "
                               "vocabulary", param)

    def _grammar(self, params: SamplingParams) -> GrammarMatcher | None:
        """A fresh matcher of the request's JSON schema (compiled once per schema), or None."""
        if params.json_schema is None:
            return None
        try:
            return self.grammars.matcher(params.json_schema)
        except GrammarError as e:
            raise RequestError(str(e), "response_format") from None

    def max_new_tokens(self, prompt_tokens: int) -> int:
        """The most tokens a request with a prompt of `prompt_tokens` tokens can generate (0 or
        less: none), the default max_tokens' cap."""
        return self.llm.max_seq_len - prompt_tokens

    def _need(self, prompt_tokens: int, max_tokens: int) -> str:
        """What a request needs against what the cache holds, for `check_request`'s refusal."""
        return f"{prompt_tokens + max_tokens} > max_seq_len={self.llm.max_seq_len} cache positions"

    def _room(self, prompt_tokens: int) -> str:
        room = self.max_new_tokens(prompt_tokens)
        return f" (max_tokens={room} at most)" if room > 0 else " (no room for a new token)"

    def abort(self, request_id: str) -> bool:
        """Drop a request (waiting or running) and free its cache; False if it is not here."""
        for request in [*self.waiting, *self.running]:
            if request.id == request_id:
                request.output.finish_reason = "abort"
                self._release(request)
                return True
        return False

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @abc.abstractmethod
    def step(self) -> list[RequestUpdate]:
        """Run one step; the updates of the requests that got tokens or ended."""

    # -- shared by the schedulers --------------------------------------------------------

    def _prefill_budget(self, decodes: int) -> int:
        return max(self.max_step_tokens - decodes, 1)

    def _release(self, request: Request) -> None:
        if request in self.waiting:
            self.waiting.remove(request)
        if request in self.running:
            self.running.remove(request)
            self._free(request)

    @abc.abstractmethod
    def _free(self, request: Request) -> None:
        """Give back what `request` holds of the cache."""

    def _release_finished(self) -> None:
        for request in [r for r in self.running if r.output.finish_reason]:
            self._release(request)

    def fail(self, requests: Sequence[Request], error: Exception) -> list[RequestUpdate]:
        """End `requests` with `error` (finish reason "error") and free what they hold; the
        engine goes on with the others."""
        log.error("ending %d request(s) with an error: %s: %s", len(requests), type(error).__name__, error,
                  exc_info=error)
        for request in requests:
            request.output.finish_reason = "error"
            self._release(request)
        return [RequestUpdate(r.id, finish_reason="error", error=error) for r in requests]

    def fail_all(self, error: Exception) -> list[RequestUpdate]:
        """End every request, waiting or running, with `error` (a step that failed outside any
        model call: what the scheduler holds is no longer known to be sound), leaving the engine
        empty, every page and slot free."""
        return self.fail([*self.running, *self.waiting], error)

    def _append_token(self, request: Request, logits: torch.Tensor, draft: int | None = None) -> RequestUpdate:
        """`_append`, or, where it fails (sampling, the tokenizer), the request ended alone."""
        try:
            return self._append(request, logits, draft)
        except Exception as e:  # noqa: BLE001 (this request's failure ends this request)
            return self.fail([request], e)[0]

    def _append(self, request: Request, logits: torch.Tensor, draft: int | None = None) -> RequestUpdate:
        """The request's next token from its position's `logits` (at a drafted position, the
        draft or the token that replaces it: `speculative.verify`), and what it ends."""
        params = request.params
        scores = self._scores(request, logits)
        if draft is None:
            token = sample(scores, params.temperature, params.top_p, request.generator, params.top_k)
        else:
            token = verify(scores, draft, params.temperature, params.top_p, request.generator, params.top_k)
        request.output.token_ids.append(token)
        update = RequestUpdate(request.id, [token])
        if params.logprobs is not None:
            update.logprobs.append(token_logprobs(logits, token, params.logprobs))
        grammar_done = request.grammar is not None and request.grammar.advance(token)
        if (token in self.llm.eos and not params.ignore_eos) or grammar_done:
            request.output.finish_reason = "stop"
        elif len(request.output.token_ids) >= params.max_tokens:
            request.output.finish_reason = "length"
        if self.llm.tokenizer is not None:
            update.text = self._new_text(request)
        update.finish_reason = request.output.finish_reason or None
        return update

    @staticmethod
    def _scores(request: Request, logits: torch.Tensor) -> torch.Tensor:
        """The logits `sample` chooses from: the model's, with the request's logit bias and
        penalties, then its grammar's mask (each only where asked for: they cost a copy)."""
        params = request.params
        if params.logit_bias or params.presence_penalty or params.frequency_penalty:
            logits = adjust_logits(logits, params, request.output.token_ids)
        if request.grammar is not None:
            logits = request.grammar.mask(logits)
        return logits

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


class Engine(BaseEngine):
    """The scheduler over `llm`'s cache slots (see the module's docstring): a waiting request
    takes a free slot, first come first served."""

    llm: CachedModel

    def __init__(self, llm: CachedModel, max_step_tokens: int = 256) -> None:
        super().__init__(llm, max_step_tokens)
        self.free_slots = list(range(llm.max_batch))

    def step(self) -> list[RequestUpdate]:
        """Admit waiting requests to free slots, decode every prefilled request once, prefill
        chunks within the budget; returns the updates of the requests that got tokens or ended."""
        self._admit()
        updates: dict[str, RequestUpdate] = {}
        decoding = [r for r in self.running if r.prefilled]
        if decoding:
            # a prefilled request has sampled a token already (its last prefill chunk did)
            try:
                logits = self.llm.decode([r.output.token_ids[-1] for r in decoding], [r.slot for r in decoding],
                                         [r.cached for r in decoding], self.free_slots)
            except Exception as e:  # noqa: BLE001 (a failed call ends the requests it fed)
                updates.update((u.request_id, u) for u in self.fail(decoding, e))
            else:
                for i, request in enumerate(decoding):
                    request.cached += 1
                    updates[request.id] = self._append_token(request, logits[i])
        budget = self._prefill_budget(len(decoding))
        for request in [r for r in self.running if not r.prefilled]:
            if budget <= 0:
                break
            chunk = request.output.prompt_token_ids[request.cached: request.cached + budget]
            budget -= len(chunk)
            try:
                logits = self.llm.step(torch.tensor([chunk]),
                                       torch.arange(request.cached, request.cached + len(chunk))[None],
                                       [request.slot], [request.cached], last_only=True)
            except Exception as e:  # noqa: BLE001 (a failed call ends the request it fed)
                updates[request.id] = self.fail([request], e)[0]
                continue
            request.cached += len(chunk)
            if request.prefilled:
                updates[request.id] = self._append_token(request, logits[0, -1])
        self._release_finished()
        return list(updates.values())

    def _admit(self) -> None:
        while self.waiting and self.free_slots:
            request = self.waiting.popleft()
            request.slot = self.free_slots.pop(0)
            self.running.append(request)

    def _free(self, request: Request) -> None:
        self.free_slots.insert(0, request.slot)
        request.slot = None


@dataclass
class _Chunk:
    """The tokens one request feeds in a step: `tokens[start:start + length]`."""

    request: Request
    tokens: list[int]
    start: int
    length: int
    draft: list[int] = field(default_factory=list)
    """Drafted tokens fed after the chunk's last one (speculative decoding), each to be verified."""

    @property
    def ends(self) -> bool:
        """It feeds the request's last token: its logits give the next token."""
        return self.start + self.length == len(self.tokens)


class PagedEngine(BaseEngine):
    """The scheduler over a paged cache (see the module's docstring and docs/serving.md). Each
    step: the running requests in the order they entered, each its next token (a decode) or its
    next prefill chunk, taking pages as they grow; when the pool has too few free pages the
    youngest running request is preempted (its pages freed, back to the front of the waiting
    queue, recomputed later from its prompt and generated tokens). Then, if nothing was
    preempted, waiting requests enter first come first served while the budget and the pool
    allow, each starting after the full pages of its tokens that are cached (`prefix_caching`).
    All of it runs as one `forward_flat` call.

    `max_running` caps the requests in the cache at once (vLLM's `max_num_seqs`; None: as many
    as the pages hold): a step's decodes are that many at most, which bounds its time. A model
    with per-sequence states caps it at its `num_state_slots` (a request holds a state slot while
    it runs: `request.slot`) and turns prefix caching off: its shared pages would skip the
    tokens whose state the new request needs (nothing saves a state at a page's end).

    With `speculative` (a proposer, `ad_mlir.llm.speculative`), each decode also feeds the
    tokens the proposer drafts for it, as far as the request's max_tokens, the context and free
    pages allow (a draft never preempts); the logits of every fed position verify the drafts in
    order, the request keeps the accepted ones and the token that follows them, and its cached
    length goes back to the last accepted token (the pages' K/V past it are written over by the
    next step). A model with per-sequence states is refused: its states cannot be rolled back.

    For metrics: `pages_in_use`, `pages_free`, `pages_cached`, `prefix_hits`, `prefix_queries`,
    `prefix_hit_rate` (prompt tokens found cached over those looked up), `preemptions`,
    `state_slots_in_use`, and with speculation `drafted_tokens`, `accepted_tokens`,
    `acceptance_rate` and `tokens_per_draft_step`."""

    llm: PagedModel

    def __init__(self, llm: PagedModel, max_step_tokens: int = 256, prefix_caching: bool = True,
                 max_running: int | None = None, speculative: Proposer | ReadsHiddenStates | None = None) -> None:
        super().__init__(llm, max_step_tokens)
        if max_running is not None and max_running < 1:
            raise ValueError(f"max_running must be at least 1, got {max_running}")
        states = llm.num_state_slots
        if speculative is not None and states:
            raise ValueError("speculative decoding needs a model whose every cache is paged: this one keeps "
                             f"per-sequence states ({states} state slots: convolutions or recurrent scans), "
                             "which cannot be rolled back past a rejected draft")
        draft_vocab = getattr(speculative, "vocab_size", None)
        if draft_vocab is not None and llm.vocab_size is not None and draft_vocab > llm.vocab_size:
            raise ValueError(f"the draft model's vocabulary ({draft_vocab} tokens) is larger than the model's "
                             f"({llm.vocab_size}): a draft model must share the model's tokenizer")
        if isinstance(speculative, ReadsHiddenStates) and getattr(llm, "captured_layers", None) != speculative.layers:
            raise ValueError(f"the proposer drafts from the hidden states after layers {list(speculative.layers)}, which "
                             "this model does not return: build it with LLM(..., speculative=the proposer)")
        self.speculative = speculative
        self.drafted_tokens = 0
        self.accepted_tokens = 0
        self.draft_steps = 0
        """Decodes that fed a draft (each gives its request 1 + its accepted tokens)."""
        self.max_running = min(max_running or states, states) if states else max_running
        self.free_state_slots = list(range(states))
        """State slots no running request holds (none for a model without per-sequence states)."""
        self.blocks = BlockManager(llm.num_pages, llm.page_size, prefix_caching and not states)
        self.pages_per_seq = pages_for(llm.max_seq_len, llm.page_size)
        """The width of the block tables fed to `forward_flat`."""
        self.preemptions = 0

    # -- metrics -------------------------------------------------------------------------

    @property
    def pages_in_use(self) -> int:
        return self.blocks.pool.num_in_use

    @property
    def pages_free(self) -> int:
        """Pages that can be taken (cached ones that nobody holds included)."""
        return self.blocks.pool.num_free

    @property
    def state_slots_in_use(self) -> int:
        """Per-sequence state slots held by running requests (0 for a model without states)."""
        return self.llm.num_state_slots - len(self.free_state_slots)

    @property
    def pages_cached(self) -> int:
        return self.blocks.pool.num_cached

    @property
    def prefix_hits(self) -> int:
        return self.blocks.prefix_hits

    @property
    def prefix_queries(self) -> int:
        return self.blocks.prefix_queries

    @property
    def prefix_hit_rate(self) -> float:
        return self.blocks.prefix_hit_rate

    @property
    def acceptance_rate(self) -> float:
        """Drafted tokens accepted over those drafted (0 before any)."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def tokens_per_draft_step(self) -> float:
        """Tokens a decode that fed a draft gave its request, on average (1 + accepted; 0 before any)."""
        return (self.draft_steps + self.accepted_tokens) / self.draft_steps if self.draft_steps else 0.0

    # -- requests ------------------------------------------------------------------------

    def max_new_tokens(self, prompt_tokens: int) -> int:
        """Also bounded by the pool: a request's tokens may fill every page (the last generated
        token is never fed, so it takes no place)."""
        pool = self.llm.num_pages * self.llm.page_size
        return min(super().max_new_tokens(prompt_tokens), pool - prompt_tokens + 1)

    def _need(self, prompt_tokens: int, max_tokens: int) -> str:
        if prompt_tokens + max_tokens > self.llm.max_seq_len:
            return super()._need(prompt_tokens, max_tokens)
        pages = pages_for(prompt_tokens + max_tokens - 1, self.llm.page_size)
        return f"{pages} pages of {self.llm.page_size} tokens > the {self.llm.num_pages} pages of the cache"

    # -- one step ----------------------------------------------------------------------

    def step(self) -> list[RequestUpdate]:
        """Schedule (see the class's docstring), run one `forward_flat`, sample the requests
        whose last token was fed; returns the updates of the requests that got tokens or ended."""
        chunks = self._schedule()
        if not chunks:
            return []
        try:
            logits = self.llm.forward_flat(*self._flat_inputs(chunks), **self._state_slots(chunks))
        except Exception as e:  # noqa: BLE001 (a failed call ends the requests it fed, and no other)
            return self.fail([c.request for c in chunks], e)
        updates: dict[str, RequestUpdate] = {}
        for chunk in chunks:
            request = chunk.request
            request.cached += chunk.length
            self.blocks.written(request.id, chunk.tokens, request.cached)
        rows = iter(logits)
        for chunk in [c for c in chunks if c.ends]:
            fed = [next(rows) for _ in range(1 + len(chunk.draft))]
            updates[chunk.request.id] = self._append_verified(chunk, fed) if chunk.draft else \
                self._append_token(chunk.request, fed[0])
        self._release_finished()
        if isinstance(self.speculative, ReadsHiddenStates):
            self._hand_hidden_states(chunks)
        return list(updates.values())

    def _hand_hidden_states(self, chunks: Sequence[_Chunk]) -> None:
        """The step's hidden states (`llm.hidden_states`, a row per fed token) of the positions
        each running request's cache now holds, to the proposer that drafts from them."""
        hidden = self.llm.hidden_states
        running = {r.id for r in self.running}
        row = 0
        for chunk in chunks:
            request = chunk.request
            if request.id in running:
                self.speculative.observe(request.id, chunk.start, hidden[row:row + request.cached - chunk.start])
            row += chunk.length + len(chunk.draft)

    def _append_verified(self, chunk: _Chunk, rows: Sequence[torch.Tensor]) -> RequestUpdate:
        """The tokens of a decode that fed `chunk.draft`: row i verifies draft token i, the first
        one rejected is replaced and ends the step's tokens (all accepted: the last row's token
        follows them); the accepted drafted tokens' K/V are the request's cache now."""
        request, draft = chunk.request, chunk.draft
        update = RequestUpdate(request.id)
        accepted = 0
        for i, row in enumerate(rows):
            proposed = draft[i] if i < len(draft) else None
            got = self._append_token(request, row, proposed)
            update.token_ids += got.token_ids
            update.logprobs += got.logprobs
            update.text += got.text
            update.finish_reason, update.error = got.finish_reason, got.error
            if got.finish_reason or proposed is None or got.token_ids != [proposed]:
                break
            accepted += 1
        self.draft_steps += 1
        self.drafted_tokens += len(draft)
        self.accepted_tokens += accepted
        if not update.finish_reason:
            request.cached += accepted
            self.blocks.written(request.id, request.token_ids, request.cached)
        return update

    def _schedule(self) -> list[_Chunk]:
        chunks: list[_Chunk] = []
        decodes = [r for r in self.running if len(r.token_ids) - r.cached == 1]
        budget = self._prefill_budget(len(decodes))
        drafts = self._drafts(decodes, budget)
        preempted = self.preemptions
        for request in list(self.running):
            if request not in self.running:  # preempted for an older one in this step
                break
            tokens = request.token_ids
            left = len(tokens) - request.cached
            if left > 1 and budget <= 0:
                continue
            length = 1 if left == 1 else min(left, budget)
            draft = self._room_for_draft(request, tokens, drafts.get(request.id, []))
            if not self._make_room(request, request.cached + length):
                break
            chunks.append(_Chunk(request, tokens, request.cached, length, draft))
            if left > 1:  # the decodes were taken off the budget already
                budget -= length
            budget -= len(draft)
        if self.preemptions == preempted:
            chunks += self._admit(budget)
        return chunks

    def _drafts(self, decodes: Sequence[Request], budget: int) -> dict[str, list[int]]:
        """The proposer's drafts for the step's decodes, by request id, in one call: each no longer
        than its request may still generate after the token this step gives, nor than the context
        holds, the decodes sharing what the step's budget leaves beside one prefill token."""
        if self.speculative is None or not decodes:
            return {}
        share = (budget - 1) // len(decodes)
        sequences = [r.token_ids for r in decodes]
        limits = [min(r.params.max_tokens - len(r.output.token_ids) - 1, self.llm.max_seq_len - len(tokens), share)
                  for r, tokens in zip(decodes, sequences, strict=True)]
        if isinstance(self.speculative, ReadsHiddenStates):
            drafts = self.speculative.propose_for([r.id for r in decodes], sequences, limits)
        else:
            drafts = self.speculative.propose(sequences, limits)
        return {r.id: draft[:limit] for r, draft, limit in zip(decodes, drafts, limits, strict=True)}

    def _room_for_draft(self, request: Request, tokens: list[int], draft: list[int]) -> list[int]:
        """`draft` cut to the pages free beyond one per running request, those pages taken (a
        draft never makes another request wait or be preempted)."""
        if not draft:
            return draft
        held = len(self.blocks.block_table(request.id))
        spare = self.blocks.pool.num_free - len(self.running)  # a page kept for each running request's next token
        while draft and pages_for(len(tokens) + len(draft), self.llm.page_size) - held > spare:
            draft.pop()
        self.blocks.grow(request.id, len(tokens) + len(draft))
        return draft

    def _make_room(self, request: Request, num_tokens: int) -> bool:
        """Pages for `num_tokens` tokens of `request`, preempting the youngest running requests
        while the pool is short; False if `request` itself was preempted."""
        while not self.blocks.grow(request.id, num_tokens):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self._free(request)
        self.waiting.appendleft(request)
        self.preemptions += 1

    def _admit(self, budget: int) -> list[_Chunk]:
        """Waiting requests that enter the cache, first come first served, each with its first
        chunk after its cached prefix; the first that does not fit (budget, pages, `max_running`)
        stops it."""
        chunks = []
        while self.waiting and budget > 0 and (self.max_running is None or len(self.running) < self.max_running):
            request = self.waiting[0]
            tokens = request.token_ids
            shared = self.blocks.cached_prefix(tokens)
            start = len(shared) * self.llm.page_size
            length = min(len(tokens) - start, budget)
            if not self.blocks.start(request.id, tokens, shared, start + length):
                break
            self.running.append(self.waiting.popleft())
            request.cached = start
            if self.llm.num_state_slots:
                request.slot = self.free_state_slots.pop(0)
            chunks.append(_Chunk(request, tokens, start, length))
            budget -= length
        return chunks

    def _free(self, request: Request) -> None:
        self.blocks.free(request.id)
        request.cached = 0
        if isinstance(self.speculative, ReadsHiddenStates):
            self.speculative.forget(request.id)
        if request.slot is not None:
            self.free_state_slots.insert(0, request.slot)
            request.slot = None

    def _state_slots(self, chunks: Sequence[_Chunk]) -> dict[str, torch.Tensor]:
        """`forward_flat`'s `state_slots` for `chunks` where the model has per-sequence states."""
        if not self.llm.num_state_slots:
            return {}
        return {"state_slots": torch.tensor([c.request.slot for c in chunks], dtype=torch.int64)}

    def _flat_inputs(self, chunks: Sequence[_Chunk]) -> tuple[torch.Tensor, ...]:
        """`forward_flat`'s inputs for `chunks`: their tokens (and drafts) one after another,
        logits wanted for the last token of each chunk that ends its request's tokens and for
        each of its drafted tokens."""
        ids: list[int] = []
        positions: list[int] = []
        query_starts = [0]
        tables = []
        logits_indices = []
        for chunk in chunks:
            ids += chunk.tokens[chunk.start: chunk.start + chunk.length] + chunk.draft
            positions += range(chunk.start, chunk.start + chunk.length + len(chunk.draft))
            query_starts.append(len(ids))
            pages = self.blocks.block_table(chunk.request.id)
            tables.append(pages + [0] * (self.pages_per_seq - len(pages)))
            if chunk.ends:
                logits_indices += range(len(ids) - 1 - len(chunk.draft), len(ids))

        def tensor(values: list[Any]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64)

        return (tensor([ids]), tensor([positions]), tensor(query_starts), tensor([c.start for c in chunks]),
                tensor(tables).view(len(chunks), self.pages_per_seq), tensor(logits_indices))


def is_paged(llm: object) -> bool:
    """The model was compiled with a paged cache (`page_size` set; one flattened forward per step)."""
    return getattr(llm, "page_size", None) is not None and callable(getattr(llm, "forward_flat", None))


def make_engine(llm: CachedModel | PagedModel, max_step_tokens: int = 256,
                max_running: int | None = None, speculative: Proposer | ReadsHiddenStates | None = None) -> BaseEngine:
    """A `PagedEngine` for a model compiled with a paged cache (at most `max_running` requests in
    it at once, drafting with `speculative`), else an `Engine` over its slots (as many as it has
    slots; speculative decoding is refused there)."""
    if is_paged(llm):
        return PagedEngine(llm, max_step_tokens, max_running=max_running, speculative=speculative)
    if speculative is not None:
        raise ValueError("speculative decoding runs on the paged engine: compile the model in the paged form "
                         "(LLM(..., page_size=...))")
    return Engine(llm, max_step_tokens)


def _safe_end(text: str, stops: Sequence[str]) -> int:
    """How much of `text` can be sent now: not a trailing replacement character (a token that
    ends inside a multi-byte character), nor a tail that a stop string could start with."""
    base = len(text.rstrip("\ufffd"))
    end = base
    for stop in stops:
        held = next((n for n in range(min(len(stop) - 1, base), 0, -1) if text[:base].endswith(stop[:n])), 0)
        end = min(end, base - held)
    return end
