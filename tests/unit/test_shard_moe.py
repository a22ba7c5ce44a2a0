"""`shard` on `ad.moe`: each expert's FFN cut like the dense MLP, gate/up column-wise over the
intermediate size I, down row-wise, one all_reduce after the op (its combine is linear in the
experts' outputs, so the ranks' partial sums add up). Two gloo ranks (spawned, on 127.0.0.1,
bounded in time) compile `canonicalize,match-moe,shard{world-size=2},default` (match-moe first:
shard cuts the `ad.moe` op, not HF's grouped form) and run their shard with the MoE kernel in
the interpreter; the result must match the unsharded eager model's (fp32)."""

from __future__ import annotations

import pytest
import torch
from gloo_ranks import run_on_ranks
from kernel_guard import graph_kernels, kernels_ran
from moe_blocks import LoopMoe
from transformers import AutoModelForCausalLM

import ad_mlir
from ad_mlir.zoo.small import small_config

WORLD = 2
PIPELINE = f"canonicalize,match-moe,shard{{world-size={WORLD}}},default"
ALL_REDUCE = "_c10d_functional.all_reduce.default"


def _model(family: str) -> torch.nn.Module:
    """One decoder layer of hidden 64: 4 heads, 2 K/V heads, experts of I = 32 (16 per rank);
    Qwen2-MoE's shared expert of 2 x 32, two virtual experts."""
    config = small_config(family, layers=1, hidden_size=64)
    if family == "qwen2_moe":
        config.shared_expert_intermediate_size = 2 * config.moe_intermediate_size
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def _compiled_error(module: torch.nn.Module, x: torch.Tensor, dim: int, inputs: list[torch.Tensor]) -> tuple:
    gm = ad_mlir.compile(module, (x,), pipeline=PIPELINE, dynamic_shapes=({dim: torch.export.Dim("T", max=64)},))
    errors = []
    for i in inputs:
        with torch.no_grad():
            got, expected = gm(i)[0], module(i)
            expected = expected.logits if hasattr(expected, "logits") else expected
        errors.append((got - expected).abs().max().item())
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    return max(errors), targets.count(ALL_REDUCE), sum("moe" in k for k in graph_kernels(gm))


def _on_rank(rank: int) -> dict[str, tuple]:
    # the MoE and other kernels run (in the Triton interpreter without CUDA: conftest's environment is inherited),
    # never their reference semantics, and no op is left without a kernel (tests/kernel_guard.py)
    results = {}
    with pytest.MonkeyPatch.context() as patch, kernels_ran(patch):
        for family in ("mixtral", "qwen2_moe"):
            ids = torch.randint(1, 1000, (1, 11), generator=torch.Generator().manual_seed(1))
            results[family] = _compiled_error(_model(family), ids[:, :5], 1, [ids[:, :1], ids])
        torch.manual_seed(0)
        x = torch.randn(13, 48, generator=torch.Generator().manual_seed(2))
        results["loop"] = _compiled_error(LoopMoe(experts=3).eval(), x[:5], 0, [x[:1], x])
    return results


def test_moe_layers_are_sharded_over_two_gloo_ranks() -> None:
    """fp32 within 1e-5 on logits of magnitude ~1 (torch.testing's fp32 atol): each rank sums
    its half of every expert's intermediate units, then the all_reduce adds the halves. One
    all_reduce after attention, one after the MoE op (the loop block: the MoE op alone)."""
    for rank, results in run_on_ranks(_on_rank, WORLD, timeout_s=300).items():
        for name, (error, all_reduces, moe_calls) in results.items():
            assert moe_calls == 1 and all_reduces == (1 if name == "loop" else 2), (rank, name, results)
            assert error < 1e-5, (rank, name, error)
