"""HF methods that `export_patches.METHODS` replaces while the project exports: MoE blocks that
loop over the experts their routing hit (DBRX, LongCat-Flash with its zero-compute experts) run
every expert on every token, CPM-Ant's attention mask comes from `torch.arange`. The exported
program equals HF's eager forward, at another length than it was traced at, and HF's own method
is back after the export."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_generate import PROMPTS, _assert_step_logits_match, _hf_tokens

import ad_mlir
from ad_mlir.frontends.export import export_with_ids
from ad_mlir.frontends.export_patches import routed_for_export
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.zoo.small import model_from_config, small_config


@pytest.mark.parametrize(("family", "experts"), [("dbrx", "DbrxExperts"), ("longcat_flash", "LongcatFlashExperts")])
def test_moe_with_a_loop_over_hit_experts_exports_and_equals_eager(family: str, experts: str) -> None:
    config = small_config(family)
    config.initializer_range = 0.5  # routing weights far from uniform: a wrong weight shows
    model = model_from_config(config)
    cls = next(type(m) for m in model.modules() if type(m).__name__ == experts)
    hf_forward = cls.forward
    with routed_for_export() as routed:
        assert f"{cls.__module__}.{experts}.forward" in routed and cls.forward is not hf_forward
    assert cls.forward is hf_forward
    ids = torch.randint(1, 1000, (1, 11), generator=torch.Generator().manual_seed(0))
    ep = export_with_ids(model, ids[:, :5], max_seq=64)
    assert cls.forward is hf_forward
    picked: list[torch.Tensor] = []
    for m in model.modules():
        if type(m) is cls:
            m.register_forward_pre_hook(lambda _, args: picked.append(args[1]))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        with routed_for_export():
            dense = model(input_ids=ids).logits
        got = ep.module()(input_ids=ids).logits
    torch.testing.assert_close(got, dense)  # the export of the dense form: the same fp32 ops
    # the dense form against HF's: the same sums in HF's order (plus exact zeros), but the expert
    # matmuls run on every row where HF's run on the routed rows, and BLAS rounds a row another way
    # with another row count; a few ulps, grown through 2 layers with the wide init (measured: 11
    # ulps of the largest logit for DBRX, 3 for LongCat); a wrong weight or expert is O(logits)
    largest = expected.abs().max().item()
    torch.testing.assert_close(dense, expected, rtol=0, atol=32 * torch.finfo(torch.float32).eps * largest)
    hit = torch.cat([p.flatten() for p in picked]).unique()
    assert len(hit) > 2  # several experts were hit, not all tokens routed alike
    if family == "longcat_flash":  # a zero-compute expert was among them
        assert (hit >= config.n_routed_experts).any()


def test_cpmant_exports_with_its_attention_mask_from_arange() -> None:
    """HF's mask makes a tensor of a Python list of the positions, which fixed the length at
    export ("specialized it to be a constant"); the replacement's mask is HF's, element for element."""
    from transformers.models.cpmant.modeling_cpmant import CpmAntModel

    model = model_from_config(small_config("cpmant"))
    hf_mask = CpmAntModel._prepare_attention_mask
    ids = torch.randint(1, 1000, (2, 11), generator=torch.Generator().manual_seed(0))
    seqlen = model.cpmant.prompt_length + 11  # what its forward masks: the prompt's positions, then the ids
    prompted = torch.randint(1, 1000, (2, seqlen), generator=torch.Generator().manual_seed(1))
    span, context = torch.zeros_like(prompted), torch.ones_like(prompted)
    context[1, -4:] = 0  # a second sequence with a causal tail, and left padding in it
    length = torch.tensor([seqlen, seqlen - 5])
    with routed_for_export():
        mask = model.cpmant._prepare_attention_mask(prompted, span, context, length)
    assert CpmAntModel._prepare_attention_mask is hf_mask
    assert torch.equal(mask, hf_mask(model.cpmant, prompted, span, context, length))
    assert not mask.all() and mask.any()
    ep = export_with_ids(model, ids[:1, :5], max_seq=64)
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(input_ids=ids[:1]).logits, model(input_ids=ids[:1]).logits)


def test_llama4s_moe_exports_with_its_experts_inline() -> None:
    """HF's round trip of the experts' output through [experts * tokens, hidden] fixed the length at
    export (`seq * min(128, 128 * seq) == 128 * seq`); inline, the same ops export and equal eager."""
    from transformers.models.llama4.modeling_llama4 import Llama4TextMoe

    config = small_config("llama4_text")
    config.initializer_range = 0.5  # routing scores far from uniform: a wrong expert or score shows
    model = model_from_config(config)
    hf_forward = Llama4TextMoe.forward
    ids = torch.randint(1, 1000, (1, 11), generator=torch.Generator().manual_seed(0))
    ep = export_with_ids(model, ids[:, :5], max_seq=64)
    assert Llama4TextMoe.forward is hf_forward
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        with routed_for_export():
            inline = model(input_ids=ids).logits
        got = ep.module()(input_ids=ids).logits
    torch.testing.assert_close(inline, expected, rtol=0, atol=0)  # the same ops on the same values
    torch.testing.assert_close(got, expected)


def test_zaya_exports_with_its_delayed_values_from_a_full_slice() -> None:
    """HF's slice of seq - 1 delayed values fixed the length at export (`seq - 1 != 1`); the
    replacement (no cache) computes HF's values exactly, and with a cache is HF's own."""
    from transformers.models.zaya.modeling_zaya import ZayaCCAProjection

    config = small_config("zaya")
    config.initializer_range = 0.5
    model = model_from_config(config)
    hf_forward = ZayaCCAProjection.forward
    ids = torch.randint(1, 1000, (1, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        with routed_for_export():
            assert ZayaCCAProjection.forward is not hf_forward
            replaced = model(input_ids=ids).logits
    assert ZayaCCAProjection.forward is hf_forward
    torch.testing.assert_close(replaced, expected, rtol=0, atol=0)  # the same ops on the same values
    ep = export_with_ids(model, ids[:, :5], max_seq=64)
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(input_ids=ids).logits, expected)


def test_minimax_exports_its_lightning_attention_as_a_scan() -> None:
    """HF's loop over blocks of `min(block_size, seq)` tokens fixed the length at export; the
    replacement computes the attention through the opaque Mamba2 scan, at any length: blocks of 4
    tokens here, so that HF loops over three on 11 tokens and the export's longest length is
    several blocks. The scan sums the decays where HF multiplies them: measured on the attention
    layer here, both 3.6 ulps of its largest output from an fp64 forward, and 1.7 ulps from each
    other; 16 allows for other inputs, where a decay off by one step (a factor exp(slope) >= 1.0039
    on every term) is off by far more."""
    from transformers.models.minimax.modeling_minimax import MiniMaxLightningAttention

    config = small_config("minimax")
    config.initializer_range = 0.5
    config.block_size = 4
    model = model_from_config(config)
    assert "linear_attention" in config.layer_types
    attention = next(m for m in model.modules() if isinstance(m, MiniMaxLightningAttention))
    hf_forward = MiniMaxLightningAttention.forward
    x = torch.randn(2, 11, config.hidden_size, generator=torch.Generator().manual_seed(0))
    ids = torch.randint(1, 1000, (1, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = attention(x, None, None)[0]
        with routed_for_export():
            replaced = attention(x, None, None)[0]
            replaced_logits = model(input_ids=ids).logits
    largest = expected.abs().max().item()
    torch.testing.assert_close(replaced, expected, rtol=0, atol=16 * torch.finfo(torch.float32).eps * largest)
    ep = export_with_ids(model, ids[:, :5], max_seq=64)
    assert MiniMaxLightningAttention.forward is hf_forward
    assert any(node.target is torch.ops.ad_mlir.mamba2_chunk_scan.default for node in ep.graph.nodes)
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(input_ids=ids).logits, replaced_logits)  # the same fp32 ops


GENERATION_EXPORTS = {
    "inkling2_text": ({"layer_types": ["hybrid"]}, ["Inkling2DynamicShortConvolution"]),
    "deepseek_v4": ({"layer_types": ["compressed_sparse_attention"]}, ["DeepseekV4CSACompressor", "DeepseekV4Indexer"]),
    "deepseek_v32": ({"index_topk": 8, "index_n_heads": 4, "index_head_dim": 32}, ["DeepseekV32Indexer"]),
}
"""Families whose export for generation (batch and length dynamic, the length down to 1) fixed the
length in HF's code, one layer of the kind that has it, and the classes replaced: Inkling2's
dynamic short convolution on its `hybrid` layers (a flip of an unfold whose window and length
strides are both 1: `seq < 4`), DeepSeek-V4's CSA compressor and its indexer (a shift of windows
through a slice of windows - 1: `seq - 1 != 1`), DeepSeek-V3.2's sparse attention indexer with
index_topk 8 (its `topk(min(8, keys))`: `min(8, seq) <= seq`; at 11 tokens the first 7 queries
have fewer than 8 causal keys, so the padded top-k picks padding there). Inkling2-Loop's copy of Inkling2's convolution is
`test_inkling2_loops_convolution_is_replaced_exactly`, Aria's `test_aria_generates_hf_tokens`."""


def _wide(family: str, settings: dict[str, Any]) -> torch.nn.Module:
    """One layer of hidden 64, weights of std 0.5: a wrong routing weight, window or tap shows."""
    config = small_config(family, layers=1, hidden_size=64, overrides=settings)
    config.initializer_range = 0.5
    torch.manual_seed(0)
    return model_from_config(config)


def _assert_replaced_exactly(model: torch.nn.Module, classes: list[str], ids: torch.Tensor) -> dict[type, Any]:
    """`classes` are built in `model`, replaced while exporting, and the replacements compute HF's
    values exactly; returns HF's methods."""
    replaced = {type(m) for m in model.modules() if type(m).__name__ in classes}
    assert {cls.__name__ for cls in replaced} == set(classes)
    hf_forwards = {cls: cls.forward for cls in replaced}
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        with routed_for_export():
            assert all(cls.forward is not hf for cls, hf in hf_forwards.items())
            patched = model(input_ids=ids).logits
    torch.testing.assert_close(patched, expected, rtol=0, atol=0)  # the same ops on the same values
    return hf_forwards


@pytest.mark.parametrize("family", sorted(GENERATION_EXPORTS))
def test_exports_for_generation_with_hfs_values(family: str) -> None:
    """The export for generation equals HF's forward at 11 tokens and at 1 (a decode step's
    length), HF's methods back after it."""
    from ad_mlir.llm.cache_export import export_for_cache

    settings, classes = GENERATION_EXPORTS[family]
    model = _wide(family, settings)
    ids = torch.randint(1, 1000, (2, 11), generator=torch.Generator().manual_seed(0))
    hf_forwards = _assert_replaced_exactly(model, classes, ids)
    ep = export_for_cache(model, max_batch=2, max_seq_len=64)
    assert all(cls.forward is hf for cls, hf in hf_forwards.items())
    with torch.no_grad():
        for tokens in (ids, ids[:, :1]):
            positions = torch.arange(tokens.shape[1]).expand_as(tokens)
            torch.testing.assert_close(ep.module()(input_ids=tokens, position_ids=positions, use_cache=False).logits,
                                       model(input_ids=tokens).logits)


def test_deepseek_v4s_indexer_selects_as_hfs_before_its_first_window() -> None:
    """Three tokens with a CSA compression rate of 4: no compressed entry yet, so HF's indexer
    selects no entry for each of the 3 queries, [batch, 3, 0]; the replacement the same."""
    settings = {**GENERATION_EXPORTS["deepseek_v4"][0],
                "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}}
    model = _wide("deepseek_v4", settings)
    indexer = next(m for m in model.modules() if type(m).__name__ == "DeepseekV4Indexer")
    hidden, q_residual = torch.randn(2, 3, model.config.hidden_size), torch.randn(2, 3, model.config.q_lora_rank)
    positions = torch.arange(3).expand(2, 3)
    with torch.no_grad():
        hf = indexer(hidden, q_residual, positions, None, 0)
        with routed_for_export():
            replaced = indexer(hidden, q_residual, positions, None, 0)
    assert hf.shape == (2, 3, 0)
    assert replaced.shape == hf.shape and replaced.dtype == hf.dtype


def test_inkling2_loops_convolution_is_replaced_exactly() -> None:
    """Inkling2-Loop's dynamic short convolution, HF's copy of Inkling2's, gets the same
    replacement (its export is Inkling2's; not exported again here, to save the suite's time)."""
    model = _wide("inkling2_loop_text", {"layer_types": ["hybrid"]})
    ids = torch.randint(1, 1000, (2, 11), generator=torch.Generator().manual_seed(0))
    _assert_replaced_exactly(model, ["Inkling2LoopDynamicShortConvolution"], ids)


def test_aria_generates_hf_tokens() -> None:
    """Aria's MoE block gives its shared experts HF's flattened input viewed back, which fixed the
    length of the export for generation (`seq * min(128, 128 * seq) == 128 * seq`); replaced
    (HF's values exactly), Aria generates HF's greedy tokens: three prompts in two slots, and
    per-step logits (prefill and 4 decode steps) against HF's full-prefix forward, kernels as
    their torch reference."""
    model = _wide("aria_text", {})
    _assert_replaced_exactly(model, ["AriaTextMoELayer"], torch.tensor([PROMPTS[0], PROMPTS[0][::-1]]))
    llm = ad_mlir.LLM(model, max_batch=2, max_seq_len=32)
    with reference_kernels():
        outputs = llm.generate(PROMPTS, max_new_tokens=8, ignore_eos=True)
    assert [out.token_ids for out in outputs] == [_hf_tokens(model, prompt, 8) for prompt in PROMPTS]
    _assert_step_logits_match(model, llm)
