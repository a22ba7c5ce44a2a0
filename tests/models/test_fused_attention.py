"""Models whose attention the default pipeline fuses into one `ad.rope_attention` with its
masking (sliding window), Gemma2's soft cap or Qwen3's / Gemma3's QK-norm inside, against eager,
with every kernel run in the Triton interpreter (the reference fallback made to fail).

The families sweep builds these models with their config's windows (4096 keys), which a short
test never leaves: here the windows are a few tokens, so the 11-token sequences reach past them
and a kernel that ignored the window would be seen (measured: without the window the logits
differ from eager by over 0.1).

fp32, torch.testing's defaults (rtol 1.3e-6, atol 1e-5) on the logits: the kernels compute in
fp32 like eager and only reorder sums."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from capped_gemma2 import capped_gemma2
from xdsl.ir import Operation

from ad_mlir.codegen.cache import KernelCache
from ad_mlir.dialects import ad
from ad_mlir.frontends.export import export_with_ids
from ad_mlir.frontends.fx_import import import_program
from ad_mlir.passes.pipeline import run_pipeline
from ad_mlir.runtime import kernels
from ad_mlir.runtime.fx_export import export_program
from ad_mlir.runtime.kernels import build_kernels
from ad_mlir.zoo.small import small_model
from ad_mlir.zoo.tiny import TinyConfig, build_model

SEQ_LENS = (5, 11)


@pytest.fixture
def no_reference_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise AssertionError("a region ran its reference semantics, not its kernel")

    monkeypatch.setattr(kernels, "run_reference", refuse)


def _compiled(model: torch.nn.Module) -> tuple[torch.fx.GraphModule, list[Operation]]:
    """The default pipeline's graph of `model` and the ops of its module."""
    ids = torch.randint(1, model.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    program = import_program(export_with_ids(model, ids, max_seq=64))
    run_pipeline(program.module, "default")
    ops = list(program.module.walk())
    return export_program(program, build_kernels(program.module, KernelCache()), fold_weights=True), ops


def _attentions(ops: list[Operation]) -> list[Operation]:
    return [op for op in ops if op.name in ("ad.rope_attention", "ad.attention", "ad.softmax")]


def _assert_matches_eager(model: torch.nn.Module, gm: Callable) -> None:
    for seq in SEQ_LENS:
        ids = torch.randint(1, model.config.vocab_size, (1, seq), generator=torch.Generator().manual_seed(seq))
        with torch.no_grad():
            torch.testing.assert_close(gm(ids)[0], model(input_ids=ids).logits)


@pytest.mark.usefixtures("no_reference_fallback")
def test_mistral_sliding_window_is_the_kernels() -> None:
    model = build_model(TinyConfig(family="mistral"))
    model.config.sliding_window = 4
    gm, ops = _compiled(model)
    attentions = _attentions(ops)
    assert [op.window.value.data if op.window else None for op in attentions] == [4, 4]
    assert all(op.attn_mask is None and op.is_causal is not None for op in attentions)
    _assert_matches_eager(model, gm)


GEMMA2_WINDOW, GEMMA2_SOFTCAP, GEMMA2_QK_GAIN = 4, 2.0, 12.0


@pytest.mark.usefixtures("no_reference_fallback")
def test_gemma2_soft_capped_sliding_attention_is_the_kernels() -> None:
    """Gemma2's eager soft-capped attention fused: as built, its scores stay far under the cap
    of 50 (random init); Q and K scaled by 12 give scores up to ~5 against a cap of 2, in a
    window of 4 (layer 0; layer 1 is global). Without the cap or the window the logits differ
    from eager by over 0.1 (measured)."""
    model = capped_gemma2(GEMMA2_WINDOW, GEMMA2_SOFTCAP, GEMMA2_QK_GAIN)
    gm, ops = _compiled(model)
    attentions = _attentions(ops)
    assert [(op.name, op.window and op.window.value.data, op.softcap and op.softcap.value.data)
            for op in attentions] == [("ad.rope_attention", 4, 2.0), ("ad.rope_attention", None, 2.0)]
    _assert_matches_eager(model, gm)


@pytest.mark.usefixtures("no_reference_fallback")
def test_qwen3_qk_norm_is_the_kernels() -> None:
    """Qwen3's per-head QK-norm in the attention kernel: no separate norm kernel is left for it
    (the layer's own norms only) and the logits are eager's."""
    model = small_model("qwen3", layers=2)
    gm, ops = _compiled(model)
    attentions = _attentions(ops)
    assert [op.q_norm_weight is not None for op in attentions] == [True, True]
    assert [op.location.desc.data for op in ops if isinstance(op, ad.RmsNormOp)] == ["model.layers.0.input_layernorm"]
    _assert_matches_eager(model, gm)


@pytest.mark.usefixtures("no_reference_fallback")
def test_gemma3_qk_norm_and_sliding_window_are_the_kernels() -> None:
    """Gemma3's QK-norm (`1 + w` form) in a sliding window of 3 keys (the layers are sliding
    ones; measured: without the window the logits differ from eager by over 0.1)."""
    model = small_model("gemma3_text", layers=2)
    model.config.sliding_window = 3
    for layer in model.model.layers:
        if layer.self_attn.sliding_window is not None:
            layer.self_attn.sliding_window = 3
    gm, ops = _compiled(model)
    attentions = _attentions(ops)
    assert [(op.window and op.window.value.data, op.q_norm_weight is not None) for op in attentions] == [(3, True)] * 2
    _assert_matches_eager(model, gm)
