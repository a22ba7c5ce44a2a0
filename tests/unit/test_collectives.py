"""`ad.all_reduce` / `ad.wait_tensor` are torch's functional collectives: a graph holding them
imports as typed ops, and exports back to `_c10d_functional` calls that run on a real
process group; weight arguments marked as shards (`ad.shard_dim`) hold each rank's slice, so
a tensor-parallel MLP written in `ad` matches the unsharded one. Two gloo ranks on
127.0.0.1, spawned processes, bounded in time."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from gloo_ranks import run_on_ranks
from xdsl.parser import Parser

import ad_mlir
from ad_mlir.frontends.fx_import import ImportedProgram, import_program
from ad_mlir.passes.pipeline import make_context
from ad_mlir.runtime.fx_export import export_program
from ad_mlir.semantics.reference import evaluate
from ad_mlir.semantics.weights import Rank, ShardError

WORLD = 2
TIMEOUT_S = 120

PROGRAM = """
func.func @forward(%x: tensor<4x?xf32> {{ad.input = "x"}}, %w: tensor<8x4xf32> {{ad.param = "w"}}) -> tensor<8x?xf32> {{
  %r = ad.all_reduce %x "sum" group "{group}" : tensor<4x?xf32> -> tensor<4x?xf32>
  %y = ad.wait_tensor %r : tensor<4x?xf32> -> tensor<4x?xf32>
  %z = ad.mm %w, %y : (tensor<8x4xf32>, tensor<4x?xf32>) -> tensor<8x?xf32>
  func.return %z : tensor<8x?xf32>
}}
"""


SHARDED_MLP = """
func.func @forward(%x: tensor<3x8xf32> {{ad.input = "x"}},
                   %w1: tensor<{cols}x8xf32> {{ad.param = "up.weight", ad.shard_dim = 0 : i64}},
                   %b1: tensor<{cols}xf32> {{ad.param = "up.bias", ad.shard_dim = 0 : i64}},
                   %w2: tensor<8x{cols}xf32> {{ad.param = "down.weight", ad.shard_dim = 1 : i64}}) -> tensor<3x8xf32> {{
  %h = ad.linear %x, %w1 bias %b1 : (tensor<3x8xf32>, tensor<{cols}x8xf32>, tensor<{cols}xf32>) -> tensor<3x{cols}xf32>
  %a = ad.silu %h : tensor<3x{cols}xf32> -> tensor<3x{cols}xf32>
  %p = ad.linear %a, %w2 : (tensor<3x{cols}xf32>, tensor<8x{cols}xf32>) -> tensor<3x8xf32>
  %r = ad.all_reduce %p "sum" group "{group}" : tensor<3x8xf32> -> tensor<3x8xf32>
  %y = ad.wait_tensor %r : tensor<3x8xf32> -> tensor<3x8xf32>
  func.return %y : tensor<3x8xf32>
}}
"""
"""Column-parallel up projection (rows of w1 and b1), row-parallel down projection (columns
of w2), one all_reduce: the Megatron MLP, 16 hidden units split over the ranks."""


def _check_sharded_mlp(rank: int) -> None:
    generator = torch.Generator().manual_seed(0)
    weights = {"up.weight": torch.randn(16, 8, generator=generator), "up.bias": torch.randn(16, generator=generator),
               "down.weight": torch.randn(8, 16, generator=generator)}
    x = torch.randn(3, 8, generator=generator)
    text = SHARDED_MLP.format(cols=16 // WORLD, group=dist.group.WORLD.group_name)
    program = ImportedProgram(Parser(make_context(), text).parse_module(), weights)
    expected = torch.nn.functional.silu(x @ weights["up.weight"].T + weights["up.bias"]) @ weights["down.weight"].T
    on_rank = Rank(rank, WORLD)
    # fp32; only the order of the hidden-unit sum differs (two partial sums, then their sum)
    torch.testing.assert_close(export_program(program, rank=on_rank)(x)[0], expected)
    torch.testing.assert_close(evaluate(program.module, weights, [x], rank=on_rank)[0], expected)


class SumOverRanks(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fc.all_reduce(x * 2, "sum", dist.group.WORLD) + 1


def _check_rank(rank: int) -> None:
    group = dist.group.WORLD.group_name
    x = torch.full((4, 3), float(rank + 1))
    total = sum(range(1, WORLD + 1))

    program = ImportedProgram(Parser(make_context(), PROGRAM.format(group=group)).parse_module(),
                              {"w": torch.ones(8, 4)})
    gm = export_program(program)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops._c10d_functional.all_reduce.default in targets
    assert torch.ops._c10d_functional.wait_tensor.default in targets
    assert torch.equal(gm(x)[0], torch.full((8, 3), 4.0 * total))
    assert torch.equal(evaluate(program.module, program.weights, [x])[0], torch.full((8, 3), 4.0 * total))

    imported = import_program(torch.export.export(SumOverRanks(), (x,)))
    names = [op.name for op in imported.module.walk()]
    assert "ad.all_reduce" in names and "ad.wait_tensor" in names, names
    assert torch.equal(export_program(imported)(x)[0], torch.full((4, 3), 2.0 * total + 1))


def _check_collectives(rank: int) -> None:
    _check_rank(rank)
    _check_sharded_mlp(rank)


def test_all_reduce_round_trips_and_runs_on_two_gloo_ranks() -> None:
    run_on_ranks(_check_collectives, WORLD, TIMEOUT_S)


def test_a_shard_that_does_not_fit_the_world_size_is_refused() -> None:
    text = SHARDED_MLP.format(cols=6, group="0")
    program = ImportedProgram(Parser(make_context(), text).parse_module(),
                              {"up.weight": torch.ones(16, 8), "up.bias": torch.ones(16), "down.weight": torch.ones(8, 16)})
    with pytest.raises(ShardError, match=r"weight 'up.weight' has 16 along dim 0, but its shard of 6 on each of 2 "
                                         r"ranks covers 12"):
        export_program(program, rank=Rank(1, 2))


def test_compile_checks_the_rank() -> None:
    ep = torch.export.export(torch.nn.Linear(4, 4), (torch.randn(2, 4),))
    with pytest.raises(ValueError, match="rank 2 is not in a world of 2"):
        ad_mlir.compile(ep, world_size=2, rank=2)
    gm = ad_mlir.compile(ep, world_size=2, rank=1)  # nothing sharded: every rank holds every weight
    torch.testing.assert_close(gm(torch.ones(2, 4))[0], ep.module()(torch.ones(2, 4)))
