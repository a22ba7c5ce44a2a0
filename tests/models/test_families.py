"""A sample of the family sweep (`ad_mlir/families.py`; the full sweep is `ad-bench --parts
families`): causal LMs of different shapes built small from their HF config classes, exported
with a dynamic sequence length, compiled with the default pipeline and run against eager at two
sequence lengths, with the kernels as their torch reference and in the Triton interpreter.
The families the sweep found broken are here as regression tests.

fp32, torch.testing's defaults (rtol 1.3e-6, atol 1e-5) on the logits: the kernels compute in
fp32 like eager and only reorder sums."""

from __future__ import annotations

import pytest

from ad_mlir.families import SEQ_LENS, sweep_family

SAMPLE = {
    "mpt": "ALiBi bias typed `?` where it is 1 at run time: its kernel read out of bounds (wrong logits)",
    "glm": "partial rotary, interleaved: a region's reference path returned a view of its input",
    "glm4": "GLM's rotary with extra post-norms: the same aliasing crash",
    "bloom": "ALiBi on a [batch*heads] layout, LayerNorm after the embedding",
    "gpt2": "LayerNorm, GELU (tanh), Conv1D projections, learned positions",
    "gpt_neox": "partial rotary, parallel attention + MLP",
    "phi": "partial rotary, LayerNorm, one norm feeding attention and MLP",
    "falcon": "fused QKV, multi-query attention",
    "opt": "learned positions with an offset, ReLU MLP",
    "qwen3": "QK-norm before RoPE",
    "olmo2": "norms after attention and MLP, QK-norm over the projection",
    "starcoder2": "LayerNorm with biases, GELU MLP, sliding window",
    "mixtral": "MoE: top-k routing, experts as grouped matmuls",
    "gemma3_text": "sliding-window and global layers, QK-norm, gated GELU",
}
"""Family -> the shape it brings (or the defect it held)."""


@pytest.mark.parametrize("family", sorted(SAMPLE))
def test_family_compiles_and_matches_eager(family: str) -> None:
    row = sweep_family(family)
    assert row.status == "ok", f"{family} ({SAMPLE[family]}): {row.status}: {row.reason}"
    assert sorted(row.reference_error) == sorted(row.interpreter_error) == sorted(SEQ_LENS), "both paths ran"
    assert row.kernel_calls > 0, "no kernel of ours in the compiled graph: the interpreter path checked nothing"
    assert row.kernels_after is not None and row.kernels_after < row.kernels_before, "the pipeline fused nothing"
