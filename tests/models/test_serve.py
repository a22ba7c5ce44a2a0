"""The OpenAI-compatible server (`ad_mlir/serve/`) on loopback, driven by the real `openai`
client: greedy outputs equal HF `generate` on each prompt alone while other requests run beside
them, streaming and not; a client that goes away mid-stream frees its slot; bad requests get
OpenAI-style errors; a soak of 200 requests with random cancellations ends with nothing lost
and nothing leaked; and `ad-mlir serve --model smollm2`, run as a user runs it, answers a chat.

The in-process server serves (kernels as their torch reference) a wide-init tiny Llama (HF's tokens vary) whose tokenizer maps
token t to the letter chr(97 + t % 26), so a completion's text says which tokens it holds."""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
import torch
import uvicorn
from fastapi import FastAPI
from test_engine import CharTokenizer
from test_generate import PROMPTS, _family_model, _hf_tokens

import ad_mlir
from ad_mlir.llm.engine import Engine
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.serve.app import build_app
from ad_mlir.serve.runner import EngineRunner

NEW = 6
MAX_SEQ = 48


class LetterTokenizer(CharTokenizer):
    """CharTokenizer, and text back to tokens: letter c is token ord(c) - 97."""

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) - 97 for c in text]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, seconds: float, processes: Sequence[subprocess.Popen] = (),
                  log: Path | None = None) -> None:
    """Wait until `url`'s /health answers ok; fail at once when one of `processes` (the server's)
    exits, with the end of `log`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        exited = [p.returncode for p in processes if p.poll() is not None]
        assert not exited, f"the server exited {exited}: {log.read_text()[-3000:] if log else ''}"
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if json.load(r) == {"status": "ok"}:
                    return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} not healthy after {seconds} s: {log.read_text()[-3000:] if log else ''}")


def _wait_for_metric(url: str, line: str, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while True:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
            if line in r.read().decode().splitlines():
                return
        assert time.monotonic() < deadline, f"no '{line}' in /metrics after {seconds} s"
        time.sleep(0.1)


class Served:
    def __init__(self, model: torch.nn.Module, runner: EngineRunner, url: str) -> None:
        self.model, self.runner, self.url = model, runner, url
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        self.hf = {tuple(p): _hf_tokens(model, p, NEW) for p in PROMPTS}

    def text(self, tokens: list[int]) -> str:
        return CharTokenizer().decode(tokens)

    def wait_idle(self, seconds: float = 20) -> None:
        deadline = time.monotonic() + seconds
        engine = self.runner.engine
        while time.monotonic() < deadline:
            if not self.runner.in_flight and not engine.has_work and len(engine.free_slots) == engine.llm.max_batch:
                return
            time.sleep(0.05)
        raise AssertionError(f"not idle: {self.runner.in_flight} in flight, {len(engine.running)} running, "
                             f"{len(engine.waiting)} waiting, free slots {engine.free_slots}")


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    model = _family_model("llama")
    llm = ad_mlir.LLM(model, max_batch=2, max_seq_len=MAX_SEQ)
    llm.tokenizer = LetterTokenizer()
    runner = EngineRunner(Engine(llm, max_step_tokens=8)).start()
    with _serving(build_app(runner, "llama", llm.tokenizer, default_max_tokens=NEW)) as url, reference_kernels():
        yield Served(model, runner, url)  # the engine's thread runs the kernels as their torch reference
    runner.stop()


@contextlib.contextmanager
def _serving(app: FastAPI) -> Iterator[str]:
    """`app` served by uvicorn on a free loopback port, in a thread; yields its URL."""
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    _wait_healthy(url, 30)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_concurrent_completions_equal_hf_streaming_or_not(served: Served) -> None:
    """Six requests (three prompts, streamed and not) at once over two slots."""
    def complete(prompt: list[int], stream: bool) -> tuple[str, str | None]:
        if not stream:
            r = served.client.completions.create(model="llama", prompt=prompt, max_tokens=NEW, temperature=0)
            assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == NEW
            return r.choices[0].text, r.choices[0].finish_reason
        chunks = list(served.client.completions.create(model="llama", prompt=prompt, max_tokens=NEW, temperature=0,
                                                       stream=True))
        return "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason

    jobs = [(p, stream) for p in PROMPTS for stream in (False, True)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(lambda job: complete(*job), jobs))
    for (prompt, _), (text, reason) in zip(jobs, results, strict=True):
        assert text == served.text(served.hf[tuple(prompt)])
        assert reason == "length"
    served.wait_idle()


def test_a_text_prompt_goes_through_the_tokenizer(served: Served) -> None:
    prompt = [5, 9, 13, 3, 7]
    r = served.client.completions.create(model="llama", prompt="fjndh", max_tokens=NEW, temperature=0)
    assert r.choices[0].text == served.text(_hf_tokens(served.model, prompt, NEW))


def test_a_client_that_goes_away_mid_stream_frees_its_slot(served: Served) -> None:
    stream = served.client.completions.create(model="llama", prompt=PROMPTS[1], max_tokens=MAX_SEQ - 3,
                                              temperature=0, stream=True)
    first = [next(iter(stream)) for _ in range(2)]
    assert all(c.choices[0].finish_reason is None for c in first)
    assert served.runner.in_flight == 1
    stream.close()
    served.wait_idle()
    assert served.runner.metrics.finished.labels("abort")._value.get() >= 1


def _post(url: str, body: object) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


@pytest.mark.parametrize("body, status, param, words", [
    ({"model": "llama"}, 400, "prompt", "Field required"),
    ({"model": "llama", "prompt": [5, 9], "max_tokens": "many"}, 400, "max_tokens", "valid integer"),
    ({"model": "llama", "prompt": [5, 9], "top_p": 0}, 400, "top_p", "greater than 0"),
    ({"model": "llama", "prompt": [], "max_tokens": 2}, 400, "prompt", "at least 1 item"),
    ({"model": "llama", "prompt": [1] * 40, "max_tokens": 9}, 400, "prompt", "needs 49 > max_seq_len=48"),
    ({"model": "gpt-4", "prompt": [5, 9]}, 404, "model", "does not exist"),
    ({"model": "llama", "prompt": [5, 9], "stop": [""]}, 400, "stop", "a stop string may not be empty"),
    ({"model": "llama", "prompt": [5, 1000000]}, 400, "prompt", "prompt token 1 is 1000000: token ids must be in "
                                                                "[0, 128)"),
    ({"model": "llama", "prompt": [-3, 5]}, 400, "prompt", "prompt token 0 is -3"),
])
def test_bad_completion_requests_get_openai_errors(served: Served, body: dict, status: int, param: str | None,
                                                   words: str) -> None:
    got, error = _post(f"{served.url}/v1/completions", body)
    assert got == status, error
    assert error["error"]["type"] == "invalid_request_error" and error["error"]["param"] == param
    assert words in error["error"]["message"], error
    assert (error["error"]["code"] == "context_length_exceeded") == ("max_seq_len" in words), error
    assert served.runner.in_flight == 0, "a refused request was queued"


def test_an_api_key_and_a_body_bound_when_asked_for(served: Served) -> None:
    app = build_app(served.runner, "llama", served.runner.engine.llm.tokenizer, api_key="sesame", max_body_bytes=200)
    with _serving(app) as url:
        body = {"model": "llama", "prompt": [5, 9], "max_tokens": 2, "temperature": 0}
        assert _post(f"{url}/v1/completions", body)[1]["error"]["code"] == "invalid_api_key"
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="sesame", max_retries=0)
        assert client.completions.create(**body).choices[0].finish_reason == "length"
        with pytest.raises(openai.APIStatusError, match="over 200 bytes") as raised:
            client.completions.create(**{**body, "prompt": [5] * 100})
        assert raised.value.status_code == 413
        with urllib.request.urlopen(f"{url}/health", timeout=10) as r:
            assert r.status == 200, "health needs no key"


def test_chat_without_a_chat_template_is_refused(served: Served) -> None:
    with pytest.raises(openai.BadRequestError, match="has no chat template"):
        served.client.chat.completions.create(model="llama", messages=[{"role": "user", "content": "hi"}])


def test_models_health_and_metrics(served: Served) -> None:
    assert [m.id for m in served.client.models.list().data] == ["llama"]
    served.client.completions.create(model="llama", prompt=PROMPTS[0], max_tokens=2, temperature=0)
    with urllib.request.urlopen(f"{served.url}/metrics", timeout=10) as r:
        text = r.read().decode()
    for metric in ("ad_mlir_requests_running", "ad_mlir_requests_waiting", "ad_mlir_cache_slots_in_use",
                   "ad_mlir_time_to_first_token_seconds_count", "ad_mlir_inter_token_latency_seconds_count",
                   "ad_mlir_generation_tokens_total", 'ad_mlir_requests_finished_total{reason="length"}'):
        assert metric in text, metric
    ttft = next(line for line in text.splitlines() if line.startswith("ad_mlir_time_to_first_token_seconds_count"))
    assert float(ttft.split()[-1]) >= 1


def test_a_soak_of_200_requests_with_cancellations_loses_and_leaks_nothing(served: Served) -> None:
    rng = random.Random(0)
    plan = [(rng.choice(PROMPTS), rng.random() < 0.25) for _ in range(200)]
    before = {r: served.runner.metrics.finished.labels(r)._value.get() for r in ("length", "abort", "stop")}

    def run(prompt: list[int], cancel: bool) -> str | None:
        stream = served.client.completions.create(model="llama", prompt=prompt, max_tokens=NEW, temperature=0,
                                                  stream=True)
        if cancel:
            next(iter(stream))
            stream.close()
            return None
        return "".join(c.choices[0].text for c in stream)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda job: run(*job), plan))
    for (prompt, cancel), text in zip(plan, results, strict=True):
        if not cancel:
            assert text == served.text(served.hf[tuple(prompt)])
    served.wait_idle()
    finished = {r: served.runner.metrics.finished.labels(r)._value.get() - before[r] for r in before}
    cancelled = sum(c for _, c in plan)
    # A cancelled stream whose request had already finished counts as finished, not aborted.
    assert finished["length"] + finished["abort"] == 200 and finished["length"] >= 200 - cancelled


ROOT = Path(__file__).resolve().parents[2]


def test_ad_mlir_serve_smollm2_answers_the_openai_client(tmp_path: Path) -> None:
    """As a user runs it: `ad-mlir serve --model smollm2` (the paged engine, its default), then a
    chat, non-streamed and streamed, greedy, with bad requests sent beside it: the answer is HF
    generate's on the chat template's tokens, each bad request a 400 naming its field, and at the
    end no page is held."""
    from ad_mlir.zoo.checkpoints import load_causal_lm

    port = _free_port()
    cmd = [str(Path(sys.executable).with_name("ad-mlir")), "serve", "--model", "smollm2", "--port", str(port),
           "--max-batch", "2", "--max-seq-len", "256"]
    # As a user runs it: without the suite's TRITON_INTERPRET, so the kernels run as their torch
    # reference on the CPU (the interpreter would take minutes for SmolLM2). Its output goes to a
    # file: a pipe nobody reads could fill and stall the server.
    log = (tmp_path / "server.log").open("w")
    process = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True,
                               env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"})
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, 300, [process], tmp_path / "server.log")
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        bad = [{"model": "smollm2", "prompt": [1, 2, 49152], "max_tokens": 4},  # SmolLM2's vocabulary: 49152
               {"model": "smollm2", "prompt": "hi", "max_tokens": 300},
               {"model": "smollm2", "prompt": "hi", "temperature": -1}]
        with ThreadPoolExecutor(4) as pool:
            refused = pool.map(lambda body: _post(f"{url}/v1/completions", body), bad)
            answer = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=12, temperature=0)
            streamed = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=12,
                                                      temperature=0, stream=True)
            streamed_text = "".join(c.choices[0].delta.content or "" for c in streamed)
            refused = list(refused)
        assert [(status, e["error"]["param"]) for status, e in refused] == [(400, "prompt"), (400, "prompt"),
                                                                             (400, "temperature")], refused
        assert "prompt token 2 is 49152" in refused[0][1]["error"]["message"]
        _wait_for_metric(url, "ad_mlir_cache_pages_in_use 0.0")  # the gauges follow a step's last update
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()
    model, tokenizer = load_causal_lm("smollm2")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
    expected = tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)
    assert "Paris" in expected, expected
    assert answer.choices[0].message.content == expected
    assert streamed_text == expected
