"""The OpenAI fields people send (issue 39, item 2), over HTTP with the real `openai` client on
loopback: `n`, `logprobs` (both endpoints' formats; values against HF's log-softmax), penalties and
`logit_bias` (against a reference sampler), `stop` lists, `max_completion_tokens`,
`stream_options`, `response_format` (a JSON schema or object, through llguidance), and the fields
refused (a 400 naming them) or taken and ignored.

Two servers, kernels as their torch reference: `ids`, the paged engine (`ad-mlir serve`'s default)
over a wide-init tiny Llama without a tokenizer (prompts and outputs as token ids, logprobs naming
tokens `token_id:<id>`, so each value is checked against its exact token); `smol`, the slot
engine over a wide-init tiny Llama with SmolLM2's tokenizer and vocabulary (49152 tokens: a chat
template, text, stop strings, structured output). With random weights a greedy answer is
garbage unless the grammar's mask forces it, which is what the structured tests rely on."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import openai
import pytest
import torch
from test_generate import PROMPTS, WIDE, _family_model, _hf_tokens
from test_serve import _post, _serving

import ad_mlir
from ad_mlir.llm.engine import Engine, PagedEngine, SamplingParams
from ad_mlir.llm.structured import GrammarMatcher, Grammars, canonical_schema
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.serve.app import ChatRequest, CompletionRequest, build_app
from ad_mlir.serve.runner import EngineRunner
from ad_mlir.zoo.tiny import TinyConfig, build_model

NEW = 6
PAGE = 4
LOGPROB_ATOL = 1e-4
"""fp32 throughout: the compiled model's logits differ from HF's only by reordered sums, at most
~5e-5 on logits up to ~20 (`_assert_logits_close` in test_generate.py), and a log-softmax moves
by about twice a logit's error (measured: 1.3e-5). A log-probability of another step or another
token is off by order 1."""

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "ok": {"type": "boolean"},
    "color": {"enum": ["red", "green", "blue"]}},
    "required": ["name", "age", "ok", "color"], "additionalProperties": False}


def _check_person(value: Any) -> None:
    """`value` validates against PERSON (jsonschema is not installed: by hand)."""
    assert isinstance(value, dict) and list(value) == ["name", "age", "ok", "color"], value
    assert isinstance(value["name"], str) and len(value["name"]) <= 8, value
    assert type(value["age"]) is int and 0 <= value["age"] <= 120, value
    assert type(value["ok"]) is bool and value["color"] in ("red", "green", "blue"), value


def _hf_logprobs(model: torch.nn.Module, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """log_softmax in fp32 of HF's logits at each of `tokens`' steps [len(tokens), vocab]: one
    forward of the whole sequence, no cache."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens[:-1]])).logits[0, len(prompt) - 1:]
    return torch.log_softmax(logits.float(), dim=-1)


def _close(got: float, expected: torch.Tensor | float) -> bool:
    return abs(got - float(expected)) <= LOGPROB_ATOL


@dataclass
class Served:
    model: torch.nn.Module
    runner: EngineRunner
    url: str
    tokenizer: Any = None

    @property
    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                       return_dict=False))

    def wait_idle(self, seconds: float = 30) -> None:
        """Nothing in flight, nothing in the engine, every page or slot back."""
        engine = self.runner.engine
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            held = engine.pages_in_use if isinstance(engine, PagedEngine) else \
                engine.llm.max_batch - len(engine.free_slots)
            if not self.runner.in_flight and not engine.has_work and held == 0:
                return
            time.sleep(0.05)
        raise AssertionError(f"not idle: {self.runner.in_flight} in flight, {len(engine.running)} running")


@pytest.fixture(scope="module")
def ids() -> Iterator[Served]:
    model = _family_model("llama")
    llm = ad_mlir.LLM(model, max_batch=4, max_seq_len=48, page_size=PAGE)
    assert llm.tokenizer is None
    runner = EngineRunner(PagedEngine(llm, max_step_tokens=16)).start()
    with _serving(build_app(runner, "llama", None, default_max_tokens=NEW)) as url, reference_kernels():
        yield Served(model, runner, url)  # the engine's thread runs the kernels as their torch reference
    runner.stop()


@pytest.fixture(scope="module")
def smol_parts() -> tuple[torch.nn.Module, Any]:
    """A wide-init tiny Llama with SmolLM2's vocabulary, and SmolLM2's tokenizer."""
    from ad_mlir.zoo.checkpoints import load_causal_lm

    _, tokenizer = load_causal_lm("smollm2")
    return build_model(TinyConfig(family="llama", vocab_size=len(tokenizer), hf_overrides=WIDE)), tokenizer


@pytest.fixture(scope="module")
def smol(smol_parts: tuple[torch.nn.Module, Any]) -> Iterator[Served]:
    model, tokenizer = smol_parts
    llm = ad_mlir.LLM(model, max_batch=2, max_seq_len=128)
    llm.tokenizer = tokenizer
    runner = EngineRunner(Engine(llm, max_step_tokens=64)).start()
    with _serving(build_app(runner, "smol", tokenizer, default_max_tokens=NEW)) as url, reference_kernels():
        yield Served(model, runner, url, tokenizer)
    runner.stop()


# -- n -----------------------------------------------------------------------------------


def test_n_greedy_choices_are_each_hfs_and_usage_sums_them(ids: Served) -> None:
    prompt = PROMPTS[0]
    r = ids.client.completions.create(model="llama", prompt=prompt, max_tokens=NEW, temperature=0, n=3)
    hf = _hf_tokens(ids.model, prompt, NEW)
    assert [(c.index, c.token_ids, c.finish_reason) for c in r.choices] == [(i, hf, "length") for i in range(3)]
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(prompt), 3 * NEW)
    ids.wait_idle()


def test_n_seeded_choices_are_each_the_sample_of_their_own_seed(ids: Served) -> None:
    """Choice i is sampled with seed + i: the request alone with that seed gives it again, and
    the choices differ (each its own sample)."""
    body = {"model": "llama", "prompt": PROMPTS[2], "max_tokens": NEW, "temperature": 3.0, "seed": 11}
    three = [c.token_ids for c in ids.client.completions.create(**body, n=3).choices]
    alone = [ids.client.completions.create(**{**body, "seed": 11 + i}).choices[0].token_ids for i in range(3)]
    assert three == alone
    assert len({tuple(t) for t in three}) == 3, three
    ids.wait_idle()


def test_n_choices_share_the_prompts_pages(ids: Served) -> None:
    """A prompt of two full pages and a token: the choices after the first enter once the first
    has prefilled and each finds both pages cached (8 tokens each)."""
    prompt = [100 + i for i in range(2 * PAGE + 1)]
    engine = ids.runner.engine
    hits, queries = engine.prefix_hits, engine.prefix_queries
    r = ids.client.completions.create(model="llama", prompt=prompt, max_tokens=NEW, temperature=0, n=3)
    assert [c.token_ids for c in r.choices] == [_hf_tokens(ids.model, prompt, NEW)] * 3
    assert (engine.prefix_hits - hits, engine.prefix_queries - queries) == (2 * 2 * PAGE, 3 * len(prompt))
    ids.wait_idle()


def test_a_held_choice_aborted_before_it_enters_ends_with_abort() -> None:
    """The runner holds choice 1 until choice 0 has a token; aborting it meanwhile ends it
    there (nothing leaks), and choice 0 runs on."""
    engine = _HeldEngine()
    runner = EngineRunner(engine)

    async def run() -> list[tuple[str, str | None]]:
        ids, updates = runner.submit_choices([1] * 9, [SamplingParams(max_tokens=2)] * 2)
        runner._run_commands()  # the engine thread's part, in this thread: choice 0 added, choice 1 held
        assert engine.added == [ids[0]]
        runner.abort(ids[1])
        runner._run_commands()
        got = [await updates.get()]
        assert not runner._after_first[ids[0]] and runner.in_flight == 1
        return [(u.request_id, u.finish_reason) for u in got]

    assert asyncio.run(run()) == [("cmpl-0-1", "abort")]


class _HeldEngine(PagedEngine):
    """A paged engine whose model is never called (the test stops before a step)."""

    def __init__(self) -> None:
        super().__init__(SimpleNamespace(page_size=4, num_pages=8, max_seq_len=32, vocab_size=16, num_state_slots=0,
                                         eos=set(), tokenizer=None))
        self.added: list[str] = []

    def add(self, prompt: list[int], params: SamplingParams, request_id: str | None = None) -> Any:
        self.added.append(request_id)
        return super().add(prompt, params, request_id)


# -- logprobs ------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.0, 3.0])
def test_completion_logprobs_are_hfs_log_softmax_of_the_raw_logits(ids: Served, temperature: float) -> None:
    """The legacy format: `tokens`, `token_logprobs`, `top_logprobs` (the 3 most likely and the
    chosen one), `text_offset`; the values HF's, of the logits before temperature (sampled at
    3.0, the chosen tokens' log-probabilities are still those of temperature 1)."""
    prompt = PROMPTS[2]
    r = ids.client.completions.create(model="llama", prompt=prompt, max_tokens=NEW, temperature=temperature,
                                      seed=3, logprobs=3)
    tokens, lp = r.choices[0].token_ids, r.choices[0].logprobs
    if temperature == 0:
        assert tokens == _hf_tokens(ids.model, prompt, NEW)
    expected = _hf_logprobs(ids.model, prompt, tokens)
    assert lp.tokens == [f"token_id:{t}" for t in tokens]
    assert all(_close(got, expected[j, t]) for j, (got, t) in enumerate(zip(lp.token_logprobs, tokens, strict=True)))
    for j, top in enumerate(lp.top_logprobs):
        values, best = expected[j].topk(3)
        want = dict(zip(best.tolist(), values.tolist(), strict=True)) | {tokens[j]: expected[j, tokens[j]].item()}
        assert top.keys() == {f"token_id:{t}" for t in want}
        assert all(_close(top[f"token_id:{t}"], v) for t, v in want.items())
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:j]) for j in range(len(tokens))]
    ids.wait_idle()


def test_n_streamed_with_logprobs_and_a_usage_chunk(ids: Served) -> None:
    prompt = PROMPTS[1]
    hf = _hf_tokens(ids.model, prompt, NEW)
    chunks = list(ids.client.completions.create(model="llama", prompt=prompt, max_tokens=NEW, temperature=0, n=2,
                                                logprobs=0, stream=True, stream_options={"include_usage": True}))
    *body, last = chunks
    assert last.choices == [] and (last.usage.prompt_tokens, last.usage.completion_tokens) == (len(prompt), 2 * NEW)
    assert all(c.usage is None and len(c.choices) == 1 for c in body)
    expected = _hf_logprobs(ids.model, prompt, hf)
    for i in range(2):
        mine = [c.choices[0] for c in body if c.choices[0].index == i]
        assert [t for c in mine for t in c.token_ids] == hf and mine[-1].finish_reason == "length"
        logprobs = [v for c in mine for v in c.logprobs.token_logprobs]
        assert all(_close(v, expected[j, hf[j]]) for j, v in enumerate(logprobs))
        assert [d for c in mine for d in c.logprobs.top_logprobs] == \
            [{f"token_id:{t}": v} for t, v in zip(hf, logprobs, strict=True)]
    ids.wait_idle()


def test_chat_logprobs_are_hfs_and_max_completion_tokens_bounds_the_answer(smol: Served) -> None:
    """`logprobs: true, top_logprobs: 2`: each token's text, bytes and HF's log-probability, its
    two most likely alternatives'; streamed the same. `max_completion_tokens` wins over
    `max_tokens`."""
    messages = [{"role": "user", "content": "Name a colour."}]
    prompt = smol.chat_ids(messages)
    hf = _hf_tokens(smol.model, prompt, 4)
    body = {"model": "smol", "messages": messages, "temperature": 0, "max_tokens": 9, "max_completion_tokens": 4,
            "logprobs": True, "top_logprobs": 2}
    r = smol.client.chat.completions.create(**body)
    assert (r.usage.completion_tokens, r.choices[0].finish_reason) == (4, "length")
    content = r.choices[0].logprobs.content
    decode = smol.tokenizer.decode
    assert [c.token for c in content] == [decode([t]) for t in hf]
    expected = _hf_logprobs(smol.model, prompt, hf)
    for j, c in enumerate(content):
        values, best = expected[j].topk(2)
        assert _close(c.logprob, expected[j, hf[j]]) and c.bytes == list(c.token.encode())
        assert [e.token for e in c.top_logprobs] == [decode([t]) for t in best.tolist()]
        assert all(_close(e.logprob, v) and e.bytes == list(e.token.encode())
                   for e, v in zip(c.top_logprobs, values.tolist(), strict=True))
    chunks = list(smol.client.chat.completions.create(**body, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].logprobs is None
    streamed = [c for chunk in chunks[1:] for c in chunk.choices[0].logprobs.content]
    assert streamed == content
    smol.wait_idle()


# -- penalties and bias -----------------------------------------------------------------------


def _reference_greedy(model: torch.nn.Module, prompt: list[int], n: int, bias: dict[int, float],
                      frequency: float, presence: float) -> list[int]:
    """Greedy tokens from HF's logits with the bias added and, per token generated so far,
    frequency * its count + presence taken off."""
    tokens: list[int] = []
    for _ in range(n):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + tokens])).logits[0, -1].float()
        for t, b in bias.items():
            logits[t] += b
        for t in set(tokens):
            logits[t] -= frequency * tokens.count(t) + presence
        tokens.append(int(logits.argmax()))
    return tokens


def test_penalties_and_logit_bias_choose_as_the_reference_does(ids: Served) -> None:
    prompt, n = PROMPTS[0], 16
    plain = _hf_tokens(ids.model, prompt, n)
    bias = {plain[0]: -100, plain[3]: 6}
    r = ids.client.completions.create(model="llama", prompt=prompt, max_tokens=n, temperature=0, logit_bias=bias,
                                      frequency_penalty=1.5, presence_penalty=2.0)
    expected = _reference_greedy(ids.model, prompt, n, bias, 1.5, 2.0)
    assert r.choices[0].token_ids == expected
    assert expected != _reference_greedy(ids.model, prompt, n, bias, 0, 0) != plain, "the test shows nothing"
    ids.wait_idle()


# -- stop, stream_options ---------------------------------------------------------------------


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_list_ends_the_text_before_the_first_one_found(smol: Served, chat: bool, stream: bool) -> None:
    messages = [{"role": "user", "content": "Tell me a story."}]
    text = "Once upon a time"
    prompt = smol.chat_ids(messages) if chat else smol.tokenizer(text)["input_ids"]
    full = smol.tokenizer.decode(_hf_tokens(smol.model, prompt, 12), skip_special_tokens=True)
    stop = full[6:9]
    body: dict[str, Any] = {"model": "smol", "max_tokens": 12, "temperature": 0, "stop": ["never said", stop],
                            "stream": stream}
    if chat:
        r = smol.client.chat.completions.create(messages=messages, **body)
        parts = [(c.choices[0].delta.content or "", c.choices[0].finish_reason) for c in r] if stream else \
            [(r.choices[0].message.content, r.choices[0].finish_reason)]
    else:
        r = smol.client.completions.create(prompt=text, **body)
        parts = [(c.choices[0].text, c.choices[0].finish_reason) for c in (r if stream else [r])]
    assert "".join(p for p, _ in parts) == full[:full.find(stop)] and parts[-1][1] == "stop", (full, stop)
    smol.wait_idle()


def test_a_streamed_chat_with_n_and_include_usage(smol: Served) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    prompt = smol.chat_ids(messages)
    chunks = list(smol.client.chat.completions.create(model="smol", messages=messages, temperature=0, max_tokens=3,
                                                      n=2, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == len(prompt)
    assert chunks[-1].usage.completion_tokens == 6
    expected = smol.tokenizer.decode(_hf_tokens(smol.model, prompt, 3), skip_special_tokens=True)
    for i in range(2):
        mine = [c.choices[0] for c in chunks[:-1] if c.choices[0].index == i]
        assert mine[0].delta.role == "assistant" and "".join(c.delta.content or "" for c in mine) == expected
    smol.wait_idle()


# -- response_format ----------------------------------------------------------------------------


def test_a_json_schema_answer_parses_and_validates(smol: Served) -> None:
    """Greedy on random weights: the same request without the schema is not JSON; with it the
    answer is PERSON's, finished by its grammar ("stop"), streamed the same; sampled choices
    are each valid."""
    messages = [{"role": "user", "content": "Describe a person as JSON."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    body: dict[str, Any] = {"model": "smol", "messages": messages, "temperature": 0, "max_tokens": 64}
    free = smol.client.chat.completions.create(**body).choices[0].message.content
    with pytest.raises(ValueError):
        json.loads(free)
    r = smol.client.chat.completions.create(**body, response_format=fmt)
    answer = r.choices[0].message.content
    _check_person(json.loads(answer))
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens < 64
    streamed = smol.client.chat.completions.create(**body, response_format=fmt, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == answer
    sampled = smol.client.chat.completions.create(**{**body, "temperature": 1.0}, response_format=fmt, n=2, seed=4)
    for choice in sampled.choices:
        _check_person(json.loads(choice.message.content))
    smol.wait_idle()


def test_a_json_object_answer_is_an_object(smol: Served) -> None:
    """With a logit bias towards closing quotes and braces (random weights would write one key
    until max_tokens, measured): the bias and the mask compose, and the answer is an object."""
    closing = {smol.tokenizer.convert_tokens_to_ids(t): 30 for t in ('"', "}", '"}')}
    r = smol.client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "A JSON object"}],
                                            temperature=0, max_tokens=80, response_format={"type": "json_object"},
                                            logit_bias=closing)
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    smol.wait_idle()


def test_a_schema_that_does_not_compile_is_a_400(smol: Served) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "nonsense"}}}
    status, error = _post(f"{smol.url}/v1/chat/completions", {"model": "smol", "response_format": fmt,
                                                               "messages": [{"role": "user", "content": "x"}]})
    assert (status, error["error"]["param"]) == (400, "response_format"), error
    assert "nonsense" in error["error"]["message"] and smol.runner.in_flight == 0


# -- refused and ignored fields -------------------------------------------------------------------


CHAT = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize("route, fields, param, words", [
    ("completions", {"echo": True}, "echo", "the prompt is not echoed back"),
    ("completions", {"suffix": "end"}, "suffix", "text after the insertion point"),
    ("completions", {"best_of": 3}, "best_of", "best_of may only equal n"),
    ("completions", {"logprobs": 21}, "logprobs", "less than or equal to 20"),
    ("completions", {"logit_bias": {"128": 1}}, "logit_bias", "logit_bias token 0 is 128"),
    ("completions", {"logit_bias": {"5": 101}}, "logit_bias.5", "less than or equal to 100"),
    ("completions", {"frequency_penalty": -2.5}, "frequency_penalty", "greater than or equal to -2"),
    ("completions", {"stream_options": {"include_usage": True}}, "stream_options", "only allowed with stream"),
    ("completions", {"n": 0}, "n", "greater than or equal to 1"),
    ("completions", {"min_tokens": 2}, "min_tokens", "not a field this server takes"),
    ("completions", {"response_format": {"type": "json_schema"}}, "response_format", '"type": "json_schema"'),
    ("completions", {"response_format": {"type": "json_object"}}, "response_format", "needs the model's tokenizer"),
    ("chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "tool calling"),
    ("chat/completions", {"tool_choice": "required"}, "tool_choice", "tool calling"),
    ("chat/completions", {"functions": [{"name": "f"}]}, "functions", "function calling"),
    ("chat/completions", {"function_call": {"name": "f"}}, "function_call", "function calling"),
    ("chat/completions", {"audio": {"voice": "alloy", "format": "wav"}}, "audio", "audio output"),
    ("chat/completions", {"modalities": ["text", "audio"]}, "modalities", "only text output"),
    ("chat/completions", {"reasoning_effort": "low"}, "reasoning_effort", "no reasoning controls"),
    ("chat/completions", {"verbosity": "low"}, "verbosity", "no verbosity control"),
    ("chat/completions", {"web_search_options": {"search_context_size": "low"}}, "web_search_options", "web search"),
    ("chat/completions", {"top_logprobs": 2}, "top_logprobs", "needs logprobs: true"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x", "name": "me"}]}, "messages.0.name",
     "not a field this server takes"),
])
def test_a_field_we_do_not_do_is_a_400_naming_it(ids: Served, route: str, fields: dict, param: str,
                                                  words: str) -> None:
    body = {"model": "llama", **({"prompt": [5, 9]} if route == "completions" else {"messages": CHAT}), **fields}
    status, error = _post(f"{ids.url}/v1/{route}", body)
    assert (status, error["error"]["param"], error["error"]["type"]) == (400, param, "invalid_request_error"), error
    assert words in error["error"]["message"], error
    assert ids.runner.in_flight == 0, "a refused request was queued"


def test_our_own_checks_words_are_the_message_as_they_are(ids: Served) -> None:
    """A check of this server's own (a validator raising ValueError) is the message word for
    word after the field's name, without pydantic's "Value error, " before it."""
    status, error = _post(f"{ids.url}/v1/completions", {"model": "llama", "prompt": [5, 9],
                                                         "stream_options": {"include_usage": True}})
    assert status == 400 and error["error"]["message"] == \
        "stream_options: stream_options is only allowed with stream: true", error


def test_fields_that_change_nothing_are_taken_and_ignored(ids: Served, smol: Served) -> None:
    prompt = PROMPTS[0]
    r = ids.client.completions.create(model="llama", prompt=prompt, max_tokens=NEW, temperature=0, user="u",
                                      best_of=2, n=2, echo=False, suffix=None)
    assert [c.token_ids for c in r.choices] == [_hf_tokens(ids.model, prompt, NEW)] * 2
    messages = [{"role": "user", "content": "Hi"}]
    body: dict[str, Any] = {"model": "smol", "messages": messages, "temperature": 0, "max_tokens": 3}
    ignored = {"user": "u", "metadata": {"k": "v"}, "store": False, "service_tier": "auto",
               "parallel_tool_calls": True, "prompt_cache_key": "k", "safety_identifier": "s",
               "prediction": {"type": "content", "content": "x"}, "tool_choice": "none", "modalities": ["text"]}
    plain = smol.client.chat.completions.create(**body).choices[0].message.content
    assert smol.client.chat.completions.create(**body, **ignored).choices[0].message.content == plain
    ids.wait_idle()
    smol.wait_idle()


def test_null_means_the_default(ids: Served) -> None:
    nulls = dict.fromkeys(("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "stream_options",
                           "n", "presence_penalty", "frequency_penalty", "logit_bias", "response_format", "user",
                           "logprobs", "best_of", "echo", "suffix"))
    status, body = _post(f"{ids.url}/v1/completions", {"model": "llama", "prompt": PROMPTS[1], **nulls})
    assert status == 200 and len(body["choices"]) == 1 and len(body["choices"][0]["token_ids"]) == NEW, body
    ids.wait_idle()


def test_the_docs_table_lists_every_field_the_server_takes() -> None:
    """docs/serving.md's table names each field of both request models (none undocumented)."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "serving.md").read_text()
    table = page.split("## OpenAI fields", 1)[1].split("\n\n**", 1)[0]
    documented = {name for row in table.splitlines() if row.startswith("| `")
                  for name in re.findall(r"`(\w+)`", row.split("|")[1])}
    fields = {f.alias or name for model in (CompletionRequest, ChatRequest) for name, f in model.model_fields.items()}
    assert fields == documented


# -- the engine's side of structured output --------------------------------------------------------


@pytest.fixture(scope="module")
def smol_paged(smol_parts: tuple[torch.nn.Module, Any]) -> ad_mlir.LLM:
    model, tokenizer = smol_parts
    llm = ad_mlir.LLM(model, max_batch=4, max_seq_len=128, page_size=16)
    llm.tokenizer = tokenizer
    return llm


def _run(engine: PagedEngine) -> None:
    with reference_kernels():
        while engine.has_work:
            engine.step()
    assert engine.pages_in_use == 0


def test_every_token_of_a_structured_request_is_one_its_grammar_allowed(
        smol_paged: ad_mlir.LLM, smol_parts: tuple[torch.nn.Module, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Three sampled requests with one schema beside a plain one, on the paged engine: replayed
    through a fresh matcher, every token was allowed when it was chosen and the last completes
    the grammar; the schema compiled once; the plain request gets HF's tokens."""
    compiled = []
    compile_schema = Grammars._compile
    monkeypatch.setattr(Grammars, "_compile", lambda self, s: compiled.append(s) or compile_schema(self, s))
    engine = PagedEngine(smol_paged)
    schema = canonical_schema(PERSON)
    prompt = smol_paged.tokenizer("A person:")["input_ids"]
    structured = [engine.add(prompt, SamplingParams(max_tokens=64, temperature=1.5, seed=s, json_schema=schema))
                  for s in range(3)]
    plain = engine.add(prompt, SamplingParams(max_tokens=8, ignore_eos=True))
    _run(engine)
    assert compiled == [schema]
    for request in structured:
        assert request.output.finish_reason == "stop"
        _check_person(json.loads(request.text))
        replay = engine.grammars.matcher(schema)
        done = [_allowed_then_advance(replay, t, smol_paged.vocab_size) for t in request.output.token_ids]
        assert done == [False] * (len(done) - 1) + [True]
    assert plain.output.token_ids == _hf_tokens(smol_parts[0], prompt, 8)


def _allowed_then_advance(matcher: GrammarMatcher, token: int, vocab: int) -> bool:
    assert matcher.allowed(vocab)[token], f"token {token} was not allowed"
    return matcher.advance(token)


def test_a_grammar_failure_ends_its_request_alone(smol_paged: ad_mlir.LLM, smol_parts: tuple[torch.nn.Module, Any],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: GrammarMatcher, token: int) -> bool:
        raise RuntimeError(f"the grammar refused token {token}")

    monkeypatch.setattr(GrammarMatcher, "advance", refuse)
    engine = PagedEngine(smol_paged)
    prompt = smol_paged.tokenizer("A person:")["input_ids"]
    broken = engine.add(prompt, SamplingParams(max_tokens=8, json_schema=canonical_schema(PERSON)))
    plain = engine.add(prompt, SamplingParams(max_tokens=8, ignore_eos=True))
    _run(engine)
    assert broken.output.finish_reason == "error"
    assert plain.output.token_ids == _hf_tokens(smol_parts[0], prompt, 8)


def test_grammars_are_kept_least_recently_used_first_out(smol_parts: tuple[torch.nn.Module, Any]) -> None:
    tokenizer = smol_parts[1]
    grammars = Grammars(SimpleNamespace(tokenizer=tokenizer, vocab_size=len(tokenizer)), max_grammars=2)
    schemas = [canonical_schema({"type": "integer", "maximum": m}) for m in (1, 2, 3)]
    for schema in (schemas[0], schemas[1], schemas[0], schemas[2]):
        grammars.matcher(schema)
    assert list(grammars._compiled) == [schemas[0], schemas[2]]
