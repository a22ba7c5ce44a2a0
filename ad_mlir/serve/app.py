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
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from ad_mlir.llm.engine import ContextTooLong, RequestError, RequestUpdate, SamplingParams
from ad_mlir.serve.runner import EngineRunner

DISCONNECT_POLL_S = 0.5
"""How often a non-streaming request checks that its client is still there."""
MAX_BODY_BYTES = 1 << 20
"""The largest request body read (a prompt longer than any cache slot fits in far less)."""


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI fields we do not use (user, logit_bias, ...)

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    n: Literal[1] = 1

    def params(self, max_tokens: int) -> SamplingParams:
        """The sampling parameters, with `max_tokens` where the request gives none."""
        stop = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return SamplingParams(max_tokens=self.max_tokens or max_tokens, temperature=self.temperature,
                              top_p=self.top_p, top_k=self.top_k, seed=self.seed, stop=tuple(stop))


class CompletionRequest(_Sampling):
    prompt: str | list[int] = Field(min_length=1)


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


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
        return _error(400, f"{where}: {first.get('msg')}" if where else str(first.get("msg")), where or None,
                      "invalid_request")

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

    def submit(prompt: list[int], body: _Sampling) -> tuple[str, asyncio.Queue[RequestUpdate]]:
        # no max_tokens: the default, capped by the room after the prompt (at least 1, so that a
        # prompt leaving none is refused by the engine, saying so)
        max_tokens = max(min(default_max_tokens, runner.engine.max_new_tokens(len(prompt))), 1)
        try:
            return runner.submit(prompt, body.params(max_tokens))
        except RequestError as e:  # the engine's checks, and values pydantic's bounds let through (an empty stop)
            code = "context_length_exceeded" if isinstance(e, ContextTooLong) else "invalid_request"
            raise ApiError(400, str(e), e.param, code) from None

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, http: Request) -> Any:
        check_model(body)
        prompt = _prompt_ids(body.prompt, tokenizer)
        request_id, updates = submit(prompt, body)
        chunk = _completion_chunk(request_id, model_name, created)
        if body.stream:
            return _sse(request_id, updates, runner, chunk)
        text, tokens, reason = await _collect(request_id, updates, runner, http)
        return {**chunk("text_completion", {"text": text, "finish_reason": reason, "logprobs": None,
                                            **({} if tokenizer else {"token_ids": tokens})}),
                "usage": _usage(len(prompt), len(tokens))}

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, http: Request) -> Any:
        check_model(body)
        if tokenizer is None or getattr(tokenizer, "chat_template", None) is None:
            raise ApiError(400, f"the model '{model_name}' has no chat template: use /v1/completions", "messages")
        prompt = list(tokenizer.apply_chat_template([m.model_dump() for m in body.messages],
                                                    add_generation_prompt=True, tokenize=True, return_dict=False))
        if body.max_completion_tokens is not None:
            body.max_tokens = body.max_completion_tokens
        request_id, updates = submit(prompt, body)
        chunk = _completion_chunk(request_id, model_name, created)
        if body.stream:
            return _sse(request_id, updates, runner, chunk, chat=True)
        text, tokens, reason = await _collect(request_id, updates, runner, http)
        return {**chunk("chat.completion", {"message": {"role": "assistant", "content": text},
                                            "finish_reason": reason, "logprobs": None}),
                "usage": _usage(len(prompt), len(tokens))}

    return app


def _prompt_ids(prompt: str | list[int], tokenizer: Any) -> list[int]:
    if isinstance(prompt, list):
        return prompt
    if tokenizer is None:
        raise ApiError(400, "this model has no tokenizer: give the prompt as a list of token ids", "prompt")
    ids = list(tokenizer(prompt)["input_ids"])
    if not ids:
        raise ApiError(400, "the prompt is empty", "prompt")
    return ids


def _completion_chunk(request_id: str, model: str, created: int):  # noqa: ANN202 (a small closure)
    def chunk(kind: str, choice: dict[str, Any]) -> dict[str, Any]:
        return {"id": request_id, "object": kind, "created": created, "model": model,
                "choices": [{"index": 0, **choice}]}
    return chunk


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _finish(update: RequestUpdate) -> str | None:
    """The update's finish reason in OpenAI's words; an engine failure is raised."""
    if update.finish_reason == "error":
        error = update.error
        raise ApiError(500, f"the engine failed on this request: {type(error).__name__}: {error}", None,
                       "engine_error")
    return update.finish_reason


async def _collect(request_id: str, updates: asyncio.Queue[RequestUpdate], runner: EngineRunner,
                   http: Request) -> tuple[str, list[int], str | None]:
    """The whole output of a non-streaming request; it is aborted if the client goes away."""
    text, tokens = [], []
    while True:
        try:
            update = await asyncio.wait_for(updates.get(), DISCONNECT_POLL_S)
        except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11 on
            if await http.is_disconnected():
                runner.abort(request_id)
                raise ApiError(499, "the client closed the request") from None
            continue
        text.append(update.text)
        tokens += update.token_ids
        if update.finish_reason:
            return "".join(text), tokens, _finish(update)


def _sse(request_id: str, updates: asyncio.Queue[RequestUpdate], runner: EngineRunner, chunk: Any,
         chat: bool = False) -> StreamingResponse:
    """Server-sent events: one chunk per update, then `data: [DONE]`. A client that goes away
    cancels this generator, which aborts the request."""
    kind = "chat.completion.chunk" if chat else "text_completion"

    async def events() -> AsyncIterator[str]:
        finished = False
        try:
            if chat:
                yield _event(chunk(kind, {"delta": {"role": "assistant", "content": ""}, "finish_reason": None}))
            while not finished:
                update = await updates.get()
                try:
                    reason = _finish(update)
                except ApiError as e:  # the headers are sent: the error goes as an event (OpenAI's clients raise it)
                    finished = True
                    yield _event({"error": {"message": e.message, "type": "server_error", "param": None,
                                            "code": e.code}})
                    return
                finished = reason is not None
                body = {"delta": {"content": update.text}} if chat else {"text": update.text, "logprobs": None}
                yield _event(chunk(kind, {**body, "finish_reason": reason}))
            yield "data: [DONE]\n\n"
        finally:
            if not finished:
                runner.abort(request_id)

    return StreamingResponse(events(), media_type="text/event-stream")


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"
