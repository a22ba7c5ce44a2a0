"""The OpenAI-compatible HTTP API (FastAPI): `/v1/completions`, `/v1/chat/completions` (the
tokenizer's chat template), each streamed as server-sent events or not, `/v1/models`,
`/health` and `/metrics` (Prometheus).

The server serves only the model it was started with and binds 127.0.0.1 unless told otherwise
(`ad-mlir serve --host`); `--api-key` makes the `/v1` routes need it. A request body that does
not validate gets a 400 with an OpenAI-style error
(`{"error": {"message", "type": "invalid_request_error", "param", "code"}}`), an unknown model a
404 (`model_not_found`); what the engine refuses (a token id outside the vocabulary, a request
that can never fit the cache) a 400 naming the field, before it queues. Without `max_tokens` a
request generates up to the server's default, capped by what fits the cache after its prompt. A
request the engine ends with an error gets a 500 (streamed: an error event), and only that
request. A client that disconnects cancels its request: the engine frees its slot.

Fields: every OpenAI field of both endpoints is either done (`n` as one engine request per
choice, logprobs, penalties, `logit_bias`, `response_format`, `stream_options`...), taken and
ignored because it changes nothing in the output (`user`, `metadata`, `store`...), or refused
with a 400 naming it (`REFUSED`: `echo`, `suffix`, tools...); a field OpenAI does not have is a
400 too. docs/serving.md has the table.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from ad_mlir.llm.engine import (
    MAX_LOGPROBS,
    ContextTooLong,
    RequestError,
    RequestUpdate,
    SamplingParams,
    TokenLogprob,
)
from ad_mlir.llm.structured import JSON_OBJECT, canonical_schema
from ad_mlir.serve.runner import EngineRunner

DISCONNECT_POLL_S = 0.5
"""How often a non-streaming request checks that its client is still there."""
MAX_BODY_BYTES = 1 << 20
"""The largest request body read (a prompt longer than any cache slot fits in far less)."""


MAX_N = 128
"""The most choices (`n`) one request may ask for (OpenAI's bound)."""

_NOTHING: tuple[Any, ...] = (None, False, "", [], {})
REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "echo": (_NOTHING, "the prompt is not echoed back"),
    "suffix": (_NOTHING, "text after the insertion point is not supported"),
    "tools": (_NOTHING, "tool calling is not supported"),
    "tool_choice": (_NOTHING + ("none", "auto"), "tool calling is not supported"),
    "functions": (_NOTHING, "function calling is not supported"),
    "function_call": (_NOTHING + ("none", "auto"), "function calling is not supported"),
    "audio": (_NOTHING, "audio output is not supported"),
    "modalities": (_NOTHING + (["text"],), "only text output is supported"),
    "reasoning_effort": (_NOTHING, "there are no reasoning controls"),
    "verbosity": (_NOTHING, "there is no verbosity control"),
    "web_search_options": (_NOTHING, "web search is not supported"),
    "moderation": (_NOTHING, "moderation is not supported"),
}
"""OpenAI fields that change the output and that this server does not do: (the values that ask
for nothing, why), a 400 naming the field for any other value."""


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False


class _JsonSchema(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None
    """Whatever it says, the schema is enforced token by token."""


class _ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: _JsonSchema | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> _ResponseFormat:
        if (self.json_schema is not None) != (self.type == "json_schema"):
            raise ValueError('json_schema is given with "type": "json_schema", and only then')
        return self

    def schema_text(self) -> str | None:
        """The JSON schema the output must match, as canonical JSON text (None: free text)."""
        if self.type == "json_schema":
            return canonical_schema(self.json_schema.schema_)
        return JSON_OBJECT if self.type == "json_object" else None


class _Sampling(BaseModel):
    """What both endpoints take. An unknown field is a 400 naming it (never ignored in silence);
    the fields OpenAI has that we take and ignore, as they change nothing in the output, are
    declared as such; those that would change it and we do not do are refused (`REFUSED`)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: _StreamOptions | None = None
    n: int | None = Field(default=None, ge=1, le=MAX_N)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[int, Annotated[float, Field(ge=-100, le=100)]] | None = None
    response_format: _ResponseFormat | None = None
    user: str | None = None
    """Ignored (it names the end user, for abuse monitoring)."""

    @field_validator("stream_options")
    @classmethod
    def _only_streamed(cls, value: _StreamOptions | None, info: ValidationInfo) -> _StreamOptions | None:
        if value is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed with stream: true")
        return value

    @property
    def choices(self) -> int:
        return self.n or 1

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def requested_logprobs(self) -> int | None:
        """How many alternatives per token to return log-probabilities of (None: none)."""
        return None

    def params(self, max_tokens: int, choice: int) -> SamplingParams:
        """The sampling parameters of choice `choice` (its seed: `seed + choice`, so each choice
        is its own sample and reproducible), with `max_tokens` where the request gives none."""
        stop = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return SamplingParams(
            max_tokens=self.requested_max_tokens() or max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p, top_k=self.top_k or 0,
            seed=None if self.seed is None else self.seed + choice, stop=tuple(stop),
            logprobs=self.requested_logprobs(), presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0, logit_bias=tuple(sorted((self.logit_bias or {}).items())),
            json_schema=self.response_format.schema_text() if self.response_format else None)


def _refused(cls: type, value: Any, info: ValidationInfo) -> Any:
    """A 400 naming a `REFUSED` field set to something it does not do."""
    harmless, why = REFUSED[info.field_name]
    if value not in harmless:
        raise ValueError(f"{why}: this server does not take {info.field_name}={json.dumps(value)}")
    return value


class CompletionRequest(_Sampling):
    prompt: str | list[int] = Field(min_length=1)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = Field(default=None, ge=1)
    echo: Any = None
    suffix: Any = None

    check_refused = field_validator("echo", "suffix")(_refused)

    @field_validator("best_of")
    @classmethod
    def _best_of_is_n(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value != (info.data.get("n") or 1):
            raise ValueError(f"best_of={value} (n={info.data.get('n') or 1}): choices are not ranked, best_of "
                             "may only equal n")
        return value

    def requested_logprobs(self) -> int | None:
        return self.logprobs


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    moderation: Any = None
    # Ignored: they do not change the output (storage, billing, caching and latency hints, metadata).
    metadata: Any = None
    store: Any = None
    service_tier: Any = None
    parallel_tool_calls: Any = None
    prediction: Any = None
    prompt_cache_key: Any = None
    prompt_cache_options: Any = None
    prompt_cache_retention: Any = None
    safety_identifier: Any = None

    check_refused = field_validator("tools", "tool_choice", "functions", "function_call", "audio", "modalities",
                                    "reasoning_effort", "verbosity", "web_search_options", "moderation")(_refused)

    @field_validator("top_logprobs")
    @classmethod
    def _with_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: true")
        return value

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def requested_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def _error(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": param,
                                   "code": code}}, status_code=status)


class _Guard:
    """The API key and the body size, checked before the app runs. A plain ASGI middleware:
    Starlette's `BaseHTTPMiddleware` (`@app.middleware`) passes every streamed chunk through a
    memory stream and a task switch, which on a loaded CPU cost the server's event loop more
    than the rest of a token's delivery."""

    def __init__(self, app: ASGIApp, api_key: str | None, max_body_bytes: int) -> None:
        self.app, self.api_key, self.max_body_bytes = app, api_key, max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self._refusal(scope) if scope["type"] == "http" else None
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> JSONResponse | None:
        headers = Headers(scope=scope)
        if scope["path"].startswith("/v1/") and self.api_key is not None and \
                headers.get("authorization") != f"Bearer {self.api_key}":
            return _error(401, "a valid API key is needed (Authorization: Bearer ...)", None, "invalid_api_key")
        if int(headers.get("content-length") or 0) > self.max_body_bytes:
            return _error(413, f"the request body is over {self.max_body_bytes} bytes", None, "body_too_large")
        return None


def build_app(runner: EngineRunner, model_name: str, tokenizer: Any = None, default_max_tokens: int = 256,
              api_key: str | None = None, max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    """The app serving `runner`'s engine as `model_name` (`tokenizer`: for text prompts, chat and
    text outputs; without one, prompts are token ids and outputs carry token ids only). With
    `api_key`, the `/v1` routes need `Authorization: Bearer <api_key>` (401 otherwise); a body
    over `max_body_bytes` is refused (413) before it is read."""
    app = FastAPI(title="ad-mlir", summary="OpenAI-compatible completions over an ad-mlir compiled model")
    created = int(time.time())

    app.add_middleware(_Guard, api_key=api_key, max_body_bytes=max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())[1:])
        message = _validation_message(first)
        return _error(400, f"{where}: {message}" if where else message, where or None, "invalid_request")

    @app.exception_handler(ApiError)
    async def api_error(_: Request, e: ApiError) -> JSONResponse:
        return _error(e.status, e.message, e.param, e.code)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(runner.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "ad-mlir"}]}

    def check_model(body: _Sampling) -> None:
        if body.model != model_name:
            raise ApiError(404, f"The model '{body.model}' does not exist (this server serves '{model_name}')",
                           "model", "model_not_found")

    def submit(prompt: list[int], body: _Sampling) -> tuple[list[str], asyncio.Queue[RequestUpdate]]:
        # no max_tokens: the default, capped by the room after the prompt (at least 1, so that a
        # prompt leaving none is refused by the engine, saying so)
        max_tokens = max(min(default_max_tokens, runner.engine.max_new_tokens(len(prompt))), 1)
        try:
            return runner.submit_choices(prompt, [body.params(max_tokens, i) for i in range(body.choices)])
        except RequestError as e:  # the engine's checks, and values pydantic's bounds let through (an empty stop)
            code = "context_length_exceeded" if isinstance(e, ContextTooLong) else "invalid_request"
            raise ApiError(400, str(e), e.param, code) from None

    def usage_chunk(body: _Sampling, prompt: list[int]) -> int | None:
        """The prompt's length where a stream ends with a usage chunk (`stream_options`)."""
        return len(prompt) if body.stream_options and body.stream_options.include_usage else None

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, http: Request) -> Any:
        check_model(body)
        prompt = _prompt_ids(body.prompt, tokenizer)
        ids, updates = submit(prompt, body)
        envelope = _Envelope(ids[0], model_name, created, "text_completion")
        with_logprobs = body.logprobs is not None
        if body.stream:
            offsets = [0] * len(ids)

            def delta(i: int, update: RequestUpdate) -> dict[str, Any]:
                logprobs = None
                if with_logprobs:
                    logprobs, offsets[i] = _completion_logprobs(update.logprobs, tokenizer, offsets[i])
                return {"text": update.text, "logprobs": logprobs,
                        **({} if tokenizer else {"token_ids": update.token_ids})}

            return _sse(ids, updates, runner, envelope, delta, usage_of=usage_chunk(body, prompt))
        choices = await _collect(ids, updates, runner, http)
        return envelope([{"index": i, "text": c.text, "finish_reason": c.finish_reason,
                          "logprobs": _completion_logprobs(c.logprobs, tokenizer, 0)[0] if with_logprobs else None,
                          **({} if tokenizer else {"token_ids": c.tokens})} for i, c in enumerate(choices)],
                        usage=_usage(len(prompt), sum(len(c.tokens) for c in choices)))

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, http: Request) -> Any:
        check_model(body)
        if tokenizer is None or getattr(tokenizer, "chat_template", None) is None:
            raise ApiError(400, f"the model '{model_name}' has no chat template: use /v1/completions", "messages")
        prompt = list(tokenizer.apply_chat_template([m.model_dump() for m in body.messages],
                                                    add_generation_prompt=True, tokenize=True, return_dict=False))
        ids, updates = submit(prompt, body)
        with_logprobs = bool(body.logprobs)

        def logprobs(tokens: list[TokenLogprob]) -> dict[str, Any] | None:
            return _chat_logprobs(tokens, tokenizer) if with_logprobs else None

        if body.stream:
            return _sse(ids, updates, runner, _Envelope(ids[0], model_name, created, "chat.completion.chunk"),
                        lambda _, u: {"delta": {"content": u.text}, "logprobs": logprobs(u.logprobs)},
                        opening={"delta": {"role": "assistant", "content": ""}}, usage_of=usage_chunk(body, prompt))
        choices = await _collect(ids, updates, runner, http)
        envelope = _Envelope(ids[0], model_name, created, "chat.completion")
        return envelope([{"index": i, "message": {"role": "assistant", "content": c.text},
                          "finish_reason": c.finish_reason, "logprobs": logprobs(c.logprobs)}
                         for i, c in enumerate(choices)],
                        usage=_usage(len(prompt), sum(len(c.tokens) for c in choices)))

    return app


def _validation_message(error: dict[str, Any]) -> str:
    """Pydantic's message for one error; our own checks' words as they are, an unknown field's
    saying so."""
    if error.get("type") == "extra_forbidden":
        return "not a field this server takes (docs/serving.md lists the OpenAI fields and what each does here)"
    if error.get("type") == "value_error" and "error" in error.get("ctx", {}):
        return str(error["ctx"]["error"])
    return str(error.get("msg"))


def _prompt_ids(prompt: str | list[int], tokenizer: Any) -> list[int]:
    if isinstance(prompt, list):
        return prompt
    if tokenizer is None:
        raise ApiError(400, "this model has no tokenizer: give the prompt as a list of token ids", "prompt")
    ids = list(tokenizer(prompt)["input_ids"])
    if not ids:
        raise ApiError(400, "the prompt is empty", "prompt")
    return ids


@dataclass(frozen=True)
class _Envelope:
    """The fields around a response's (or a chunk's) choices."""

    id: str
    model: str
    created: int
    kind: str

    def __call__(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {"id": self.id, "object": self.kind, "created": self.created, "model": self.model,
                "choices": choices, **extra}


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """OpenAI's usage: the prompt counted once, the tokens of every choice."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _token_text(tokenizer: Any, token: int) -> str:
    """A token's own text (a token ending inside a multi-byte character shows U+FFFD), or
    `token_id:<id>` without a tokenizer (vLLM's form)."""
    return tokenizer.decode([token]) if tokenizer is not None else f"token_id:{token}"


def _completion_logprobs(logprobs: list[TokenLogprob], tokenizer: Any, offset: int) -> tuple[dict[str, Any], int]:
    """/v1/completions' (legacy) logprobs of these tokens, their texts starting at character
    `offset` of the choice's text (the sum of the earlier tokens' texts), and the offset after
    them. `top_logprobs` holds the chosen token too (up to logprobs + 1 entries, as OpenAI's)."""
    tokens = [_token_text(tokenizer, lp.token) for lp in logprobs]
    offsets = [offset]
    for text in tokens:
        offsets.append(offsets[-1] + len(text))
    tops = [{**{_token_text(tokenizer, t): v for t, v in lp.top}, text: lp.logprob}
            for lp, text in zip(logprobs, tokens, strict=True)]
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in logprobs], "top_logprobs": tops,
            "text_offset": offsets[:-1]}, offsets[-1]


def _chat_logprobs(logprobs: list[TokenLogprob], tokenizer: Any) -> dict[str, Any]:
    """Chat's logprobs: `{"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}`."""
    def entry(token: int, logprob: float) -> dict[str, Any]:
        text = _token_text(tokenizer, token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {"content": [{**entry(lp.token, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
                        for lp in logprobs]}


def _finish(update: RequestUpdate) -> str | None:
    """The update's finish reason in OpenAI's words; an engine failure is raised."""
    if update.finish_reason == "error":
        error = update.error
        raise ApiError(500, f"the engine failed on this request: {type(error).__name__}: {error}", None,
                       "engine_error")
    return update.finish_reason


@dataclass
class _Choice:
    """One choice's whole output, gathered from its updates."""

    text: str = ""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None

    def add(self, update: RequestUpdate) -> None:
        self.text += update.text
        self.tokens += update.token_ids
        self.logprobs += update.logprobs
        if update.finish_reason:
            self.finish_reason = _finish(update)


async def _collect(ids: list[str], updates: asyncio.Queue[RequestUpdate], runner: EngineRunner,
                   http: Request) -> list[_Choice]:
    """The whole output of each choice of a non-streaming request. If the client goes away, or
    one choice fails, the others are aborted."""
    choices = {request_id: _Choice() for request_id in ids}
    running = set(ids)
    try:
        while running:
            try:
                update = await asyncio.wait_for(updates.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11 on
                if await http.is_disconnected():
                    raise ApiError(499, "the client closed the request") from None
                continue
            if update.finish_reason:
                running.discard(update.request_id)
            choices[update.request_id].add(update)
    finally:
        for request_id in running:
            runner.abort(request_id)
    return list(choices.values())


def _sse(ids: list[str], updates: asyncio.Queue[RequestUpdate], runner: EngineRunner, envelope: _Envelope,
         delta: Callable[[int, RequestUpdate], dict[str, Any]], opening: dict[str, Any] | None = None,
         usage_of: int | None = None) -> StreamingResponse:
    """Server-sent events: `opening` per choice first (chat's role), then one chunk per update
    (`delta` of the choice's index and the update), with `usage_of` (the prompt's length) a
    usage chunk with no choices, then `data: [DONE]`. A client that goes away cancels this
    generator, which aborts the choices not finished; so does one choice's failure."""
    index = {request_id: i for i, request_id in enumerate(ids)}

    async def events() -> AsyncIterator[str]:
        running, generated = set(ids), 0
        try:
            for i in range(len(ids) if opening is not None else 0):
                yield _event(envelope([{"index": i, **opening, "finish_reason": None}]))
            while running:
                update = await updates.get()
                try:
                    reason = _finish(update)
                except ApiError as e:  # the headers are sent: the error goes as an event (OpenAI's clients raise it)
                    yield _event({"error": {"message": e.message, "type": "server_error", "param": None,
                                            "code": e.code}})
                    return
                if reason is not None:
                    running.discard(update.request_id)
                generated += len(update.token_ids)
                i = index[update.request_id]
                yield _event(envelope([{"index": i, **delta(i, update), "finish_reason": reason}]))
            if usage_of is not None:
                yield _event(envelope([], usage=_usage(usage_of, generated)))
            yield "data: [DONE]\n\n"
        finally:
            for request_id in running:
                runner.abort(request_id)

    return StreamingResponse(events(), media_type="text/event-stream")


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"
