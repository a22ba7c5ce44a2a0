"""The process group of `ad-mlir serve --tensor-parallel-size N`.

Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT in the
environment) each process joins torchrun's group, on one machine or on several through its
rendezvous. Without torchrun the command becomes rank 0 of a group on this machine: it hosts the
group's store on a free loopback port and starts N - 1 copies of itself (`python -m
ad_mlir.serve.cli` with the same arguments, that environment set) as ranks 1 .. N - 1, each in a
session of its own so that a Ctrl-C in the terminal reaches rank 0 alone, which stops them; each
exits within a second of rank 0's end however it ends (killed: `PARENT_VARIABLE`).

NCCL with one GPU per process (`cuda:LOCAL_RANK`) where this machine has a GPU for every local
rank, else gloo on the CPU."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

PARENT_VARIABLE = "AD_MLIR_SERVE_PARENT"
"""Set in the ranks rank 0 starts: its process id, which they watch (a rank 0 killed outright
sends no stop, and under NCCL its peers would wait for the group's timeout)."""


@dataclass
class Ranks:
    """This process's place in the group, and the ranks it started (rank 0 without torchrun)."""

    rank: int
    world_size: int
    device: torch.device | None
    """This rank's GPU under NCCL; None (the CPU) under gloo."""
    workers: list[subprocess.Popen] = field(default_factory=list)

    @property
    def backend(self) -> str:
        return "nccl" if self.device is not None else "gloo"

    def leave(self, wait_s: float = 30) -> None:
        """Leave the group; wait `wait_s` for the ranks this process started (told to stop by
        then), then terminate, then kill, those still running."""
        if dist.is_initialized():
            dist.destroy_process_group()  # closes the connections: a rank still waiting on one fails at once
        for worker in self.workers:
            _end(worker, wait_s)


def join(size: int, timeout_s: float, argv: Sequence[str]) -> Ranks:
    """Join a group of `size` ranks whose collectives wait `timeout_s` at most: torchrun's, or one
    on this machine whose ranks 1 .. size - 1 run `ad_mlir.serve.cli` with `argv`."""
    timeout = timedelta(seconds=timeout_s)
    if "RANK" in os.environ:  # torchrun's environment (or the one rank 0 gives the ranks it starts)
        world = int(os.environ["WORLD_SIZE"])
        if world != size:
            raise ValueError(f"--tensor-parallel-size {size}, but torchrun started {world} processes: give "
                             f"--tensor-parallel-size {world}, or run torchrun with {size}")
        if PARENT_VARIABLE in os.environ:
            threading.Thread(target=_exit_without, args=(int(os.environ[PARENT_VARIABLE]),), daemon=True).start()
        device = _device(int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"]))
        dist.init_process_group("nccl" if device is not None else "gloo", timeout=timeout)
        return Ranks(dist.get_rank(), world, device)
    ranks = Ranks(0, size, _device(0, size))
    port = _free_port()
    try:
        ranks.workers = [_start_rank(rank, size, port, argv) for rank in range(1, size)]
        dist.init_process_group(ranks.backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=size,
                                timeout=timeout)
    except BaseException:
        ranks.leave(wait_s=0)
        raise
    return ranks


def _device(local_rank: int, local_world: int) -> torch.device | None:
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world:
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_rank(rank: int, world: int, port: int, argv: Sequence[str]) -> subprocess.Popen:
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
           "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           PARENT_VARIABLE: str(os.getpid())}
    return subprocess.Popen([sys.executable, "-m", "ad_mlir.serve.cli", *argv], env=env,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def _exit_without(parent: int) -> None:
    """End this process once `parent` has (this process is then another's child), from a thread:
    the main one may be blocked in a collective."""
    while os.getppid() == parent:
        time.sleep(1)
    log.warning("ranks: rank 0 (process %d) has ended: exiting", parent)
    os._exit(1)


def _end(worker: subprocess.Popen, wait_s: float) -> None:
    if wait_s:
        try:
            worker.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            log.warning("ranks: rank process %d still runs after %.0f s: terminating it", worker.pid, wait_s)
    worker.terminate()
    try:
        worker.wait(timeout=10)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()
