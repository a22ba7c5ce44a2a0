"""`ad_mlir.compile` with the default pipeline (canonicalize, decompose, fuse-elementwise)
on the five HF families matches eager within the dtype's tolerance.

Tolerances are torch.testing's defaults for the dtype (fp32: rtol 1.3e-6, atol 1e-5; bf16:
rtol 1.6e-2, atol 1e-5): the pipeline only reorders float math where it decomposes softmax
(exp(x - max) / sum instead of torch's fused kernel), so fp32 results stay within a few ulp.
Fused regions run as their ops' torch calls until Triton codegen lands."""

from __future__ import annotations

import pytest
import torch

import ad_mlir
from ad_mlir.dialects import ad
from ad_mlir.frontends.fx_import import import_program
from ad_mlir.models import FAMILIES, example_input_ids
from ad_mlir.passes.pipeline import run_pipeline


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_default_pipeline_matches_eager(exported, family: str, dtype: str) -> None:
    cfg, ep = exported(family, dtype, False)
    gm = ad_mlir.compile(ep)
    for seq in (6, 13):
        ids = example_input_ids(cfg, seq, seed=seq)
        with torch.no_grad():
            expected = ep.module()(input_ids=ids).logits
            got = gm(ids)[0]
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_default_pipeline_fuses_norms_and_mlp(exported, family: str) -> None:
    _, ep = exported(family, "float32", False)
    program = import_program(ep)
    run_pipeline(program.module, "default")
    top = list(program.function.body.block.ops)
    fused = [op for op in top if isinstance(op, ad.FusedOp)]
    # Per layer: input norm, add + post-attention norm (2 outputs), the MLP's act * up; then the
    # final add + norm. Each is one region holding its row reduction or activation.
    row_regions = [f for f in fused if any(isinstance(o, ad.MeanOp) for o in f.body.block.ops)]
    assert len(row_regions) >= 3
    assert any(len(f.outputs) == 2 for f in row_regions)
    assert not any(isinstance(op, ad.MeanOp | ad.RsqrtOp) for op in top)
