"""DeepSeek-V4 generating through caches of its compressed K/V entries: HF's attention
concatenates to its sliding-window keys (one shared K = V head, sinks) one compressed entry per
closed window of `compress_rate` tokens. At compress rate 1 (the sweep's small config, `zoo.small`,
hidden 128, its two layers one of each kind as the sweep builds them) every token closes a window:
the entries are cached per token (`ad.cached_attention`'s `compressed`) and attended causally in
the same softmax; HCA's layer sees all of them, CSA's only those its lightning indexer chooses
(`ad.cached_index_topk` over its index keys, the attention's `selected`), and each CSA entry and
index key pools the previous token's half, kept per slot (a cached token window of one token,
`ad.cached_token_window`, its initial row HF's fill: 0 for kv, -inf for gates). Built with a wide
init (0.5) so that greedy tokens vary; tokens against HF `generate` (three prompts in two slots),
per-step logits (prefill and 4 decode steps) against HF's full-prefix forward, on the reference
(the attention with entries has no template: refused by `NoKernelForm`). Other
compress rates are refused by name (`tests/filecheck/transforms/insert-cached-attention-compressed.mlir`;
the export for generation fails before that at rate 2)."""

from __future__ import annotations

import pytest
import torch
from test_generate import _assert_logits_close, _assert_step_logits_match, _hf_tokens
from xdsl.dialects.builtin import FloatAttr

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
    """Each layer caches its compressed entries [slots, max_seq, 1, head_dim] beside its K/V
    caches; the CSA layer also its indexer's keys [slots, max_seq, index_head_dim] and, per slot,
    the last token's halves that the next token's entry and index key pool (kv and gate of each:
    four one-token windows, [slots, 1, 1, width], whose initial rows are HF's fills);
    `token_bytes` counts what grows per token. The cached attention with entries has no template
    (refused, so nothing runs one that drops them)."""
    model, llm = hca
    caches = {name: tuple(c.shape) for name, c in llm.caches.items()}
    assert {n: c for n, c in caches.items() if n.startswith(("c_cache", "index_key", "token_window"))} == {
        "c_cache_0": (2, 32, 1, 32), "c_cache_1": (2, 32, 1, 32), "index_key_cache_0": (2, 32, 128),
        "token_window_0": (2, 1, 1, 32), "token_window_1": (2, 1, 1, 32), "token_window_2": (2, 1, 1, 128),
        "token_window_3": (2, 1, 1, 128)}
    # per token and layer: its key, its value (the same K = V head, cached twice), its entry, CSA's index key
    assert llm.token_bytes == {"model.layers.0.self_attn": 3 * 32 * 4, "model.layers.1.self_attn": (3 * 32 + 128) * 4}
    ops = list(llm.program.function.body.walk())
    attentions = [op for op in ops if isinstance(op, ad.CachedAttentionOp)]
    assert [(op.compressed is not None, op.selected is not None) for op in attentions] == [(True, False), (True, True)]
    assert sum(isinstance(op, ad.CachedIndexTopkOp) for op in ops) == 1
    windows = [op for op in ops if isinstance(op, ad.CachedTokenWindowOp)]
    assert [(op.width(), op.dim.value.data) for op in windows] == [(1, 1)] * 4
    # kv's fill, then the gate's, for the entries and for the index keys
    fills = [(op.initial.owner.target.data, op.initial.owner.args.data[2:]) for op in windows]
    assert fills == [("aten.new_zeros.default", ()), ("aten.new_full.default", (FloatAttr(float("-inf"), 64),))] * 2
    for op in attentions:
        with pytest.raises(NoKernelForm, match="DeepSeek-V4"):
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


def test_a_prompt_prefilled_in_two_chunks_equals_one_prefill(hca) -> None:  # noqa: ANN001
    """The second chunk (start > 0, several tokens) continues the shift from the slot's state and
    attends to the entries and index keys the first chunk left, causally."""
    model, llm = hca
    prompt = torch.tensor([PROMPTS[2]])
    with torch.no_grad(), reference_kernels():
        llm.step(prompt[:, :4], torch.arange(4)[None], [1], [0])
        chunked = llm.step(prompt[:, 4:], torch.arange(4, prompt.shape[1])[None], [1], [4])
        _assert_logits_close(chunked, model(prompt).logits[:, 4:], atol=2e-5)


def test_the_compressed_entries_and_the_selection_matter(hca) -> None:  # noqa: ANN001
    """What the tests above would catch: HF's forward with every compressed entry 0 (a key of
    score 0 and a value of 0), or with every causal entry kept by the indexer (index_topk past the
    length), moves the last logits of the longest prompt far beyond their tolerance."""
    model, _ = hca
    prompt = torch.tensor([PROMPTS[2]])
    indexer = model.model.layers[1].self_attn.compressor.indexer
    norms = [layer.self_attn.compressor.kv_norm.weight for layer in model.model.layers]
    kept = [w.clone() for w in norms]
    with torch.no_grad():
        expected = model(prompt).logits[0, -1]
        indexer.index_topk = 1000
        dense = model(prompt).logits[0, -1]
        indexer.index_topk = model.config.index_topk
        try:
            for w in norms:
                w.zero_()
            unseen = model(prompt).logits[0, -1]
        finally:  # the model's weights, which the compiled LLM of the fixture may share
            for w, k in zip(norms, kept, strict=True):
                w.copy_(k)
    for changed in (dense, unseen):
        assert (expected - changed).abs().max() > 0.1 * max(1.0, expected.abs().max().item())


def test_decode_traffic_reads_the_entries_each_layer_attends(hca) -> None:  # noqa: ANN001
    """`ad-bench`'s modelled decode step with 10 cached tokens: its ideal reads, per row, each
    layer's 10 keys and values (32 x 4 bytes each), HCA's 10 entries and CSA's 2 selected ones
    (32 x 4) and CSA's 10 index keys (128 x 4), and writes one of each; the modelled step is
    above that ideal."""
    from ad_mlir.bench.decode_traffic import decode_step_traffic

    row, index_key = 32 * 4, 128 * 4
    traffic = decode_step_traffic(hca[1].program, 2, 10)
    assert traffic["ideal_caches_read_bytes"] == 2 * (2 * 2 * 10 * row + 10 * row + 2 * row + 10 * index_key)
    assert traffic["ideal_new_kv_written_bytes"] == 2 * (2 * 3 * row + index_key)
    assert traffic["modelled_bytes"] > traffic["ideal_bytes"]
