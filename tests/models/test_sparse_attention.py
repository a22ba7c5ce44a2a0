"""DeepSeek sparse attention (DSA) generating through a cache of its indexer's keys: the lightning
indexer (`ad.cached_index_topk`) scores every cached position with its own heads and keeps the
`index_topk` best per query, and the MLA (`ad.cached_mla_attention`) attends to those only.
The five families of transformers 5.24 with the indexer, built small by the sweep's config
(`zoo.small`, hidden 64, 4 index heads of 32, index_topk 2: every query past the second attends
to 2 keys of up to 23) with a wide init (0.5) so that greedy tokens vary: DeepSeek-V3.2 (SDPA's
boolean mask), GLM-5 with its second layer sharing the first's selection, HY-V4 (eager: an
additive mask and sink logits, its output gated), A.X K2, and dots.3 note's text model (a sliding
layer without indexer, then an indexed one). Tokens against HF `generate` (three prompts in two
slots), per-step logits (prefill and 4 decode steps) against HF's full-prefix forward, on the
reference, and DeepSeek-V3.2's in the Triton interpreter (the indexer's template and the MLA
template's sparse form; both against HF in `tests/unit/test_index_topk_kernel.py` and
`tests/unit/test_mla_kernel.py`)."""

from __future__ import annotations

import pytest
import torch
from kernel_guard import graph_kernels, kernels_ran
from test_generate import _assert_logits_close, _assert_step_logits_match, _hf_tokens

import ad_mlir
from ad_mlir.codegen.lowering import kernel_region
from ad_mlir.dialects import ad
from ad_mlir.dialects.decompositions import NoKernelForm
from ad_mlir.llm.cache_export import cache_arguments
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.zoo.small import model_from_config, small_config

PROMPTS = [[5, 9, 13, 3, 7, 40, 41], [3, 4], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]
NEW_TOKENS = 12
INDEX = {"index_n_heads": 4, "index_head_dim": 32, "index_topk": 2, "initializer_range": 0.5}
FAMILIES = {"deepseek_v32": {}, "glm_moe_dsa": {"indexer_types": ["full", "shared"]}, "hy_v4": {}, "axk2": {},
            "dots3_note_text": {}}
INDEXERS = {"glm_moe_dsa": 1, "dots3_note_text": 1}
"""Indexers per model where not one per layer (GLM-5's shared layer, dots.3 note's sliding one)."""
SPARSE_LAYERS = {"dots3_note_text": 1}
"""Attentions restricted to a selection where not both layers (dots.3 note's sliding layer is not)."""


def _model(family: str) -> torch.nn.Module:
    return model_from_config(small_config(family, hidden_size=64, overrides={**INDEX, **FAMILIES[family]}))


@pytest.fixture(scope="module", params=list(FAMILIES))
def dsa(request: pytest.FixtureRequest) -> tuple[str, torch.nn.Module, ad_mlir.LLM]:
    model = _model(request.param)
    return request.param, model, ad_mlir.LLM(model, max_batch=2, max_seq_len=32)


def test_the_indexer_keys_are_cached_beside_the_latent(dsa) -> None:  # noqa: ANN001
    """One index-key cache [slots, max_seq, 32] per indexer; an indexed layer's bytes per token
    in `token_bytes` are its latent's and its index key's (fp32). The indexer and the restricted
    MLA have their templates, unless the MLA has sinks (HY-V4's: refused by name, so nothing runs
    a template that drops them)."""
    family, _, llm = dsa
    indexers = INDEXERS.get(family, 2)
    index_caches = {name: tuple(c.shape) for name, c in llm.caches.items() if name.startswith("index_key_cache")}
    assert index_caches == {f"index_key_cache_{i}": (2, 32, 32) for i in range(indexers)}
    arguments = cache_arguments(llm.program.function)
    for i in range(indexers):  # the indexed layer's bytes: its latent's and its index key's (32)
        layer = next(c.layer for c in arguments if c.name == f"index_key_cache_{i}")
        latent = next(c.shape[2] for c in arguments if c.layer == layer and c.name.startswith("latent"))
        assert llm.token_bytes[layer] == (latent + 32) * 4
    ops = [op for op in llm.program.function.body.walk() if isinstance(op, ad.CachedIndexTopkOp)
           or (isinstance(op, ad.CachedMlaAttentionOp) and op.selected is not None)]
    assert sum(isinstance(op, ad.CachedIndexTopkOp) for op in ops) == indexers
    assert len(ops) - indexers == SPARSE_LAYERS.get(family, 2)
    for op in ops:
        if isinstance(op, ad.CachedMlaAttentionOp) and op.sinks is not None:
            with pytest.raises(NoKernelForm):
                kernel_region(op)
        else:
            kernel_region(op)


def test_greedy_tokens_match_hf_generate(dsa) -> None:  # noqa: ANN001
    """Three prompts in two slots (a slot reused), 12 new tokens: up to 23 cached positions of
    which each query keeps 2."""
    _, model, llm = dsa
    expected = [_hf_tokens(model, prompt, NEW_TOKENS) for prompt in PROMPTS]
    with reference_kernels():
        outputs = llm.generate(PROMPTS, max_new_tokens=NEW_TOKENS)
    assert [out.token_ids for out in outputs] == expected


def test_step_logits_match_hf_prefill_and_decode(dsa) -> None:  # noqa: ANN001
    """Within 2e-5 x the largest logit, as `test_mla`'s (fp32 reordering of the batched rows
    through the wide weights); a wrong selection moves logits by order 1 (the next test)."""
    _assert_step_logits_match(*dsa[1:], atol=2e-5)


def test_the_selection_matters(dsa) -> None:  # noqa: ANN001
    """What the tests above would catch: HF's forward with every causal key kept (index_topk past
    the length) moves the last logits of the longest prompt far beyond their tolerance."""
    _, model, _ = dsa
    prompt = torch.tensor([PROMPTS[2]])
    indexers = [m for m in model.modules() if hasattr(m, "index_topk")]
    with torch.no_grad():
        sparse = model(prompt).logits[0, -1]
        for m in indexers:
            m.index_topk = 1000
        try:
            dense = model(prompt).logits[0, -1]
        finally:
            for m in indexers:
                m.index_topk = INDEX["index_topk"]
    assert (sparse - dense).abs().max() > 0.1 * max(1.0, sparse.abs().max().item())


@pytest.mark.parametrize("dsa", ["deepseek_v32"], indirect=True)
def test_in_the_interpreter(dsa, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """Every kernel in the Triton interpreter, the indexer's and the sparse MLA's among them
    (prefill, decode of both slots, a reused slot), the reference refused: three prompts in two
    slots, 6 new tokens."""
    _, model, llm = dsa
    names = graph_kernels(llm.graph)
    assert any(n.startswith("cached_index_topk") for n in names) and any(n.startswith("cached_mla") for n in names)
    with kernels_ran(monkeypatch):
        outputs = llm.generate(PROMPTS, max_new_tokens=6)
    assert [out.token_ids for out in outputs] == [_hf_tokens(model, prompt, 6) for prompt in PROMPTS]


@pytest.mark.parametrize("dsa", ["deepseek_v32"], indirect=True)
def test_a_prompt_prefilled_in_two_chunks_equals_one_prefill(dsa) -> None:  # noqa: ANN001
    """The second chunk (start > 0, several tokens) selects among the keys the first left in the
    index-key cache and its own, causally."""
    _, model, llm = dsa
    prompt = torch.tensor([PROMPTS[2]])
    with torch.no_grad(), reference_kernels():
        llm.step(prompt[:, :4], torch.arange(4)[None], [1], [0])
        chunked = llm.step(prompt[:, 4:], torch.arange(4, prompt.shape[1])[None], [1], [4])
        _assert_logits_close(chunked, model(prompt).logits[:, 4:], atol=2e-5)


@pytest.mark.parametrize("dsa", ["deepseek_v32"], indirect=True)
def test_decode_traffic_reads_the_selected_latents_and_every_index_key(dsa) -> None:  # noqa: ANN001
    """`ad-bench`'s modelled decode step with 10 cached tokens: its ideal reads, per row and layer,
    the 2 selected latents of (32 + 8) x 4 bytes and all 10 index keys of 32 x 4 bytes, and
    writes one of each; the modelled step (which also reads and writes the indexer's scores of
    the whole slot) is above that ideal."""
    from ad_mlir.bench.decode_traffic import decode_step_traffic

    latent, index_key = (32 + 8) * 4, 32 * 4
    traffic = decode_step_traffic(dsa[2].program, 2, 10)
    assert traffic["ideal_caches_read_bytes"] == 2 * 2 * (2 * latent + 10 * index_key)
    assert traffic["ideal_new_kv_written_bytes"] == 2 * 2 * (latent + index_key)
    assert traffic["modelled_bytes"] > traffic["ideal_bytes"]


def test_the_paged_form_falls_back_to_slots() -> None:
    """`paged_where_possible`: the paged form refuses the indexer (`PerSequenceState`, naming the
    layer), and the model gets the slot form's caches."""
    from ad_mlir.llm.llm import paged_where_possible

    llm = paged_where_possible(_model("deepseek_v32"), page_size=16, max_batch=2, max_seq_len=32)
    assert "index_key_cache_0" in llm.caches and "latent_cache_0" in llm.caches


def test_index_topk_past_some_prompt_lengths() -> None:
    """index_topk 8 (HF's `topk(min(8, keys))`, which torch.export exports for any length through
    `export_patches._PaddedTopk`): the 2- and 7-token prompts keep every causal key, the 11-token
    one and the decode steps (up to 23 positions) 8 of them. Tokens against HF `generate` (three
    prompts in two slots), per-step logits against HF's full-prefix forward within
    `test_step_logits_match_hf_prefill_and_decode`'s tolerance."""
    model = model_from_config(small_config("deepseek_v32", hidden_size=64, overrides={**INDEX, "index_topk": 8}))
    llm = ad_mlir.LLM(model, max_batch=2, max_seq_len=32)
    assert [op.topk.value.data for op in llm.program.function.body.walk()
            if isinstance(op, ad.CachedIndexTopkOp)] == [8, 8]
    expected = [_hf_tokens(model, prompt, NEW_TOKENS) for prompt in PROMPTS]
    with reference_kernels():
        outputs = llm.generate(PROMPTS, max_new_tokens=NEW_TOKENS)
    assert [out.token_ids for out in outputs] == expected
    _assert_step_logits_match(model, llm, atol=2e-5)
