"""Multi-head latent attention (DeepSeek-V3) generating through a cache of the compressed latent
(`ad.cached_mla_attention`): only kv_lora_rank + qk_rope_head_dim values per token and layer are
cached, not the heads' K and V. Tiny configs built from `DeepseekV3Config` with DeepSeek-V3's
head shape ratios (nope 128 : rope 64 : value 128 : latent 512, here 16 : 8 : 16 : 64: the
query/key head dim 24 differs from the value's 16), with the query's LoRA (q_lora_rank set, RoPE
interleaved as the config's default) and without it (q_proj, RoPE in halves); MoE on the second
layer; a wide init (0.5), so that greedy tokens vary and a wrong latent shows. Tokens against HF
`generate` (three prompts in two slots), per-step logits (prefill and 4 decode steps) against HF's
full-prefix forward, with the kernel as its torch reference and in the Triton interpreter."""

from __future__ import annotations

import logging

import pytest
import torch
from kernel_guard import graph_kernels, kernels_ran
from test_generate import _assert_logits_close, _assert_step_logits_match, _hf_tokens
from transformers import DeepseekV3Config

import ad_mlir
from ad_mlir.compiler import compile_program
from ad_mlir.dialects import ad
from ad_mlir.llm.cache_export import export_for_cache
from ad_mlir.llm.pipelines import cached_pipeline
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.zoo.small import model_from_config

PROMPTS = [[5, 9, 13, 3, 7, 40, 41], [3, 4], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]
RANK, ROPE, NOPE, V_DIM = 64, 8, 16, 16
COMMON = {"vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": RANK, "qk_rope_head_dim": ROPE,
          "qk_nope_head_dim": NOPE, "v_head_dim": V_DIM, "n_routed_experts": 4, "num_experts_per_tok": 2,
          "moe_intermediate_size": 32, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
          "initializer_range": 0.5, "max_position_embeddings": 256, "pad_token_id": 0}
CONFIGS = {"q_lora": {"q_lora_rank": 48, "rope_interleave": True},
           "no_q_lora": {"q_lora_rank": None, "rope_interleave": False}}
LAYERS = ["model.layers.0.self_attn", "model.layers.1.self_attn"]


def _model(variant: str) -> torch.nn.Module:
    return model_from_config(DeepseekV3Config(**COMMON, **CONFIGS[variant]))


@pytest.fixture(scope="module", params=list(CONFIGS))
def mla(request: pytest.FixtureRequest) -> tuple[torch.nn.Module, ad_mlir.LLM]:
    model = _model(request.param)
    return model, ad_mlir.LLM(model, max_batch=2, max_seq_len=48)


def test_only_the_latent_is_cached(mla, caplog: pytest.LogCaptureFixture) -> None:  # noqa: ANN001
    """One latent cache per layer [slots, max_seq, rank + rope] in the model's dtype; no K/V
    cache, no expansion by kv_b_proj left in the graph; per token and layer (rank + rope) x 4
    bytes (fp32), which the log says."""
    model, llm = mla
    assert {name: tuple(c.shape) for name, c in llm.caches.items()} == {
        "latent_cache_0": (2, 48, RANK + ROPE), "latent_cache_1": (2, 48, RANK + ROPE)}
    assert all(c.dtype == torch.float32 for c in llm.caches.values())
    assert llm.token_bytes == dict.fromkeys(LAYERS, (RANK + ROPE) * 4)
    assert llm.state_bytes == 0
    ops = [type(op) for op in llm.program.function.body.walk()]
    assert ops.count(ad.CachedMlaAttentionOp) == 2 and ad.CachedAttentionOp not in ops
    with caplog.at_level(logging.INFO, logger="ad_mlir.llm.llm"):
        ad_mlir.LLM(model, max_batch=2, max_seq_len=8)
    assert f"per token {2 * (RANK + ROPE) * 4} bytes (2 layers x {(RANK + ROPE) * 4} bytes)" in caplog.text


def test_greedy_tokens_match_hf_generate(mla) -> None:  # noqa: ANN001
    """Three prompts in two slots, 16 new tokens: a slot is reused (its latents overwritten)."""
    model, llm = mla
    expected = [_hf_tokens(model, prompt, 16) for prompt in PROMPTS]
    assert all(len(set(tokens)) > 4 for tokens in expected), f"HF's tokens hardly vary: {expected}"
    with reference_kernels():
        outputs = llm.generate(PROMPTS, max_new_tokens=16)
    assert [out.token_ids for out in outputs] == expected


def test_step_logits_match_hf_prefill_and_decode(mla) -> None:  # noqa: ANN001
    """Within 2e-5 x the largest logit, not 1e-5: the prefills equal HF's forward exactly, but a
    decode step of both rows differs by up to 1.05e-5 x the largest logit (q_lora, one step of
    eight; 3.2e-6 without the query's LoRA), measured, against 1.3e-6 for HF's own cached decode
    of one row: fp32 reordering of the batched rows through these wide weights. A wrong or
    missing latent moves logits by order 1 (the zeroed-cache test below)."""
    _assert_step_logits_match(*mla, atol=2e-5)


def test_a_prompt_prefilled_in_two_chunks_equals_one_prefill(mla) -> None:  # noqa: ANN001
    """The second chunk (start > 0) attends over the latents the first left in the cache."""
    model, llm = mla
    prompt = torch.tensor([PROMPTS[2]])
    with torch.no_grad(), reference_kernels():
        llm.step(prompt[:, :4], torch.arange(4)[None], [1], [0])
        chunked = llm.step(prompt[:, 4:], torch.arange(4, prompt.shape[1])[None], [1], [4])
        _assert_logits_close(chunked, model(prompt).logits[:, 4:])


def test_a_decode_step_without_the_cached_latents_is_wrong(mla) -> None:  # noqa: ANN001
    """What the tests above would catch: the same decode step with the slot's latent cache
    zeroed moves the logits far beyond their tolerance."""
    model, llm = mla
    prompt = PROMPTS[0]
    with torch.no_grad(), reference_kernels():
        first = int(llm.step(torch.tensor([prompt]), torch.arange(len(prompt))[None], [0], [0])[0, -1].argmax())
        for cache in llm.caches.values():
            cache[0].zero_()
        stale = llm.step(torch.tensor([[first]]), torch.tensor([[len(prompt)]]), [0], [len(prompt)])[0, -1]
        expected = model(torch.tensor([[*prompt, first]])).logits[0, -1]
    assert (stale - expected).abs().max() > 1.0


@pytest.mark.parametrize("mla", ["q_lora"], indirect=True)  # the kernel sees q_nope whichever way q came
def test_in_the_interpreter(mla, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """Every kernel in the Triton interpreter, the MLA kernel among them (prefill, decode of both
    slots, a reused slot), the reference refused: three prompts in two slots, 6 new tokens."""
    model, llm = mla
    assert any(name.startswith("cached_mla_attention") for name in graph_kernels(llm.graph))
    with kernels_ran(monkeypatch):
        outputs = llm.generate(PROMPTS, max_new_tokens=6)
    assert [out.token_ids for out in outputs] == [_hf_tokens(model, prompt, 6) for prompt in PROMPTS]


def test_every_pass_and_kernel_verified(monkeypatch: pytest.MonkeyPatch) -> None:
    """`verify=True`: each pass (the cached function at start 0 computes what the uncached one
    did with HF's expanded K and V) and the compiled kernels against the IR, on the same random
    inputs; strict (no pass may be skipped)."""
    monkeypatch.setenv("AD_MLIR_SKIP_ON_ERROR", "0")
    _, program = compile_program(export_for_cache(_model("q_lora"), 2, 32), pipeline=cached_pipeline("default", 2, 32),
                                 verify=True)
    assert sum(isinstance(op, ad.CachedMlaAttentionOp) for op in program.function.body.walk()) == 2


def test_decode_traffic_counts_the_latent_not_k_and_v(mla) -> None:  # noqa: ANN001
    """`ad-bench`'s modelled decode step: its ideal reads (rank + rope) x 4 bytes per cached token
    and layer and writes as much per new token, the heads' K and V never; the modelled step
    (which reads the latents and the absorbed query's intermediates too) is above that ideal."""
    from ad_mlir.bench.decode_traffic import decode_step_traffic

    _, llm = mla
    per_token = len(LAYERS) * (RANK + ROPE) * 4
    traffic = decode_step_traffic(llm.program, 2, 10)
    assert traffic["ideal_caches_read_bytes"] == 2 * 10 * per_token
    assert traffic["ideal_new_kv_written_bytes"] == 2 * per_token
    assert traffic["modelled_bytes"] > traffic["ideal_bytes"]


def test_deepseek_v2_caches_its_latent_and_generates_hf_greedy_tokens() -> None:
    """DeepSeek-V2's attention class (RoPE through `apply_rotary_emb`, the key part rotated before
    the cache as in V3): the same latent cache, HF's tokens for three prompts in two slots."""
    from transformers import DeepseekV2Config

    config = DeepseekV2Config(**{k: v for k, v in COMMON.items() if k not in ("n_group", "topk_group")},
                              q_lora_rank=None)
    model = model_from_config(config)
    llm = ad_mlir.LLM(model, max_batch=2, max_seq_len=32)
    assert {name: tuple(c.shape) for name, c in llm.caches.items()} == {
        "latent_cache_0": (2, 32, RANK + ROPE), "latent_cache_1": (2, 32, RANK + ROPE)}
    expected = [_hf_tokens(model, prompt, 8) for prompt in PROMPTS]
    assert all(len(set(tokens)) > 3 for tokens in expected), f"HF's tokens hardly vary: {expected}"
    with reference_kernels():
        outputs = llm.generate(PROMPTS, max_new_tokens=8)
    assert [out.token_ids for out in outputs] == expected
