"""The `shard` pass on real HF graphs: two gloo ranks (spawned, on 127.0.0.1, bounded in time)
each compile tiny Llama/Qwen2/Mistral (and a LayerNorm family, OPT) with `canonicalize,shard{world-size=2},default` and run
their shard; the logits must match the unsharded eager model's (fp32). Plus the pass's
configuration (YAML), its log for layers it leaves whole, and a world size that does not fit."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import pytest
import torch
from gloo_ranks import run_on_ranks
from kernel_guard import graph_kernels, kernels_ran
from xdsl.parser import Parser

import ad_mlir
from ad_mlir.examples.tp import RankResult, run_rank
from ad_mlir.frontends.export import export_model
from ad_mlir.passes.pipeline import load_pipeline, make_context, run_pipeline
from ad_mlir.passes.shard import ShardPass
from ad_mlir.semantics.weights import ShardError
from ad_mlir.zoo.tiny import TinyConfig, build_model

WORLD = 2
LAYERS = 2
FAMILIES = ("llama", "qwen2", "mistral")


def _families_on_rank(families: tuple[str, ...], rank: int) -> dict[str, RankResult]:
    # the kernels run (in the Triton interpreter without CUDA: conftest's environment is inherited),
    # never their reference semantics, and no op is left without a kernel (tests/kernel_guard.py)
    with pytest.MonkeyPatch.context() as patch, kernels_ran(patch):
        # hidden 128: 4 query heads and 2 key/value heads of 32, two of each per rank
        return {f: run_rank(TinyConfig(family=f, layers=LAYERS, hidden_size=128), seq_lens=(5, 12)) for f in families}


def test_sharded_llama_qwen2_mistral_match_unsharded_logits_on_two_gloo_ranks() -> None:
    results = run_on_ranks(functools.partial(_families_on_rank, FAMILIES), WORLD, timeout_s=300)
    for rank, by_family in results.items():
        for family, result in by_family.items():
            assert (result.rank, result.world_size) == (rank, WORLD)
            assert result.all_reduces == 2 * LAYERS, (family, result)  # after o_proj and down_proj
            # the fusions still fire on the local shapes, as kernels
            for kernel in ("rope_attention", "add_rms_norm", "silu_and_mul"):
                assert sum(kernel in k for k in result.kernels) >= LAYERS, (family, kernel, result.kernels)
            # fp32: only the order of the hidden-unit sums differs (two partial sums, then theirs);
            # torch.testing's fp32 atol, on logits of magnitude ~1
            assert result.verdict != "OUT OF TOLERANCE" and max(result.errors.values()) < 1e-5, (family, result)


def _layer_norm_family_on_rank(family: str, rank: int) -> tuple[float, tuple[str, ...], int]:
    """This rank's max |logits error| against the unsharded eager model, its kernels and its
    all_reduce count, for a family built small from its HF config (same seed on every rank)."""
    from ad_mlir.examples.tp import ALL_REDUCE
    from ad_mlir.frontends.export import export_with_ids
    from ad_mlir.tools.report import max_abs_error
    from ad_mlir.zoo.small import small_model

    model = small_model(family, layers=1)
    ids = torch.randint(1, 1000, (1, 9), generator=torch.Generator().manual_seed(5))
    with pytest.MonkeyPatch.context() as patch, kernels_ran(patch):
        gm = ad_mlir.compile(export_with_ids(model, ids, max_seq=64), pipeline=f"canonicalize,shard{{world-size={WORLD}}},default")
        with torch.no_grad():
            error = max_abs_error([model(input_ids=ids).logits], [gm(ids)[0]])
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    return error, tuple(graph_kernels(gm)), targets.count(ALL_REDUCE)


def test_sharded_opt_keeps_its_layer_norms_whole_and_fused_on_two_gloo_ranks() -> None:
    """One-layer OPT (LayerNorm with bias, q/k/v/out_proj and fc1/fc2 linears): the attention
    and MLP blocks are sharded, the norms replicated (a sharded norm weight would not fit the
    whole hidden size), and each residual add still joins its norm, on the all-reduced sum.
    fp32, the same tolerance as the Llamas'."""
    results = run_on_ranks(functools.partial(_layer_norm_family_on_rank, "opt"), WORLD, timeout_s=300)
    for error, kernel_names, all_reduces in results.values():
        assert all_reduces == 2  # after out_proj and fc2
        assert sum("add_layer_norm" in k for k in kernel_names) == 3, kernel_names  # both norms and the final one
        assert error < 1e-5


def test_yaml_config_names_world_size_and_layer_kinds(tmp_path: Path) -> None:
    path = tmp_path / "tp.yaml"
    path.write_text("transforms:\n  canonicalize: {}\n  shard: {world_size: 2, shard_layers: [attention, mlp]}\n")
    passes = load_pipeline(path).passes
    assert passes[1] == ShardPass(world_size=2, shard_layers=("attention", "mlp"))


LEFT_WHOLE = """
func.func @forward(%x: tensor<4x8xf32> {ad.input = "x"}, %w1: tensor<16x8xf32> {ad.param = "w1"},
                   %w2: tensor<8x16xf32> {ad.param = "w2"}, %w3: tensor<16x8xf32> {ad.param = "w3"},
                   %c: tensor<16xf32> {ad.param = "c"}, %w4: tensor<8x16xf32> {ad.param = "w4"})
                   -> (tensor<4x16xf32>, tensor<4x8xf32>, tensor<4x8xf32>) {
  %h1 = ad.linear %x, %w1 : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32> loc("a.up")
  %o1 = ad.linear %h1, %w2 : (tensor<4x16xf32>, tensor<8x16xf32>) -> tensor<4x8xf32> loc("a.down")
  %h3 = ad.linear %x, %w3 : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32> loc("b.up")
  %a3 = ad.add %h3, %c : tensor<4x16xf32>, tensor<16xf32> -> tensor<4x16xf32>
  %o3 = ad.linear %a3, %w4 : (tensor<4x16xf32>, tensor<8x16xf32>) -> tensor<4x8xf32> loc("b.down")
  func.return %h1, %o1, %o3 : tensor<4x16xf32>, tensor<4x8xf32>, tensor<4x8xf32>
}
"""


def test_layers_left_whole_say_why_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    module = Parser(make_context(), LEFT_WHOLE).parse_module()
    before = str(module)
    with caplog.at_level(logging.INFO, logger="ad_mlir.passes.shard"):
        run_pipeline(module, "shard{world-size=2}")
    assert str(module) == before
    assert "shard: a.up stays replicated: its result reaches the function's results" in caplog.messages
    assert "shard: a.down stays replicated: its result reaches the function's results" in caplog.messages
    assert "shard: b stays replicated: ad.add reads %c whole along the split dim" in caplog.messages
    assert "shard: 0 of 1 blocks sharded over 2 ranks, 0 all_reduce" in caplog.messages


def test_a_rank_graph_for_another_world_size_is_refused() -> None:
    cfg = TinyConfig(layers=1, hidden_size=128)
    ep = export_model(build_model(cfg))
    with pytest.raises(ShardError, match=r"weight 'model.layers.0.self_attn.q_proj.weight' has 128 along dim 0, "
                                         r"but its shard of 64 on each of 4 ranks covers 256"):
        ad_mlir.compile(ep, pipeline="canonicalize,shard{world-size=2}", world_size=4, rank=0)


def test_world_size_one_compiles_the_unsharded_graph() -> None:
    cfg = TinyConfig(layers=1, hidden_size=128)
    model = build_model(cfg)
    gm = ad_mlir.compile(export_model(model), pipeline="canonicalize,shard{world-size=1},default")
    assert not any("all_reduce" in str(n.target) for n in gm.graph.nodes)
    ids = torch.randint(0, cfg.vocab_size, (1, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(gm(ids)[0], model(input_ids=ids).logits)


UNLOCATED = """
func.func @forward(%x: tensor<4x8xf32> {ad.input = "x"}, %w1: tensor<16x8xf32> {ad.param = "w1"},
                   %w2: tensor<8x16xf32> {ad.param = "w2"}, %w3: tensor<16x8xf32> {ad.param = "w3"})
                   -> (tensor<4x8xf32>, tensor<4x16xf32>) {
  %h = ad.linear %x, %w1 : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32>
  %0 = ad.linear %h, %w2 : (tensor<4x16xf32>, tensor<8x16xf32>) -> tensor<4x8xf32>
  %1 = ad.linear %x, %w3 : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32>
  func.return %0, %1 : tensor<4x8xf32>, tensor<4x16xf32>
}
"""


def test_the_log_names_ops_without_a_location_by_their_value_or_their_op(caplog: pytest.LogCaptureFixture) -> None:
    """No module path to name them by (IR written by hand): a linear is named by its value (%h),
    or, unnamed (%1), by its op."""
    module = Parser(make_context(), UNLOCATED).parse_module()
    with caplog.at_level(logging.INFO, logger="ad_mlir.passes.shard"):
        run_pipeline(module, "shard{world-size=2}")
    assert "shard: ad.linear stays replicated: its result reaches the function's results" in caplog.messages
    assert any("%h column-wise" in m for m in caplog.messages), caplog.messages
    assert "shard: 1 of 1 blocks sharded over 2 ranks, 1 all_reduce" in caplog.messages
