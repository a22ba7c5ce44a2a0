"""Generation's export follows the forward's real signature (`use_cache` named or taken in
`**kwargs`, `position_ids` present or not), and a model that does not export is our error,
naming the model class and what it was called with, not torch's. A grouped-query model with
several key/value heads exports and generates under the symbolic shapes of torch 2.11, the GPU
machines' (emulated on this torch), as under this torch."""

from __future__ import annotations

import inspect

import pytest
import torch
import transformers
from test_generate import _assert_step_logits_match, _hf_tokens
from torch.utils._sympy.functions import MinMaxBase

import ad_mlir
from ad_mlir.frontends.torch_patches import forget_min_max_results
from ad_mlir.llm.cache_export import CacheExportError, export_for_cache
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.zoo.small import model_from_config, small_config

PROMPTS = [[5, 9, 13, 3, 7, 40, 41], [3, 4], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]


def test_granitemoe_takes_use_cache_in_kwargs_and_generates_hf_tokens() -> None:
    config = small_config("granitemoe")
    config.initializer_range = 0.5  # wide init: greedy tokens vary, so a broken cache shows
    torch.manual_seed(0)
    model = model_from_config(config)
    assert "use_cache" not in inspect.signature(model.forward).parameters  # what this test is about
    llm = ad_mlir.LLM(model, max_batch=2, max_seq_len=40)
    assert "use_cache" not in llm.inputs
    with reference_kernels():
        outputs = llm.generate(PROMPTS, max_new_tokens=8, ignore_eos=True)
    expected = [_hf_tokens(model, prompt, 8) for prompt in PROMPTS]
    assert all(len(set(tokens)) > 1 for tokens in expected)
    assert [out.token_ids for out in outputs] == expected
    _assert_step_logits_match(model, llm)  # measured: at most 4.1e-5 off, on logits up to 25.7


class _NoInputIds(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class _DataDependent(torch.nn.Module):
    """Branches on a token's value: torch.export cannot trace it for every input."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        return x if input_ids[0, 0] > 3 else -x


class _ShortOnly(torch.nn.Module):
    """Branches on the sequence length: the export guards it, narrower than max_seq_len."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        return x if input_ids.shape[1] < 4 else -x


def test_a_forward_without_input_ids_is_refused() -> None:
    with pytest.raises(CacheExportError, match="_NoInputIds.forward takes no 'input_ids' parameter"):
        ad_mlir.LLM(_NoInputIds(), max_batch=1, max_seq_len=16)


def test_an_export_failure_is_our_error_naming_the_model() -> None:
    with pytest.raises(CacheExportError, match=r"_DataDependent does not export for generation, called with "
                                               r"input_ids \(batch and sequence dynamic\): \w+"):
        ad_mlir.LLM(_DataDependent(), max_batch=1, max_seq_len=16)


def test_a_guarded_sequence_length_is_named() -> None:
    """A forward whose code specializes the sequence length: the error says which guard."""
    with pytest.raises(CacheExportError, match=r"_ShortOnly does not export for generation.*Constraints violated "
                                               r"\(seq\)!.* \(Not all values of seq .* satisfy the generated guard"):
        ad_mlir.LLM(_ShortOnly(), max_batch=1, max_seq_len=16)


def _smollm2_shaped(dtype: torch.dtype) -> torch.nn.Module:
    """SmolLM2-135M's attention (9 query heads, 3 key/value heads of 64, RoPE theta 1e5) in one
    layer of a small model, with wide weights (greedy tokens vary)."""
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=576, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=9, num_key_value_heads=3, rope_theta=1e5,
                                      tie_word_embeddings=True, initializer_range=0.5)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval().to(dtype)


def _ops(ep: torch.export.ExportedProgram) -> list[str]:
    return [f"{node.op} {node.target}" for node in ep.graph.nodes]


def _min_as_in_torch_2_11(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's symbolic Min as before 2.13 (the GPU machines' 2.11): `Min(64*s, 192*s)` left as it
    is, where 2.13 collapses two multiples of one size. With it HF's `repeat_kv` of a grouped-query
    model added the guard `Eq(Min(64*seq, 192*seq), 64*seq)` and the export refused the dynamic
    sequence, on the CPU as on CUDA (measured under torch 2.11 itself, also with fake CUDA tensors)."""
    monkeypatch.setattr(MinMaxBase, "_collapse_known_multiplicative_terms", classmethod(lambda cls, values: None),
                        raising=False)
    forget_min_max_results()  # else Min(64*s, 192*s) comes back from torch's cache, collapsed


@pytest.mark.parametrize("flat", [False, True], ids=["slots", "flat"])
def test_grouped_query_bf16_exports_for_generation_with_torch_2_11s_min(monkeypatch: pytest.MonkeyPatch,
                                                                        flat: bool) -> None:
    """SmolLM2's heads in bf16 (what failed on the H100 under torch 2.11) export for generation
    with torch 2.11's symbolic Min, to the graph this torch exports."""
    model = _smollm2_shaped(torch.bfloat16)
    expected = _ops(export_for_cache(model, 4, 64, flat=flat))
    _min_as_in_torch_2_11(monkeypatch)
    assert _ops(export_for_cache(model, 4, 64, flat=flat)) == expected


def test_grouped_query_model_generates_hf_tokens_with_torch_2_11s_min(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled result of that export is right: HF's greedy tokens and per-step logits (fp32,
    where they must agree exactly in tokens)."""
    _min_as_in_torch_2_11(monkeypatch)
    model = _smollm2_shaped(torch.float32)
    llm = ad_mlir.LLM(model, max_batch=2, max_seq_len=40)
    with reference_kernels():
        outputs = llm.generate(PROMPTS, max_new_tokens=8, ignore_eos=True)
    assert [out.token_ids for out in outputs] == [_hf_tokens(model, prompt, 8) for prompt in PROMPTS]
    _assert_step_logits_match(model, llm)
