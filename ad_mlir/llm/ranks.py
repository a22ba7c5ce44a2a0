"""One tensor-parallel model driven from rank 0: the engine runs on rank 0, every rank runs its calls.

With `shard` in the pipeline each rank holds a slice of the weights, and every rank must make the
same forward calls with the same inputs in the same order: the all_reduce after each block pairs
up across them. `RankLeader` is rank 0's model for the engine (`PagedModel` / `CachedModel`): each
`forward_flat`, `step` or `decode` call is broadcast to the other ranks, then run on rank 0's own
shard. `follow(llm)`, on every other rank, runs the calls it receives until rank 0's `stop`.

A call is one `broadcast_object_list` of its method and arguments (int64 host tensors of a few
hundred elements, and lists of ints: pickling them costs less than a second round of shapes
first). While the engine is idle rank 0 sends a keep-alive at least every `keepalive_s`, so a
rank waiting for its next call never waits past the process group's timeout (gloo raises there,
NCCL's watchdog aborts the process).

Failures: a call that fails on any rank may leave the others inside a collective that will never
be matched, and nothing tells a rank which of its peers got how far. So the ranks are out of step
for good: on rank 0 the call raises (its requests fail) and every later call raises
`RanksOutOfStep` at once (`on_lost` tells the server to stop); a rank > 0 lets the error end its
process. A rank that dies closes its gloo connections and its peers' calls fail at once; a rank
that hangs (or dies under NCCL) holds them until the process group's timeout."""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ad_mlir.passes.canonicalize import CanonicalizePass
from ad_mlir.passes.match_moe import MatchMoePass
from ad_mlir.passes.pipeline import Pipeline, PipelineConfig, load_pipeline
from ad_mlir.passes.shard import ShardPass

if TYPE_CHECKING:
    from ad_mlir.llm.llm import LLM

log = logging.getLogger(__name__)

CALLS = ("forward_flat", "step", "decode")
"""The model's methods the engine calls: every rank runs them."""
KEEPALIVE = "keepalive"
STOP = "stop"
ALL_REDUCE = "_c10d_functional.all_reduce.default"


class RanksOutOfStep(RuntimeError):
    """A call failed on some rank: the ranks' collectives can no longer be trusted to pair up."""


@dataclass(frozen=True)
class Call:
    method: str
    """One of `CALLS`, `KEEPALIVE` or `STOP`."""
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


def sharded_pipeline(pipeline: Pipeline, world: int) -> PipelineConfig:
    """`pipeline` (a name, a pass string, a YAML file or its passes) after `canonicalize,
    match-moe, shard{world-size=world}` (match-moe first: `shard` splits the experts of an
    `ad.moe`, not HF's exported grouped-GEMM form); one that has a `shard` pass already is kept
    as it is (the compiler checks its world size against the process group's)."""
    config = load_pipeline(pipeline)
    if any(p.name == ShardPass.name for p in config.passes):
        return config
    return PipelineConfig((CanonicalizePass(), MatchMoePass(), ShardPass(world_size=world), *config.passes),
                          config.skip_on_error)


def check_sharded(llm: LLM, world: int) -> None:
    """Refuse a model that `shard` left whole (its failure is skipped with a warning, and each rank
    would then run all of it): the compiled graph must all-reduce."""
    if not any(str(n.target) == ALL_REDUCE for n in llm.graph.graph.nodes):
        raise ValueError(f"shard split nothing of the model over {world} ranks (its warning above says why, e.g. a "
                         "world size that does not divide the query and key/value heads): choose a tensor-parallel "
                         "size that divides them, or serve it on one rank")


class RankLeader:
    """Rank 0's model for the engine: `CALLS` go to every rank, then run on rank 0's `llm`;
    its other attributes (sizes, `eos`, `tokenizer`, ...) are `llm`'s. `on_lost` is called once,
    with the error, when the ranks fall out of step. `group`: the ranks' process group (default:
    the default group), whose rank 0 this process is."""

    def __init__(self, llm: LLM, keepalive_s: float,
                 on_lost: Callable[[BaseException], None] = lambda error: None,
                 group: dist.ProcessGroup | None = None) -> None:
        self.llm = llm
        self.keepalive_s = keepalive_s
        self.on_lost = on_lost
        self.group = group
        self.lost: BaseException | None = None
        self._lock = threading.Lock()
        """Held while a call is sent and run: the engine's thread and the keep-alive's send in one order."""
        self._last_sent = time.monotonic()
        self._stopping = threading.Event()
        self._keepalive = threading.Thread(target=self._keep_alive, name="ad-mlir-rank-keepalive", daemon=True)
        self._keepalive.start()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.llm, name)
        if inspect.ismethod(value):  # a model method run here alone would wait in its first all_reduce forever
            raise AttributeError(f"RankLeader runs {', '.join(CALLS)} on every rank; {name} would run on rank 0 alone")
        return value

    def forward_flat(self, *args: torch.Tensor | None, **kwargs: torch.Tensor | None) -> torch.Tensor:
        """`LLM.forward_flat`, on every rank."""
        return self._run(Call("forward_flat", args, kwargs))

    def step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """`LLM.step`, on every rank."""
        return self._run(Call("step", args, kwargs))

    def decode(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """`LLM.decode`, on every rank."""
        return self._run(Call("decode", args, kwargs))

    def stop(self, wait_s: float = 30) -> bool:
        """Tell the other ranks to leave `follow`; whether they were told. Not when the ranks are
        out of step, nor when a call still runs after `wait_s` (hung in a collective: it keeps the
        lock); then the ranks are left to their timeout."""
        self._stopping.set()  # the keep-alive sends nothing more (it may be waiting for the lock)
        if not self._lock.acquire(timeout=wait_s):
            log.warning("ranks: a call is still running after %.0f s; the other ranks are not told to stop", wait_s)
            return False
        try:
            if self.lost is not None:
                return False
            _send(Call(STOP), self.group)
            dist.barrier(self.group)  # every rank has stopped before any leaves the group (see `follow`)
            return True
        except Exception as e:  # noqa: BLE001 (a rank gone already: nothing left to stop)
            log.warning("ranks: could not tell the other ranks to stop: %s", e)
            return False
        finally:
            self._lock.release()

    def _run(self, call: Call) -> torch.Tensor:
        with self._lock:
            if self.lost is not None:
                raise RanksOutOfStep(f"the ranks are out of step since a call failed: {self.lost}") from self.lost
            try:
                self._send(call)
                return getattr(self.llm, call.method)(*call.args, **call.kwargs)
            except Exception as e:
                self._lose(e)
                raise

    def _send(self, call: Call) -> None:
        _send(call, self.group)
        self._last_sent = time.monotonic()

    def _lose(self, error: BaseException) -> None:
        log.error("ranks: a call failed (%s: %s); the ranks are out of step, every later call fails",
                  type(error).__name__, error)
        self.lost = error
        self.on_lost(error)

    def _keep_alive(self) -> None:
        while not self._stopping.wait(self.keepalive_s / 4):
            with self._lock:
                if self.lost is None and not self._stopping.is_set() \
                        and time.monotonic() - self._last_sent >= self.keepalive_s:
                    try:
                        self._send(Call(KEEPALIVE))
                    except Exception as e:  # noqa: BLE001 (a rank is gone: the server stops)
                        self._lose(e)


def follow(llm: LLM, group: dist.ProcessGroup | None = None) -> None:
    """On a rank > 0: run the calls of `group`'s rank 0 (default: the default group's) on this
    rank's `llm` until it sends `STOP`. An error (a failed call, a lost connection) is raised: the
    ranks are out of step for good."""
    while True:
        call = _receive(group)
        if call.method == STOP:
            # a rank that left while a peer still used its connections got the peer's gloo thread
            # aborted at exit (examples/tp.py saw it): leave together
            dist.barrier(group)
            return
        if call.method in CALLS:
            getattr(llm, call.method)(*call.args, **call.kwargs)
        elif call.method != KEEPALIVE:
            raise RanksOutOfStep(f"rank 0 sent an unknown call {call.method!r}")


def _send(call: Call, group: dist.ProcessGroup | None) -> None:
    dist.broadcast_object_list([call], src=_first_rank(group), group=group)


def _receive(group: dist.ProcessGroup | None) -> Call:
    box: list[Any] = [None]
    dist.broadcast_object_list(box, src=_first_rank(group), group=group)
    return box[0]


def _first_rank(group: dist.ProcessGroup | None) -> int:
    """The global rank of `group`'s rank 0 (`broadcast_object_list` takes global ranks)."""
    return 0 if group is None else dist.get_global_rank(group, 0)
