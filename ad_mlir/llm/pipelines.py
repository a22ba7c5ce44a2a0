"""The pipelines `LLM` compiles: the user's pipeline with `insert-cached-attention` spliced in,
in the slot form (`cached_pipeline`) or the paged one (`paged_pipeline`)."""

from __future__ import annotations

from pathlib import Path

CACHE_BEFORE = ("decompose", "fuse-elementwise")
"""`insert-cached-attention` goes before the first of these passes."""


def cached_pipeline(pipeline: str | Path, max_batch: int, max_seq_len: int) -> str:
    """`pipeline` with `insert-cached-attention` spliced in before its first `decompose` or
    `fuse-elementwise` (`default` counts as the passes it runs), else appended. So it runs after
    `shard` (each rank's caches get its local K/V heads), `quantize-linear-fp8` and the LLM
    fusions (it rewrites the fused attention), and before regions form (the dropped mask's ops
    are gone by then)."""
    from ad_mlir.passes.pipeline import PIPELINES, resolve_pipeline

    insert = f"insert-cached-attention{{max-batch={max_batch} max-seq-len={max_seq_len} logits-indices=true}}"
    passes = [q for p in split_spec(resolve_pipeline(pipeline))
              for q in (split_spec(PIPELINES["default"]) if p == "default" else [p])]
    names = [p.split("{", 1)[0].strip() for p in passes]
    at = next((i for i, name in enumerate(names) if name in CACHE_BEFORE), len(passes))
    return ",".join([*passes[:at], insert, *passes[at:]])


def paged_pipeline(pipeline: str | Path, page_size: int, num_pages: int, max_seq_len: int, max_batch: int = 8) -> str:
    """`cached_pipeline` with the paged, flattened form of `insert-cached-attention`: pools of
    `num_pages` pages of `page_size` tokens, masks evaluated at `max_seq_len` tokens, and
    `max_batch` slots in the pools of per-sequence states (convolutions', scans') where the
    model has such states."""
    slot_form = cached_pipeline(pipeline, 1, max_seq_len)
    return slot_form.replace(
        f"insert-cached-attention{{max-batch=1 max-seq-len={max_seq_len} logits-indices=true}}",
        f"insert-cached-attention{{max-batch={max_batch} max-seq-len={max_seq_len} paged=true page-size={page_size} "
        f"num-pages={num_pages}}}")


def split_spec(spec: str) -> list[str]:
    """An xDSL pass string's passes (`a{x=1,2},b` -> `a{x=1,2}`, `b`: commas inside options stay)."""
    passes, depth, start = [], 0, 0
    for i, ch in enumerate(spec):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            passes.append(spec[start:i].strip())
            start = i + 1
    passes.append(spec[start:].strip())
    return [p for p in passes if p]
