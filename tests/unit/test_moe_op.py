"""`ad.moe`'s meaning: its torch reference op (`torch_ops.moe`, a plain loop over experts)
computes what HF's sparse MoE blocks compute (Mixtral, Qwen3-MoE, OLMoE, and Qwen2-MoE with
its sigmoid-gated shared expert), on the operands `moe_blocks.moe_operands` makes of them."""

from __future__ import annotations

import pytest
import torch
from moe_blocks import hf_block, moe_config, moe_operands

from ad_mlir.semantics import torch_ops


def _hf_and_reference(family: str, dtype: torch.dtype, tokens: int = 37, **config: object):
    block = hf_block(family, moe_config(family, **config), dtype)
    x = torch.randn(tokens, block.experts.config.hidden_size, generator=torch.Generator().manual_seed(1)).to(dtype)
    with torch.no_grad():
        expected = block(x[None])[0]
        got = torch_ops.moe(*moe_operands(family, block, x).args())
    return expected, got


@pytest.mark.parametrize(("family", "config"), [
    ("mixtral", {}),
    ("mixtral", {"top_k": 1, "experts": 3}),
    ("qwen3_moe", {"norm_topk_prob": True}),
    ("qwen3_moe", {"norm_topk_prob": False, "top_k": 3, "experts": 5}),
    ("olmoe", {}),
    ("qwen2_moe", {}),
    ("qwen2_moe", {"norm_topk_prob": True, "hidden": 96}),
])
def test_reference_is_the_hf_block_in_fp32(family: str, config: dict) -> None:
    """fp32 within torch.testing's defaults (rtol 1.3e-6, atol 1e-5): the same GEMMs and the same
    routing ops, the weighted sum taken in another order (HF sums per token over its top-k, the
    loop adds expert by expert)."""
    expected, got = _hf_and_reference(family, torch.float32, **config)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "qwen2_moe"])
def test_reference_is_the_hf_block_in_bf16(family: str) -> None:
    """bf16: the experts run in bf16 in both; the loop sums the weighted outputs in fp32 and
    rounds once, where Qwen's blocks round each product and the shared expert's output to bf16:
    a few bf16 ulps (2^-8 relative each) of outputs below 1."""
    expected, got = _hf_and_reference(family, torch.bfloat16)
    torch.testing.assert_close(got.float(), expected.float(), atol=4 * 2.0**-8, rtol=4 * 2.0**-8)


def test_an_expert_without_tokens_and_one_token() -> None:
    """Three tokens all routed to experts 0 and 1 (a large logit bias): experts 2 and 3 get none;
    and a single token (decode)."""
    family = "mixtral"
    block = hf_block(family, moe_config(family))
    with torch.no_grad():
        block.gate.weight[:2] += 2.0 * block.gate.weight[:2].sign()
        x = block.gate.weight[:2].sum(0, keepdim=True).sign().repeat(3, 1) * torch.rand(3, 48)
        for tokens in (x, x[:1]):
            ops = moe_operands(family, block, tokens)
            assert set(torch.topk(ops.router_logits, 2).indices.flatten().tolist()) == {0, 1}
            torch.testing.assert_close(torch_ops.moe(*ops.args()), block(tokens[None])[0])
