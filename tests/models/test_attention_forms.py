"""Attention forms beyond softmax(q.k * scale + mask), generating through the K/V cache:
gpt-oss's attention sinks (a learned logit per head that joins the softmax, with a sliding window
on alternate layers), ALiBi (BLOOM's bias from key positions over [batch * heads] bmm rows, MPT's
counted from the last key, under a masked_fill; both without position_ids). (DeepSeek-V3's MLA,
whose value head dim differs from the query's, caches its latent: tests/models/test_mla.py.)
Models built from their config classes with wide random weights, so that
greedy tokens vary; tokens against HF `generate` (three prompts in two slots) and per-step logits
(prefill and 4 decode steps) against HF's full-prefix forward, with the kernels as their torch
reference and in the Triton interpreter."""

from __future__ import annotations

import pytest
import torch
from test_generate import _assert_interpreted_tokens_are_hf, _assert_step_logits_match, _hf_tokens
from xdsl.dialects.builtin import DYNAMIC_INDEX

import ad_mlir
from ad_mlir.compiler import compile_program
from ad_mlir.dialects import ad
from ad_mlir.llm.cache_export import export_for_cache
from ad_mlir.llm.pipelines import cached_pipeline
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.zoo.small import model_from_config, small_config

PROMPTS = [[5, 9, 13, 3, 7, 40, 41], [3, 4], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]
GPT_OSS_WINDOW = 4
"""gpt-oss's sliding layers' window, reached by the 7- and 11-token prompts and every decode."""


@pytest.fixture(scope="module")
def gpt_oss() -> tuple[torch.nn.Module, ad_mlir.LLM]:
    """Two layers, sliding then full attention, each with sinks; MoE MLPs."""
    config = small_config("gpt_oss")
    config.initializer_range = 0.5
    config.sliding_window = GPT_OSS_WINDOW
    config.layer_types = ["sliding_attention", "full_attention"]
    model = model_from_config(config)
    return model, ad_mlir.LLM(model, max_batch=2, max_seq_len=32)


def test_gpt_oss_caches_its_attention_with_sinks_and_window(gpt_oss) -> None:  # noqa: ANN001
    _, llm = gpt_oss
    cached = [op for op in llm.program.function.body.walk() if isinstance(op, ad.CachedAttentionOp)]
    assert [op.window.value.data if op.window else None for op in cached] == [GPT_OSS_WINDOW, None]
    assert all(op.sinks is not None and op.sinks.type.get_shape() == (4,) for op in cached)
    assert not any(isinstance(op, ad.SoftmaxOp) for op in llm.program.function.body.walk())


def test_gpt_oss_generates_hf_greedy_tokens(gpt_oss) -> None:  # noqa: ANN001
    model, llm = gpt_oss
    with reference_kernels():
        outputs = llm.generate(PROMPTS, max_new_tokens=8)
    assert [out.token_ids for out in outputs] == [_hf_tokens(model, prompt, 8) for prompt in PROMPTS]


def test_gpt_oss_step_logits_match_hf_prefill_and_decode(gpt_oss) -> None:  # noqa: ANN001
    """Within 3e-5 x the largest logit, not 1e-5: HF's own fp32 forward is noisy here. Against a
    float64 forward of the same weights (measured on a 2-core x86 CPU, prefill and 4 decode steps),
    HF's fp32 logits are up to 8.0e-5 x the largest logit off, ours as much, and ours differ from
    HF's by up to 1.2e-5 x (on an earlier machine under 1e-5 x: the CPU's GEMM kernels order the
    sums). A wrong sink, window or cache entry moves logits by order 1."""
    _assert_step_logits_match(*gpt_oss, atol=3e-5)


def test_gpt_oss_in_the_interpreter(gpt_oss, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The cached attention's kernel with sinks (prefill and split-K decode) in the Triton
    interpreter, the reference refused: three prompts in two slots."""
    model, llm = gpt_oss
    _assert_interpreted_tokens_are_hf(model, llm, monkeypatch, PROMPTS, 4)


def test_gpt_oss_sinks_decide_its_tokens(gpt_oss) -> None:  # noqa: ANN001
    """What the tests above would catch: the same weights with sinks of -inf (no sink) generate
    other tokens, so a cached attention that dropped the sinks would be seen."""
    model, _ = gpt_oss
    sinkless = model_from_config(model.config)
    sinkless.load_state_dict(model.state_dict())
    with torch.no_grad():
        for layer in sinkless.model.layers:
            layer.self_attn.sinks.fill_(float("-inf"))
    assert [_hf_tokens(sinkless, p, 8) for p in PROMPTS] != [_hf_tokens(model, p, 8) for p in PROMPTS]


# -- ALiBi --------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["bloom", "mpt"])
def alibi_model(request: pytest.FixtureRequest) -> tuple[str, torch.nn.Module, ad_mlir.LLM]:
    """6 heads (hidden 192): ALiBi's slopes for a head count that is no power of two (BLOOM's and
    MPT's formulas differ there)."""
    config = small_config(request.param)
    config.initializer_range = 0.5
    config.num_attention_heads, config.hidden_size = 6, 192
    model = model_from_config(config)
    return request.param, model, ad_mlir.LLM(model, max_batch=2, max_seq_len=32)


def test_alibi_is_cached_with_its_slopes(alibi_model) -> None:  # noqa: ANN001
    """Each layer's attention is one cached op that reads the model's [heads] slopes (computed in
    the graph from constants), with HF's bias and mask computations gone."""
    _, _, llm = alibi_model
    ops = list(llm.program.function.body.walk())
    cached = [op for op in ops if isinstance(op, ad.CachedAttentionOp)]
    assert len(cached) == 2 and all(op.alibi_slopes is not None for op in cached)
    assert cached[0].alibi_slopes == cached[1].alibi_slopes
    assert not any(isinstance(op, ad.SoftmaxOp | ad.BmmOp | ad.MatmulOp) for op in ops)
    positions = [op for op in ops if isinstance(op, ad.ArangeOp) and DYNAMIC_INDEX in op.result.type.get_shape()]
    assert not positions, "positions counted in the graph (HF's bias or mask) are gone"


def test_alibi_generates_hf_greedy_tokens(alibi_model) -> None:  # noqa: ANN001
    _, model, llm = alibi_model
    with reference_kernels():
        outputs = llm.generate(PROMPTS, max_new_tokens=8)
    assert [out.token_ids for out in outputs] == [_hf_tokens(model, prompt, 8) for prompt in PROMPTS]


def test_alibi_step_logits_match_hf_prefill_and_decode(alibi_model) -> None:  # noqa: ANN001
    """Within 1e-4 x the largest logit, not 1e-5: these wide models are noisier in fp32 than the
    others. Against a float64 forward of the same weights (measured on a 2-core x86 CPU, prefill
    and 4 decode steps, BLOOM), HF's fp32 logits are up to 7.3e-5 x the largest logit off, ours
    2.6e-5 x (closer), and the two differ by up to 4.7e-5 x (an earlier machine measured 2.1e-5 x:
    the CPU's GEMM kernels order the sums). A wrong bias or cache entry moves logits by order 1."""
    _assert_step_logits_match(*alibi_model[1:], atol=1e-4)


def test_alibi_in_the_interpreter(alibi_model, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The cached attention's kernel with ALiBi (prefill and split-K decode) in the Triton
    interpreter, the reference refused: three prompts in two slots."""
    _, model, llm = alibi_model
    _assert_interpreted_tokens_are_hf(model, llm, monkeypatch, PROMPTS, 4)


@pytest.mark.parametrize("family", ["bloom", "mpt"])
def test_every_pass_and_kernel_verified_on_alibi(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`verify=True` on BLOOM's and MPT's ALiBi at the wide init: each pass (the cached function at
    start 0 computes what the uncached one did) and the compiled kernels against the IR, on the
    same random inputs; strict. Their wide activations amplify fp32 rounding past the fixed
    tolerance (match-layernorm: 7e-5 on BLOOM's GELU tanh, 1.3e-3 on MPT's second-layer scores),
    which the verifier tells from a wrong rewrite by a run with the inputs nudged by one rounding."""
    monkeypatch.setenv("AD_MLIR_SKIP_ON_ERROR", "0")
    config = small_config(family)
    config.initializer_range = 0.5
    config.num_attention_heads, config.hidden_size = 6, 192
    _, program = compile_program(export_for_cache(model_from_config(config), 2, 32),
                                 pipeline=cached_pipeline("default", 2, 32), verify=True)
    assert sum(isinstance(op, ad.CachedAttentionOp) and op.alibi_slopes is not None
               for op in program.function.body.walk()) == 2

