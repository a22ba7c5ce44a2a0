"""`ad-mlir serve --tensor-parallel-size 2`, the commands of docs/tensor-parallel.md run as a user
runs them (subprocesses on loopback, a free port and `--max-seq-len 64` added, the kernels as their
torch reference): their answers to concurrent completions, asked with the openai client, are one
unsharded `LLM`'s greedy tokens. The one-machine command starts its second rank itself and,
terminated, stops it (no rank process outlives it); it stops with an error when that rank is
killed. The several-machines command runs as two
torchrun agents on this machine meeting at a c10d rendezvous on 127.0.0.1 (HOST), stopped the way
rank 0 is stopped: both ranks and both agents exit 0.

The model: a transformers model type built small from its config (`ad_mlir.zoo.small`; seeded, so
every process builds the same weights), 4 query and 2 key/value heads, one K/V head per rank (the
tiny families' single K/V head does not split in two)."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO

import openai
import pytest
import torch
from test_serve import _wait_healthy

import ad_mlir
from ad_mlir.runtime.kernels import reference_kernels

MODEL = "qwen3"
PROMPTS = ((5, 9, 13, 3), (7, 8), (100, 200, 300, 400, 500), (11, 12, 13))
NEW = 8
MAX_SEQ = 64
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DOC = ROOT / "docs" / "tensor-parallel.md"


def documented(prefix: str, port: int) -> list[str]:
    """The argv of docs/tensor-parallel.md's command that starts with `prefix` (its comment cut, as
    the shell would), from this venv, serving on `port` with slots of `MAX_SEQ` tokens."""
    line = next(line for line in DOC.read_text().splitlines() if line.startswith(prefix))
    argv = shlex.split(re.sub(r"\s+#\s.*$", "", line))
    return [str(BIN / argv[0]), *argv[1:], "--port", str(port), "--max-seq-len", str(MAX_SEQ)]


@functools.cache
def one_rank_tokens() -> tuple[list[int], ...]:
    """The prompts' greedy tokens from one unsharded LLM built as the server builds its (paged,
    default sizes)."""
    llm = ad_mlir.LLM(MODEL, max_seq_len=MAX_SEQ, page_size=16)
    with reference_kernels():
        outputs = llm.generate(PROMPTS, max_new_tokens=NEW)
    tokens = tuple(out.token_ids for out in outputs)
    assert len({t for ids in tokens for t in ids}) > NEW, tokens  # tokens that vary: a wrong rank would show
    return tokens


def test_the_rank_started_here_takes_the_first_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a GPU per rank (CUDA stubbed here: no GPU needed), the process that starts the group
    is rank 0 on GPU 0 under NCCL, and starts rank 1 (which takes GPU 1 by its LOCAL_RANK)."""
    from ad_mlir.serve import ranks as ranks_module

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    chosen: list[int] = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    started: list[int] = []
    monkeypatch.setattr(ranks_module, "_start_rank", lambda rank, world, port, argv: started.append(rank))
    groups: list[tuple[str, int, int]] = []
    monkeypatch.setattr(ranks_module.dist, "init_process_group",
                        lambda backend, **kw: groups.append((backend, kw["rank"], kw["world_size"])))
    ranks = ranks_module.join(2, 10, [])
    assert (ranks.rank, ranks.device, ranks.backend) == (0, torch.device("cuda", 0), "nccl")
    assert chosen == [0] and started == [1] and groups == [("nccl", 0, 2)]


def test_serve_on_two_ranks_answers_as_one_rank_and_stops_the_rank_it_started(tmp_path: Path) -> None:
    port = _free_port()
    log = tmp_path / "server.log"
    server = _start(documented("ad-mlir serve", port), log)
    try:
        expected = one_rank_tokens()  # compiled while the ranks compile
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, 240, [server], log)
        workers = _children(server.pid)
        assert len(workers) == 1, workers  # rank 1
        assert _answers(url) == expected
        server.terminate()
        assert server.wait(timeout=60) == 0, log.read_text()[-3000:]
        _wait_ended(workers)
    finally:
        _kill([server])
    assert "2 ranks (gloo)" in log.read_text()


def test_a_rank_that_dies_stops_the_server_within_the_keepalive(tmp_path: Path) -> None:
    """Rank 1 killed: rank 0's next keep-alive (every 5 s at --rank-timeout 20) finds its connection
    closed, and the server stops with an error rather than serving what it can no longer compute."""
    port = _free_port()
    log = tmp_path / "server.log"
    server = _start([*documented("ad-mlir serve", port), "--rank-timeout", "20"], log)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, 240, [server], log)
        (rank_1,) = _children(server.pid)
        os.kill(rank_1, signal.SIGKILL)
        assert server.wait(timeout=30) == 1, log.read_text()[-3000:]
    finally:
        _kill([server])
    assert "error: stopped: a call failed, the ranks are out of step" in log.read_text()


def test_two_torchrun_machines_at_a_rendezvous_answer_as_one_rank_and_stop_together(tmp_path: Path) -> None:
    port, rendezvous = _free_port(), _free_port()
    command = [a.replace("HOST:29400", f"127.0.0.1:{rendezvous}") for a in documented("torchrun --nnodes 2", port)]
    agents = [_start(command, tmp_path / f"node{n}.log") for n in range(2)]
    try:
        expected = one_rank_tokens()
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, 240, agents, tmp_path / "node0.log")
        assert _answers(url) == expected
        serving = [n for n in range(2) if "serving on" in (tmp_path / f"node{n}.log").read_text()]
        assert len(serving) == 1, serving  # one rank 0, on whichever machine the rendezvous made it
        ranks = [pid for agent in agents for pid in _children(agent.pid)]
        (rank_0,) = _children(agents[serving[0]].pid)
        os.kill(rank_0, signal.SIGTERM)  # as a user stops the server: its rank 0 tells the other to stop
        codes = [agent.wait(timeout=60) for agent in agents]
        assert codes == [0, 0], [(tmp_path / f"node{n}.log").read_text()[-2000:] for n in range(2)]
        _wait_ended(ranks)
    finally:
        _kill(agents)


def _answers(url: str) -> tuple[list[int], ...]:
    """The prompts asked at once, the last one streamed; each answer's token ids."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

    def ask(prompt: tuple[int, ...]) -> list[int]:
        return client.completions.create(model=MODEL, prompt=list(prompt), max_tokens=NEW,
                                         temperature=0).choices[0].model_extra["token_ids"]

    def stream(prompt: tuple[int, ...]) -> list[int]:
        chunks = client.completions.create(model=MODEL, prompt=list(prompt), max_tokens=NEW, temperature=0,
                                           stream=True)
        return [t for chunk in chunks for choice in chunk.choices for t in choice.model_extra.get("token_ids", [])]

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        futures = [pool.submit(ask, p) for p in PROMPTS[:-1]] + [pool.submit(stream, PROMPTS[-1])]
        return tuple(f.result() for f in futures)


def _start(cmd: list[str], log: Path) -> subprocess.Popen:
    # As a user runs it: without the suite's TRITON_INTERPRET (the kernels run as their torch
    # reference) and with the program cache (each rank's own entry, in the suite's cache directory:
    # the second test's ranks load the first's). Output to a file: a pipe nobody reads could fill
    # and stall a rank.
    out: IO[str] = log.open("w")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "AD_MLIR_PROGRAM_CACHE")}
    return subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True, env=env)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux: /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state_and_parent = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if int(state_and_parent[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _wait_ended(pids: list[int], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while [pid for pid in pids if _running(pid)]:
        assert time.monotonic() < deadline, f"still running {seconds} s after the server stopped: {pids}"
        time.sleep(0.2)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill(processes: list[subprocess.Popen]) -> None:
    """A failed test's leftovers: their rank processes, then them."""
    for p in processes:
        if p.poll() is None:
            for child in _children(p.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
            p.kill()
            p.wait()
