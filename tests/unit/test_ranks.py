"""`ad_mlir.llm.ranks`: rank 0's `RankLeader` sends each model call to every rank, `follow` runs
them on the others. Two gloo ranks on 127.0.0.1 (spawned, bounded in time) drive a model double
whose calls all-reduce as a sharded model's do: the ranks run the same calls in the same order and
leave together on `stop`; the keep-alive holds an idle rank past the group's timeout (without it
that rank times out); a call that fails on one rank ends the run on both within seconds, however
long the group's timeout, and every later call on rank 0 fails at once. The pipeline with `shard`
for a world size, and the refusal of a model that `shard` left whole."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from gloo_ranks import run_on_ranks

from ad_mlir.llm.ranks import RankLeader, follow, sharded_pipeline
from ad_mlir.passes.canonicalize import CanonicalizePass
from ad_mlir.passes.match_moe import MatchMoePass
from ad_mlir.passes.pipeline import parse_passes
from ad_mlir.passes.shard import ShardPass

WORLD = 2


@dataclass
class AllReducingModel:
    """A double of a sharded `LLM`: each call all-reduces its first tensor's sum (the shards'
    collectives), records what it got, and returns the reduced sum."""

    group: Any
    fail_on_rank: int | None = None
    page_size: int = 16
    calls: list[tuple[str, list[Any]]] = field(default_factory=list)

    def _run(self, method: str, *args: Any) -> torch.Tensor:
        self.calls.append((method, [a.tolist() if isinstance(a, torch.Tensor) else a for a in args]))
        if dist.get_rank() == self.fail_on_rank:
            raise RuntimeError("this rank's call failed before its collective")
        total = torch.tensor(float(torch.as_tensor(args[0]).sum()))
        dist.all_reduce(total, group=self.group)
        return total

    def forward_flat(self, *args: torch.Tensor) -> torch.Tensor:
        return self._run("forward_flat", *args)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, slots: list[int], starts: list[int],
             last_only: bool = False) -> torch.Tensor:
        return self._run("step", tokens, positions, slots, starts, last_only)

    def decode(self, *args: list[int]) -> torch.Tensor:
        return self._run("decode", *args)

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self._run("forward", *args)


def _group(timeout_s: float) -> Any:
    return dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))


def _calls_on_rank(rank: int, keepalive_s: float) -> dict[str, Any]:
    """Rank 0 idles past the group's timeout of 2 s, then makes one call of each kind and stops."""
    group = _group(2)
    model = AllReducingModel(group)
    try:
        if rank > 0:
            follow(model, group)
            return {"calls": model.calls}
        leader = RankLeader(model, keepalive_s=keepalive_s, group=group)
        time.sleep(3.5)
        results = [leader.forward_flat(torch.tensor([[1, 2, 3]]), torch.tensor([[0, 1, 2]])),
                   leader.step(torch.tensor([[4, 5]]), torch.tensor([[3, 4]]), [1], [3], last_only=True),
                   leader.decode([7, 8], [0, 1], [5, 2], [2, 3])]
    except RuntimeError as e:  # RanksOutOfStep too
        return {"calls": model.calls, "error": str(e)}
    refused = ""
    try:
        leader.forward(torch.tensor([1]))
    except AttributeError as e:
        refused = str(e)
    return {"calls": model.calls, "results": [float(r) for r in results], "page_size": leader.page_size,
            "refused": refused, "told": leader.stop()}


def test_every_rank_runs_rank_0s_calls_in_order_after_idling_past_the_group_timeout() -> None:
    ranks = run_on_ranks(functools.partial(_calls_on_rank, keepalive_s=0.5), WORLD, timeout_s=60)
    expected = [("forward_flat", [[[1, 2, 3]], [[0, 1, 2]]]), ("step", [[[4, 5]], [[3, 4]], [1], [3], True]),
                ("decode", [[7, 8], [0, 1], [5, 2], [2, 3]])]
    assert ranks[0]["calls"] == ranks[1]["calls"] == expected, ranks
    assert ranks[0]["results"] == [12.0, 18.0, 30.0]  # each sum all-reduced over the two ranks: the calls paired up
    assert ranks[0]["page_size"] == 16
    assert "forward would run on rank 0 alone" in ranks[0]["refused"]
    assert ranks[0]["told"]


def test_without_keepalives_an_idle_rank_times_out() -> None:
    """The control of the test above: its idle spell ends a rank that hears nothing."""
    ranks = run_on_ranks(functools.partial(_calls_on_rank, keepalive_s=60), WORLD, timeout_s=60)
    assert "Timed out" in ranks[1]["error"], ranks
    assert "error" in ranks[0] and ranks[0]["calls"] == [], ranks


def _fail_on_rank_1(rank: int) -> dict[str, Any]:
    group = _group(120)  # far longer than the test allows: the failure must not wait for it
    model = AllReducingModel(group, fail_on_rank=1)
    if rank > 0:
        try:
            follow(model, group)
        except RuntimeError as e:
            return {"error": str(e)}  # leaving the group closes this rank's connections
        return {"error": None}
    lost: list[BaseException] = []
    leader = RankLeader(model, keepalive_s=60, on_lost=lost.append, group=group)
    start = time.monotonic()
    errors = []
    for _ in range(2):
        try:
            leader.decode([1], [0], [0], [])
        except Exception as e:  # noqa: BLE001 (the test reports each failure)
            errors.append(type(e).__name__)
    return {"errors": errors, "seconds": time.monotonic() - start, "lost": len(lost), "told": leader.stop()}


def test_a_call_failing_on_one_rank_ends_both_without_waiting_for_the_timeout() -> None:
    ranks = run_on_ranks(_fail_on_rank_1, WORLD, timeout_s=60)
    assert ranks[1]["error"] == "this rank's call failed before its collective"
    assert ranks[0]["errors"][1] == "RanksOutOfStep", ranks[0]  # the first: gloo's lost connection
    assert ranks[0]["lost"] == 1
    assert not ranks[0]["told"]  # nothing is sent to ranks out of step
    assert ranks[0]["seconds"] < 20, ranks[0]


def test_sharded_pipeline_puts_shard_before_a_pipeline_without_one() -> None:
    assert sharded_pipeline("default", 2).passes[:4] == (CanonicalizePass(), MatchMoePass(), ShardPass(world_size=2),
                                                         CanonicalizePass())
    assert sharded_pipeline("none", 4).passes == (CanonicalizePass(), MatchMoePass(), ShardPass(world_size=4))
    own = "canonicalize,shard{world-size=2 shard-layers=mlp},fuse-elementwise"
    assert sharded_pipeline(own, 2).passes == parse_passes(own)
    assert sharded_pipeline(own, 2).passes[1] == ShardPass(world_size=2, shard_layers=("mlp",))
