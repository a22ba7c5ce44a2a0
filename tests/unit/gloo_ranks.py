"""Run a function on W spawned processes joined in a gloo process group on 127.0.0.1,
bounded in time; every rank's failure comes back to the parent as its traceback."""

from __future__ import annotations

import multiprocessing
import socket
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(fn: Callable[[int], Any], rank: int, world: int, port: int, timeout_s: float,
               results: multiprocessing.Queue) -> None:
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        results.put((rank, fn(rank), None))
    except BaseException:  # report every failure to the parent, which asserts
        results.put((rank, None, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_on_ranks(fn: Callable[[int], Any], world: int = 2, timeout_s: float = 120) -> dict[int, Any]:
    """`fn(rank)` on each of `world` gloo ranks (fn must be importable: a module-level function
    or a functools.partial of one); returns each rank's result, or fails with every rank's
    traceback. Ranks still alive after the timeout are terminated."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    ranks = [ctx.Process(target=_rank_main, args=(fn, r, world, port, timeout_s, results)) for r in range(world)]
    for p in ranks:
        p.start()
    try:
        reports = [results.get(timeout=timeout_s) for _ in ranks]
    finally:
        for p in ranks:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join()
    failures = [f"rank {rank}:\n{error}" for rank, _, error in reports if error]
    assert not failures, "\n".join(failures)
    return {rank: value for rank, value, _ in reports}
