"""Generation composed with `shard`: two gloo ranks (spawned on 127.0.0.1, bounded in time) each
generate greedily through `ad_mlir.LLM` with `canonicalize,shard{world-size=2},default` (the
example's `--generate` mode), every kernel in the Triton interpreter with the reference fallback
refused. Every rank's tokens must equal one unsharded LLM's and HF's `generate`, and each rank's
caches must hold its local K/V heads. Plus where `insert-cached-attention` goes in a pipeline, and `LLM`'s world_size/rank without a process group."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gloo_ranks import run_on_ranks

import ad_mlir
from ad_mlir.examples.tp import PROMPTS, GenerateResult, generate_rank
from ad_mlir.llm.pipelines import cached_pipeline, paged_pipeline
from ad_mlir.passes.canonicalize import CanonicalizePass
from ad_mlir.passes.fuse_elementwise import FuseElementwisePass
from ad_mlir.passes.fuse_rope_attention import FuseRopeAttentionPass
from ad_mlir.passes.insert_cached_attention import InsertCachedAttentionPass
from ad_mlir.passes.quantize_linear_fp8 import QuantizeLinearFp8Pass
from ad_mlir.passes.shard import ShardPass
from ad_mlir.runtime import kernels
from ad_mlir.zoo.tiny import TinyConfig, build_model

WORLD = 2
NEW_TOKENS = 4
"""Tokens per prompt: each rank's prefill and three decode steps in the interpreter (more repeat
the same kernels: CI time)."""
# hidden 128: 4 query heads and 2 K/V heads of 32, so 1 K/V head per rank
CFG = TinyConfig(family="llama", layers=2, hidden_size=128)
SHARDED = "canonicalize,shard{world-size=2},default"


def _refuse_reference(*_: object) -> None:
    raise AssertionError("a region ran its reference semantics, not its kernel")


def _generate_on_rank(rank: int) -> GenerateResult:
    kernels.run_reference = _refuse_reference  # a spawned process: nothing to restore
    return generate_rank(CFG, max_new_tokens=NEW_TOKENS)


def _hf_tokens(model: torch.nn.Module, prompt: tuple[int, ...]) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, use_cache=True)
    return out[0, len(prompt):].tolist()


def test_sharded_generation_on_two_gloo_ranks_matches_unsharded_and_hf() -> None:
    results = run_on_ranks(_generate_on_rank, WORLD, timeout_s=300)
    model = build_model(CFG)
    hf = [_hf_tokens(model, p) for p in PROMPTS]
    local_kv_heads = model.config.num_key_value_heads // WORLD
    for rank, result in results.items():
        assert (result.rank, result.world_size) == (rank, WORLD)
        assert result.unsharded == hf, "the unsharded LLM differs from HF"
        assert result.tokens == hf, (rank, result.tokens)
        assert len(result.kv_heads) == 2 * CFG.layers  # K and V per layer
        assert set(result.kv_heads.values()) == {local_kv_heads}, (rank, result.kv_heads)


def test_cache_insertion_goes_after_shard_and_fusions_and_before_regions() -> None:
    insert = InsertCachedAttentionPass(max_batch=2, max_seq_len=64, logits_indices=True)
    passes = cached_pipeline("canonicalize,shard{world-size=2 shard-layers=attention,mlp},default", 2, 64).passes
    assert passes[:2] == (CanonicalizePass(), ShardPass(world_size=2, shard_layers=("attention", "mlp")))
    at = passes.index(insert)
    assert [p.name for p in passes[at - 1:at + 3]] == ["optimize-rope", insert.name, "decompose", "fuse-elementwise"]
    assert [p.name for p in passes].count(insert.name) == 1
    assert cached_pipeline("quantize-linear-fp8,fuse-elementwise", 2, 64).passes == (
        QuantizeLinearFp8Pass(), insert, FuseElementwisePass())
    assert cached_pipeline("canonicalize,fuse-rope-attention", 2, 64).passes == (
        CanonicalizePass(), FuseRopeAttentionPass(), insert)


def test_the_paged_pipeline_keeps_a_yaml_files_skip_on_error(tmp_path: Path) -> None:
    config = tmp_path / "p.yaml"
    config.write_text("skip_on_error: false\ntransforms:\n  canonicalize: {}\n  fuse_elementwise: {}\n")
    pipeline = paged_pipeline(config, page_size=8, num_pages=4, max_seq_len=32, max_batch=2)
    assert pipeline.passes == (CanonicalizePass(), InsertCachedAttentionPass(
        max_batch=2, max_seq_len=32, paged=True, page_size=8, num_pages=4), FuseElementwisePass())
    assert pipeline.skip_on_error is False


def test_world_size_and_rank_reach_the_compiler_without_a_process_group() -> None:
    """Compiling rank 1's graph of 2 needs world_size=2 (the default, 1 without a process group, is
    refused: the weights' shards would not cover them); its caches hold 1 of the 2 K/V heads."""
    model = build_model(CFG)
    llm = ad_mlir.LLM(model, max_batch=1, max_seq_len=16, pipeline=SHARDED, world_size=WORLD, rank=1)
    assert {c.shape for c in llm.caches.values()} == {(1, 16, 1, 32)}
    with pytest.raises(ValueError, match="rank 2 is not in a world of 2"):
        ad_mlir.LLM(model, max_batch=1, max_seq_len=16, pipeline=SHARDED, world_size=WORLD, rank=2)
