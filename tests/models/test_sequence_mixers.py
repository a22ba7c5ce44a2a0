"""Sequence mixers other than attention (LFM2's short convolution here): the full-sequence graph
compiles and equals eager, but generation refuses them at compile time, naming the layer and the
op, until their state is cached: a decode step would otherwise convolve the new token alone and
give a wrong token with no error."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Lfm2Config
from xdsl.utils.exceptions import PassFailedException

import ad_mlir


def lfm2_with_a_conv_layer() -> torch.nn.Module:
    """Two layers: a short convolution, then attention (wide init: varied greedy tokens)."""
    config = Lfm2Config(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, layer_types=["conv", "full_attention"],
                        initializer_range=0.5, pad_token_id=0, max_position_embeddings=256)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def test_lfm2_conv_layer_compiles_equal_to_eager() -> None:
    model = lfm2_with_a_conv_layer()
    ids = torch.randint(1, 1000, (1, 9), generator=torch.Generator().manual_seed(1))
    seq = torch.export.Dim("seq", min=2, max=64)
    gm = ad_mlir.compile(model, {"input_ids": ids, "use_cache": False},
                         dynamic_shapes={"input_ids": {1: seq}, "use_cache": None})
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    torch.testing.assert_close(gm(ids, False)[0], expected)  # fp32, reference kernels: torch's default tolerance


def test_lfm2_conv_layer_is_refused_for_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AD_MLIR_SKIP_ON_ERROR", "1")  # users' default: the refusal must not be skipped
    with pytest.raises(PassFailedException, match=r"1 op\(s\) mix token positions outside the cached attention.*"
                                                  r"model\.layers\.0\.conv: ad\.torch_op \(aten\.conv1d\.default"):
        ad_mlir.LLM(lfm2_with_a_conv_layer(), max_batch=2, max_seq_len=32)
