"""`shard` on parallel attention + MLP blocks (one norm feeding both branches, their outputs
summed with the residual): two gloo ranks (spawned on 127.0.0.1, bounded in time) each compile
tiny HF Phi, GPT-NeoX (`use_parallel_residual`) and Falcon (`parallel_attn`) with
`canonicalize,shard{world-size=2},default` and run their shard, every kernel in the Triton
interpreter (the reference fallback refused); the logits must equal the unsharded eager model's
(fp32), and the fusions must still fire on the local shapes.

Phi shards both branches, and both closing linears have a bias: their partial sums meet in one
add, so a layer reduces once (the biases are added after it). GPT-NeoX's attention reads its
fused QKV through an `aten.chunk` that `shard` does not know, and Falcon's multi-query fused
QKV is sliced along the heads (the K/V head is not split): their attention stays replicated
(the log says why); their MLPs shard and reduce before the parallel sum (Falcon's `x @ W.T`
projections are linears after canonicalize)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from gloo_ranks import run_on_ranks
from kernel_guard import graph_kernels, kernels_ran

import ad_mlir
from ad_mlir.examples.tp import ALL_REDUCE
from ad_mlir.frontends.export import export_with_ids
from ad_mlir.zoo.small import small_model

WORLD = 2
LAYERS = 2
SEQ_LENS = (5, 11)
EXPECTED = {
    # family: (all_reduces per layer, the activation kernel's name prefix)
    "phi": (1, "gelu_tanh_"),
    "gpt_neox": (1, "gelu_"),
    "falcon": (1, "gelu_"),
}


@dataclass(frozen=True)
class Result:
    all_reduces: int
    kernels: tuple[str, ...]
    errors: tuple[float, ...]
    """Max |logits - unsharded eager| per sequence length."""


def _run(family: str) -> Result:
    model = small_model(family, layers=LAYERS)  # seeded: the same weights on every rank
    ids = torch.randint(1, 1000, (1, max(SEQ_LENS)), generator=torch.Generator().manual_seed(0))
    ep = export_with_ids(model, ids[:, : SEQ_LENS[0]], max_seq=64)
    gm = ad_mlir.compile(ep, pipeline=f"canonicalize,shard{{world-size={WORLD}}},default")
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    errors = []
    for seq in SEQ_LENS:
        with torch.no_grad():
            errors.append((gm(ids[:, :seq])[0] - model(input_ids=ids[:, :seq]).logits).abs().max().item())
    return Result(targets.count(ALL_REDUCE), tuple(graph_kernels(gm)), tuple(errors))


def _families_on_rank(rank: int) -> dict[str, Result]:
    # the kernels run (in the Triton interpreter without CUDA: conftest's environment is inherited),
    # never their reference semantics, and no op is left without a kernel (tests/kernel_guard.py)
    with pytest.MonkeyPatch.context() as patch, kernels_ran(patch):
        return {family: _run(family) for family in EXPECTED}


def test_parallel_blocks_sharded_on_two_gloo_ranks_match_unsharded_logits() -> None:
    results = run_on_ranks(_families_on_rank, WORLD, timeout_s=400)
    for rank, by_family in results.items():
        for family, result in by_family.items():
            reductions, activation = EXPECTED[family]
            assert result.all_reduces == reductions * LAYERS, (rank, family, result.all_reduces)
            activations = [k for k in result.kernels if k.startswith(activation)]
            assert len(activations) == LAYERS, (rank, family, result.kernels)
            # fp32: only the order of the hidden-unit sums differs (two partial sums, then
            # theirs); torch.testing's fp32 atol, on logits of magnitude ~1
            assert max(result.errors) < 1e-5, (rank, family, result.errors)
