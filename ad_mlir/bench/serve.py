"""ad-bench's serve part: `ad-mlir serve` against `transformers serve --continuous-batching` on
the same checkpoint, machine and load, one server at a time.

The checkpoint is the packaged SmolLM2-135M-Instruct (else its shape with random weights),
written once as a checkpoint directory that both servers load in fp32 on the CPU (bf16 on
CUDA). A fixed set of chat prompts is sent by N concurrent clients (the `openai` client,
streaming, greedy, `max_tokens` each); per concurrency: output tokens/s over the whole load,
time to first token and inter-token latency (a request's (last chunk - first chunk) / (tokens -
1)), p50 and p99 over requests. Output tokens are counted by re-tokenizing each answer with the
checkpoint's tokenizer, the same count for both servers.

Also offline throughput: `LLM.generate` against transformers' `generate_batch` (its continuous
batching on a paged cache) on the same prompts, batch 1, 8 and 32."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

QUESTIONS = (
    "What is the capital of France?", "Name three primary colors.", "How many legs does a spider have?",
    "Write a haiku about the sea.", "What is 12 times 12?", "Why is the sky blue?",
    "Give me a synonym for happy.", "What does a compiler do?", "Name a planet with rings.",
    "How do plants make food?", "What is the boiling point of water?", "Tell me a fun fact about cats.",
    "What language is spoken in Brazil?", "Explain gravity in one sentence.", "What is a prime number?",
    "Suggest a name for a dog.",
)
"""The chat prompts, sent in this order, round robin over the clients."""


def checkpoint_dir(root: Path, quick: bool) -> tuple[Path, str]:
    """SmolLM2 (or its shape: 4 layers with --quick) saved as a checkpoint directory both
    servers load, with the packaged tokenizer where there is one."""
    from ad_mlir.bench.generate import smollm2_or_its_shape
    from ad_mlir.zoo.checkpoints import load_causal_lm

    model, name = smollm2_or_its_shape(4 if quick else None)
    config = copy.deepcopy(model.config)
    config.architectures = [type(model).__name__]
    if hasattr(config, "quantization_config"):  # a GGUF checkpoint, dequantized when loaded: saved as it is now
        del config.quantization_config
    plain = type(model)(config)
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(root)
    with contextlib.suppress(ImportError, OSError):
        tokenizer = load_causal_lm("smollm2")[1]
        if tokenizer is not None:
            tokenizer.save_pretrained(root)
    return root, name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(command: Sequence[str], port: int, log: Path, timeout: float = 900) -> Iterator[float]:
    """Start a server, wait until `/v1/models` answers (yields the seconds that took), stop it after."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with log.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        start = time.perf_counter()
        try:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"{log.stem} server exited {proc.returncode}: {log.read_text()[-2000:]}")
                if time.perf_counter() - start > timeout:
                    raise RuntimeError(f"{log.stem} server not ready after {timeout:.0f} s: {log.read_text()[-2000:]}")
                with contextlib.suppress(OSError):
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5).read()
                    break
                time.sleep(1)
            yield time.perf_counter() - start
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


async def _one(client: Any, model: str, question: str, max_tokens: int) -> dict[str, Any]:
    sent = time.perf_counter()
    chunks: list[float] = []
    text = ""
    stream = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}],
                                                  max_tokens=max_tokens, temperature=0.0, stream=True)
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            chunks.append(time.perf_counter())
            text += chunk.choices[0].delta.content
    return {"question": question, "text": text, "sent": sent, "chunks": chunks}


async def _load(base_url: str, model: str, clients: int, requests: int, max_tokens: int) -> tuple[list[dict[str, Any]], float]:
    """`requests` requests, at most `clients` in flight; the load's wall seconds."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=3600)
    pending = [QUESTIONS[i % len(QUESTIONS)] for i in range(requests)]
    results: list[dict[str, Any]] = []

    async def worker() -> None:
        while pending:
            results.append(await _one(client, model, pending.pop(0), max_tokens))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    seconds = time.perf_counter() - start
    await client.close()
    return results, seconds


def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(torch.tensor(values, dtype=torch.float64).quantile(q)) if values else None


def load_row(server: str, clients: int, results: list[dict[str, Any]], seconds: float, count: Callable[[str], int]) -> dict[str, Any]:
    tokens = [count(r["text"]) for r in results]
    ttft = [r["chunks"][0] - r["sent"] for r in results if r["chunks"]]
    itl = [(r["chunks"][-1] - r["chunks"][0]) / (n - 1) for r, n in zip(results, tokens, strict=True)
           if n > 1 and len(r["chunks"]) > 1]
    return {"kind": "online", "server": server, "clients": clients, "requests": len(results),
            "output_tokens": sum(tokens), "seconds": seconds, "output_tok_per_s": sum(tokens) / seconds,
            "ttft_p50_s": _percentile(ttft, 0.5), "ttft_p99_s": _percentile(ttft, 0.99),
            "itl_p50_s": _percentile(itl, 0.5), "itl_p99_s": _percentile(itl, 0.99),
            "answers": {r["question"]: r["text"] for r in results}}


def mark_same_answers(rows: list[dict[str, Any]]) -> None:
    """On each ad-mlir row, how many of its answers equal transformers serve's to the same
    question at the same concurrency (greedy on the same weights: all of them, unless a near tie
    in the logits parts them)."""
    theirs = {r["clients"]: r["answers"] for r in rows if r.get("server") == "transformers serve"}
    for r in rows:
        if r.get("server") == "ad-mlir serve" and r["clients"] in theirs:
            other = theirs[r["clients"]]
            r["same_answers"] = f"{sum(other.get(q) == a for q, a in r['answers'].items())}/{len(r['answers'])}"


def server_commands(directory: Path, port: int, max_batch: int) -> dict[str, list[str]]:
    dtype = "bfloat16" if torch.cuda.is_available() else "float32"
    # each CLI's module through this interpreter: console scripts are not installed where the
    # packages travel as a PYTHONPATH (a lent GPU machine's `make gpu`)
    return {
        "ad-mlir serve": [sys.executable, "-m", "ad_mlir.serve.cli", "serve", "--model", str(directory),
                          "--port", str(port), "--max-batch", str(max_batch), "--max-seq-len", "512", "--dtype", dtype],
        "transformers serve": [sys.executable, "-m", "transformers.cli.transformers", "serve", str(directory),
                               "--continuous-batching", "--dtype", dtype,
                               "--device", "cuda" if torch.cuda.is_available() else "cpu", "--port", str(port)],
    }


def run_online(directory: Path, clients_list: Sequence[int], max_tokens: int, progress: Callable[[str], None],
               logs: Path) -> list[dict[str, Any]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False).input_ids)

    rows = []
    for server in ("ad-mlir serve", "transformers serve"):
        port = free_port()
        command = server_commands(directory, port, max(clients_list))[server]
        progress(f"{server}: starting")
        with running_server(command, port, logs / f"{server.split()[0]}.log") as ready:
            model = str(directory)
            asyncio.run(_load(f"http://127.0.0.1:{port}/v1", model, 1, 1, 4))  # warm-up
            for clients in clients_list:
                progress(f"{server}: {clients} clients")
                results, seconds = asyncio.run(_load(f"http://127.0.0.1:{port}/v1", model, clients,
                                                     max(2 * clients, 4), max_tokens))
                rows.append({**load_row(server, clients, results, seconds, count), "ready_s": ready})
    return rows


def run_offline(directory: Path, batches: Sequence[int], max_tokens: int, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """`LLM.generate` against `generate_batch` on the chat prompts, EOS ignored by neither (greedy,
    same weights: the same answers, which the row records)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from ad_mlir.llm.llm import paged_where_possible
    from ad_mlir.runtime.kernels import reference_kernels

    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    rows = []
    for batch in batches:
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                                                 add_generation_prompt=True, tokenize=True, return_dict=False)
                   for i in range(batch)]
        llm = paged_where_possible(model, 16, max_batch=batch, max_seq_len=256)  # as the server: paged
        config = GenerationConfig(max_new_tokens=max_tokens, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                                  pad_token_id=tokenizer.eos_token_id)
        runs = {"ad-mlir LLM.generate": lambda p=prompts, m=llm: [o.token_ids for o in m.generate(p, max_new_tokens=max_tokens)],
                "transformers generate_batch": lambda p=prompts, c=config: [o.generated_tokens for o in model.generate_batch(
                    p, generation_config=c, progress_bar=False).values()]}
        for impl, run in runs.items():
            progress(f"offline {impl}, batch {batch}")
            with torch.no_grad(), reference_kernels():
                run()  # warm-up: first-call costs (allocations, transformers' cache set-up) are not timed
                start = time.perf_counter()
                outputs = run()
                seconds = time.perf_counter() - start
            tokens = sum(len(o) for o in outputs)
            rows.append({"kind": "offline", "impl": impl, "batch": batch, "output_tokens": tokens,
                         "seconds": seconds, "output_tok_per_s": tokens / seconds})
    return rows


def run_serve(quick: bool, progress: Callable[[str], None] = lambda _: None) -> list[dict[str, Any]]:
    clients, batches, max_tokens = ((1, 4), (1, 8), 16) if quick else ((1, 4, 16, 64), (1, 8, 32), 64)
    with tempfile.TemporaryDirectory(prefix="ad_mlir_serve_bench_") as tmp:
        directory, name = checkpoint_dir(Path(tmp) / "model", quick)
        logs = Path(tmp)
        rows = run_online(directory, clients, max_tokens, progress, logs) + run_offline(directory, batches, max_tokens, progress)
    mark_same_answers(rows)
    return [{**r, "model": name, "max_tokens": max_tokens} for r in rows]
