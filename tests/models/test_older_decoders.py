"""Older decoder families whose forward counts or pads its tokens itself, generating through the
K/V cache. XLM (a causal one: HF's config flag `causal`) counts each row's tokens that are not its
pad id and masks the hidden states past that count; the export for generation gives it an
all-ones `attention_mask` (`export_patches.GENERATION_METHODS`: a step's tokens are all real, and
in a sequence without the pad id HF's mask is all ones), its scores are masked by an in-place
`masked_fill_` of a mask `expand_as` the scores. XLM without `causal` (its default, an MLM
encoder) attends both ways and is refused by name, as CPM-Ant is: HF's forward marks every
token as context, so each attends to later ones too.

The model is built from its config class with wide random weights (greedy tokens vary). HF's own
`generate` is no reference for XLM: its `prepare_inputs_for_generation` appends `mask_token_id`
to the sequence and reads the logits there (a masked-LM query), and with the default config that
id is the pad id, whose hidden state HF zeroes, so every step gives the LM head's bias alone (the
same token). Generation is checked against HF's own forward over the whole prefix instead:
per-step logits (prefill and 4 decode steps), and greedy tokens of three prompts in two slots
against greedy decoding by that forward. The kernels run as their torch reference (no kernel
differs from the ones tested in the interpreter elsewhere)."""

from __future__ import annotations

import pytest
import torch
from test_attention_spellings import PROMPTS
from test_generate import _assert_step_logits_match
from xdsl.utils.exceptions import PassFailedException

import ad_mlir
from ad_mlir.dialects import ad
from ad_mlir.frontends.export import export_with_ids
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.zoo.small import model_from_config, small_config

NEW_TOKENS = 8


def _xlm(causal: bool) -> torch.nn.Module:
    config = small_config("xlm", hidden_size=64)
    config.initializer_range = 0.5
    config.causal = causal
    torch.manual_seed(0)
    return model_from_config(config).eval()


@pytest.fixture(scope="module")
def xlm() -> tuple[torch.nn.Module, ad_mlir.LLM]:
    model = _xlm(causal=True)
    return model, ad_mlir.LLM(model, max_batch=2, max_seq_len=32)


def _greedy_by_full_prefix(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens, each the argmax of HF's forward over the whole sequence so far, checked to
    vary (a decode that ignores the cache repeats a token) and to hold no pad id (HF masks the
    last positions of a sequence that holds it, which no cache reproduces)."""
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    tokens = seq[len(prompt):]
    assert len(set(tokens)) >= len(tokens) / 4, f"HF's greedy tokens hardly vary: {tokens}"
    assert model.config.pad_index not in seq
    return tokens


def test_xlm_attention_is_one_cached_op_per_layer(xlm) -> None:  # noqa: ANN001
    _, llm = xlm
    ops = list(llm.program.function.body.walk())
    assert sum(isinstance(op, ad.CachedAttentionOp) for op in ops) == 2
    assert not any(isinstance(op, ad.SoftmaxOp | ad.MatmulOp) for op in ops)


def test_xlm_generates_greedy_tokens_of_hf_forward(xlm) -> None:  # noqa: ANN001
    model, llm = xlm
    with reference_kernels():
        outputs = llm.generate(PROMPTS, max_new_tokens=NEW_TOKENS)
    assert [out.token_ids for out in outputs] == [_greedy_by_full_prefix(model, p, NEW_TOKENS) for p in PROMPTS]


def test_xlm_step_logits_match_hf_prefill_and_decode(xlm) -> None:  # noqa: ANN001
    _assert_step_logits_match(*xlm)


def test_bidirectional_xlm_is_refused() -> None:
    with pytest.raises(PassFailedException, match="transformer.attentions.0: its attention mask is neither causal"):
        ad_mlir.LLM(_xlm(causal=False), max_batch=2, max_seq_len=32)


def test_xlm_plain_export_keeps_hf_padding_mask() -> None:
    """The all-ones mask is for the export for generation only: the plain export of a sequence
    that holds the pad id masks its last position as HF does (its logits there are the LM
    head's bias alone, far from the unmasked ones)."""
    model = _xlm(causal=True)
    ids = torch.tensor([[5, 9, model.config.pad_index, 13, 7, 40]])
    ep = export_with_ids(model, ids[:, :4], max_seq=32)
    with torch.no_grad():
        got, expected = ep.module()(input_ids=ids).logits, model(input_ids=ids).logits
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(expected[0, -1], model.pred_layer.proj.bias.detach())


def test_cpmant_is_refused_by_its_bidirectional_mask() -> None:
    """CPM-Ant's forward marks every token as context (HF's `context` is all ones), so each token
    attends to every other, later ones too: a token's logits change when tokens follow it, which
    no cache can give. Its attention (masked_fill with a `scalar_tensor` fill, the probabilities
    zeroed again after the softmax) is matched, and its mask refused by name."""
    config = small_config("cpmant", hidden_size=64)
    config.initializer_range = 0.5
    torch.manual_seed(0)
    model = model_from_config(config).eval()
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        whole, prefix = model(ids).logits, model(ids[:, :4]).logits
    assert (whole[0, 3] - prefix[0, 3]).abs().max() > 0.1  # measured: 1.9 on logits up to 15
    with pytest.raises(PassFailedException, match="cpmant.encoder.layers.0.self_att.self_attention: its attention "
                                                  "mask is neither causal"):
        ad_mlir.LLM(model, max_batch=2, max_seq_len=32)
