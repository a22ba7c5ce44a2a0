"""The pipelines `LLM` compiles: the user's pipeline with the cache insertion pass put in, in the
slot form (`cached_pipeline`) or the paged one (`paged_pipeline`), as pass objects."""

from __future__ import annotations

from xdsl.passes import ModulePass

from ad_mlir.passes.capture_hidden_states import CaptureHiddenStatesPass
from ad_mlir.passes.insert_cached_attention import InsertCachedAttentionPass
from ad_mlir.passes.pipeline import Pipeline, PipelineConfig, expand_passes, load_pipeline

CACHE_BEFORE = ("decompose", "fuse-elementwise")
"""`insert-cached-attention` goes before the first of these passes."""


def cached_pipeline(pipeline: Pipeline, max_batch: int, max_seq_len: int, kv_cache_dtype: str = "auto") -> PipelineConfig:
    """`pipeline` with `insert-cached-attention` in the slot form (`max_batch` slots of
    `max_seq_len` tokens, the LM head on the `logits_indices` tokens) before its first
    `decompose` or `fuse-elementwise` (`default` counts as the passes it runs), else at its end.
    So it runs after `shard` (each rank's caches get its local K/V heads), `quantize-linear-fp8`
    and the LLM fusions (it rewrites the fused attention), and before regions form (the dropped
    mask's ops are gone by then). `kv_cache_dtype`: the pass's `kv-cache-dtype` (`fp8`: e4m3
    K/V caches)."""
    return with_cache_pass(pipeline, InsertCachedAttentionPass(max_batch=max_batch, max_seq_len=max_seq_len,
                                                               logits_indices=True, kv_cache_dtype=kv_cache_dtype))


def paged_pipeline(pipeline: Pipeline, page_size: int, num_pages: int, max_seq_len: int,
                   max_batch: int = 8, kv_cache_dtype: str = "auto") -> PipelineConfig:
    """`pipeline` with the paged, flattened form of `insert-cached-attention`, placed as in
    `cached_pipeline`: pools of `num_pages` pages of `page_size` tokens, masks evaluated at
    `max_seq_len` tokens, and `max_batch` slots in the pools of per-sequence states
    (convolutions', scans') where the model has such states; `kv_cache_dtype` as there."""
    return with_cache_pass(pipeline, InsertCachedAttentionPass(max_batch=max_batch, max_seq_len=max_seq_len, paged=True,
                                                               page_size=page_size, num_pages=num_pages,
                                                               kv_cache_dtype=kv_cache_dtype))


def with_cache_pass(pipeline: Pipeline, cache_pass: ModulePass) -> PipelineConfig:
    """`pipeline`'s passes (`default` as the passes it runs) with `cache_pass` before the first of
    `CACHE_BEFORE`, else last; a YAML file's `skip_on_error` kept."""
    config = load_pipeline(pipeline)
    passes = expand_passes(config.passes)
    at = next((i for i, p in enumerate(passes) if p.name in CACHE_BEFORE), len(passes))
    return PipelineConfig((*passes[:at], cache_pass, *passes[at:]), config.skip_on_error)


def with_capture(config: PipelineConfig, layers: tuple[int, ...]) -> PipelineConfig:
    """`config` with `capture-hidden-states` of `layers` first (before the fusions, which keep
    the captured residual adds' sums), or as it is without layers."""
    if not layers:
        return config
    return PipelineConfig((CaptureHiddenStatesPass(layers=layers), *config.passes), config.skip_on_error)
