"""`ad_mlir.compile` with the default pipeline on the five HF families matches eager, with
every fused region run as its generated Triton kernel (in the Triton interpreter on CPU).

fp32: torch.testing's defaults (rtol 1.3e-6, atol 1e-5). The kernels compute in fp32 like
eager and only reorder sums (row reductions, the softmax decomposition), a few ulp.

bf16: eager rounds every op's result to bf16, the kernels keep fp32 between ops and round
once at each store (the interpreter even truncates there), so the two disagree by a few bf16
ulps that the following GEMMs spread over the logits. Elementwise closeness to eager is not
the right measure; closeness to the truth is. Both are compared with the same model in fp32
(`report.low_precision_bound`): the compiled graph's error must be at most twice eager bf16's
own error, plus one bf16 ulp (2^-8) of the logits' largest magnitude."""

from __future__ import annotations

import pytest
import torch

import ad_mlir
from ad_mlir.dialects import ad
from ad_mlir.frontends.fx_import import import_program
from ad_mlir.models import FAMILIES, TinyConfig, build_model, example_input_ids
from ad_mlir.passes.pipeline import run_pipeline
from ad_mlir.report import low_precision_bound
from ad_mlir.runtime import kernels


def _kernel_calls(gm: torch.fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and str(n.target).startswith("ad_mlir."))


@pytest.fixture
def no_reference_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail if a region runs as its torch reference instead of its Triton kernel."""

    def refuse(*_: object) -> None:
        raise AssertionError("a region ran its reference semantics, not its kernel")

    monkeypatch.setattr(kernels, "run_block", refuse)


@pytest.mark.usefixtures("no_reference_fallback")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_compiled_kernels_match_eager(exported, family: str, dtype: str) -> None:
    cfg, ep = exported(family, dtype, False)
    gm = ad_mlir.compile(ep)
    assert _kernel_calls(gm) >= 4  # two norms, the MLP activation, the final norm at least
    truth_model = build_model(TinyConfig(family=family, layers=1, dtype="float32"))
    for seq in (6, 13):
        ids = example_input_ids(cfg, seq, seed=seq)
        with torch.no_grad():
            expected = ep.module()(input_ids=ids).logits
            got = gm(ids)[0]
            truth = truth_model(input_ids=ids).logits
        assert got.dtype == expected.dtype and got.shape == expected.shape
        if dtype == "float32":
            torch.testing.assert_close(got, expected)
            continue
        our_error = (got.float() - truth).abs().max().item()
        bound = low_precision_bound(expected, truth)
        assert our_error <= bound, f"bf16 error {our_error:.3g} against the fp32 model, bound {bound:.3g}"


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
