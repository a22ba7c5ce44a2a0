"""DeepSeek-V4 generating through a cache of its compressed K/V entries: HF's attention
concatenates to its sliding-window keys (one shared K = V head, sinks) one compressed entry per
closed window of `compress_rate` tokens; at HCA's compress rate 1 (the sweep's small config,
`zoo.small`: two HCA layers, hidden 128) every token closes a window, and the entries are cached
per token (`ad.cached_attention`'s `compressed` operand) and attended causally in the same
softmax. Built with a wide init (0.5) so that greedy tokens vary; tokens against HF `generate`
(three prompts in two slots), per-step logits (prefill and 4 decode steps) against HF's
full-prefix forward, on the reference (the cached attention's template has no compressed
entries: refused by `NoKernelForm`). Forms not cached (a compress rate above 1, CSA's indexer)
are refused by name."""

from __future__ import annotations

import re

import pytest
import torch
from test_generate import _assert_step_logits_match, _hf_tokens

import ad_mlir
from ad_mlir.bench.families import greedy_only
from ad_mlir.codegen.lowering import kernel_region
from ad_mlir.dialects import ad
from ad_mlir.dialects.decompositions import NoKernelForm
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.zoo.small import model_from_config, small_config

PROMPTS = [[5, 9, 13, 3, 7, 40, 41], [3, 4], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]
NEW_TOKENS = 8
WIDE = {"initializer_range": 0.5}


def _model(**overrides: object) -> torch.nn.Module:
    return greedy_only(model_from_config(small_config("deepseek_v4", overrides={**WIDE, **overrides})))


LAYERS = ["heavily_compressed_attention", "compressed_sparse_attention"]
"""The sweep's two layers (`bench.families.generation_config`): one of each kind."""


@pytest.fixture(scope="module")
def hca() -> tuple[torch.nn.Module, ad_mlir.LLM]:
    model = _model(layer_types=LAYERS)
    return model, ad_mlir.LLM(model, max_batch=2, max_seq_len=32)


def test_the_compressed_entries_are_cached_per_token(hca) -> None:  # noqa: ANN001
    """One compressed-entry cache [slots, max_seq, 1, head_dim] per HCA layer beside its K/V
    caches (counted in `token_bytes`), read by a cached attention that has no template (refused, so nothing runs one that
    drops the entries)."""
    model, llm = hca
    assert model.config.layer_types == ["heavily_compressed_attention"] * 2
    compressed = {name: tuple(c.shape) for name, c in llm.caches.items() if name.startswith("c_cache")}
    assert compressed == {"c_cache_0": (2, 32, 1, 32), "c_cache_1": (2, 32, 1, 32)}
    # per token and layer: its key, its value (the same K = V head, cached twice) and its entry
    assert llm.token_bytes == {f"model.layers.{i}.self_attn": 3 * 32 * 4 for i in range(2)}
    ops = [op for op in llm.program.function.body.walk() if isinstance(op, ad.CachedAttentionOp)]
    assert len(ops) == 2 and all(op.compressed is not None and op.sinks is not None for op in ops)
    for op in ops:
        with pytest.raises(NoKernelForm, match="compressed entries"):
            kernel_region(op)


def test_greedy_tokens_match_hf_generate(hca) -> None:  # noqa: ANN001
    """Three prompts in two slots (a slot reused), 8 new tokens."""
    model, llm = hca
    expected = [_hf_tokens(model, prompt, NEW_TOKENS) for prompt in PROMPTS]
    with reference_kernels():
        outputs = llm.generate(PROMPTS, max_new_tokens=NEW_TOKENS)
    assert [out.token_ids for out in outputs] == expected


def test_step_logits_match_hf_prefill_and_decode(hca) -> None:  # noqa: ANN001
    """Within 2e-5 x the largest logit, as the other wide models with hyper-connections and MoE
    (fp32 reordering of batched rows); a missing or stale compressed entry moves logits by order 1
    (the next test)."""
    _assert_step_logits_match(*hca, atol=2e-5)


def test_the_compressed_entries_matter(hca) -> None:  # noqa: ANN001
    """What the tests above would catch: HF's forward with the compressed entries' bias at -inf
    everywhere (no entry seen) moves the last logits of the longest prompt far beyond their
    tolerance."""
    model, _ = hca
    prompt = torch.tensor([PROMPTS[2]])
    compressors = [layer.self_attn.compressor for layer in model.model.layers]
    with torch.no_grad():
        seen = model(prompt).logits[0, -1]
        for c in compressors:
            c.kv_norm.weight.zero_()  # every entry 0: each a key of score 0 and a value of 0
        unseen = model(prompt).logits[0, -1]
    assert (seen - unseen).abs().max() > 0.1 * max(1.0, seen.abs().max().item())


def test_csa_is_refused_by_name() -> None:
    """CSA's indexer selects compressed entries by its top-k: refused, naming the layer, CSA and
    its compress rate (one layer: the refusal is the first layer's)."""
    model = _model(num_hidden_layers=1, layer_types=["compressed_sparse_attention"])
    refused = ("model.layers.0.self_attn: its keys concatenate the compressed K/V entries of DeepSeek-V4 CSA "
               "(compressed entries selected by an indexer's top-k) at compress rate 1, which are not cached")
    with pytest.raises(Exception, match=re.escape(refused)):
        ad_mlir.LLM(model, max_batch=1, max_seq_len=16)
