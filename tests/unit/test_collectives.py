"""`ad.all_reduce` / `ad.wait_tensor` are torch's functional collectives: a graph holding them
imports as typed ops, and exports back to `_c10d_functional` calls that run on a real
process group. Two gloo ranks on 127.0.0.1, spawned processes, bounded in time."""

from __future__ import annotations

import multiprocessing
import socket
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from xdsl.parser import Parser

from ad_mlir.frontends.fx_export import export_program
from ad_mlir.frontends.fx_import import ImportedProgram, import_program
from ad_mlir.passes.pipeline import make_context
from ad_mlir.runtime.reference import evaluate

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


def _rank_main(rank: int, port: int, results: multiprocessing.Queue) -> None:
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                                timeout=timedelta(seconds=TIMEOUT_S))
        _check_rank(rank)
        results.put((rank, None))
    except BaseException:  # report every failure to the parent, which asserts
        results.put((rank, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_all_reduce_round_trips_and_runs_on_two_gloo_ranks() -> None:
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    ranks = [ctx.Process(target=_rank_main, args=(r, port, results)) for r in range(WORLD)]
    for p in ranks:
        p.start()
    try:
        reports = dict(results.get(timeout=TIMEOUT_S) for _ in ranks)
    finally:
        for p in ranks:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join()
    assert reports == dict.fromkeys(range(WORLD)), "\n".join(str(r) for r in reports.values() if r)
