"""Recurrent sequence mixers generating through their per-slot states: Mamba2's scan
(`ad.cached_ssm_scan`, Nemotron-H: Mamba2, MoE, attention and MLP layers) and the gated delta
rule (`ad.cached_gated_delta_rule`, Qwen3-Next: linear attention and gated full attention with
partial rotary; Olmo-Hybrid), each beside its short convolution (`ad.cached_causal_conv1d`) and the K/V
cache; MiniMax's lightning attention (no convolution) as Mamba2's scan. Tiny configs built with a wide init (0.5), so that greedy tokens vary and a state that is
wrong or missing shows; chunks of 8 tokens (Nemotron-H's `chunk_size`; Qwen3-Next's scan is
chunked by 64) so that HF's prefill spans chunks; per-step logits against HF's full-prefix
forward."""

from __future__ import annotations

import pytest
import torch
from kernel_guard import graph_kernels
from test_generate import (
    _assert_interpreted_tokens_are_hf,
    _assert_logits_close,
    _assert_step_logits_match,
    _hf_tokens,
)
from transformers import (
    AutoModelForCausalLM,
    MiniMaxConfig,
    NemotronHConfig,
    OlmoHybridConfig,
    Qwen3NextConfig,
)

import ad_mlir
from ad_mlir.compiler import compile_program
from ad_mlir.dialects import ad
from ad_mlir.llm.cache_export import export_for_cache
from ad_mlir.llm.pipelines import cached_pipeline
from ad_mlir.runtime.kernels import reference_kernels

PROMPTS = [[5, 9, 13, 3, 7, 40, 41], [3, 4], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]
COMMON = {"vocab_size": 1000, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
          "intermediate_size": 128, "initializer_range": 0.5, "max_position_embeddings": 256, "pad_token_id": 0}
CONFIGS = {
    "nemotron_h": NemotronHConfig(
        **COMMON, layers_block_type=["linear_attention", "moe", "full_attention", "mlp"], mamba_num_heads=4,
        mamba_head_dim=16, n_groups=2, ssm_state_size=16, chunk_size=8, conv_kernel=4, n_routed_experts=4,
        moe_intermediate_size=64, moe_shared_expert_intermediate_size=64, num_experts_per_tok=2),
    "qwen3_next": Qwen3NextConfig(
        **COMMON, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"], linear_key_head_dim=16,
        linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4, linear_conv_kernel_dim=4,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32),
    # the delta rule with negative eigenvalues (beta up to 2) and its conv cut by x[..., -seq_len:]
    "olmo_hybrid": OlmoHybridConfig(
        **COMMON, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"], linear_key_head_dim=16,
        linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=2, linear_conv_kernel_dim=4),
}
STATES = {
    # conv channels: Mamba2's x, B and C (4 x 16 + 2 x 2 x 16); the delta rule's q, k, v (2 x 2 x 16 + 4 x 8)
    "nemotron_h": {"conv_state_0": (2, 128, 3), "ssm_state_0": (2, 4, 16, 16)},
    "qwen3_next": {"conv_state_0": (2, 96, 3), "recurrent_state_0": (2, 4, 16, 8)},
    "olmo_hybrid": {"conv_state_0": (2, 80, 3), "recurrent_state_0": (2, 2, 16, 8)},
}
SCAN_OPS = {"nemotron_h": ad.CachedSsmScanOp, "qwen3_next": ad.CachedGatedDeltaRuleOp,
            "olmo_hybrid": ad.CachedGatedDeltaRuleOp}
STATE_NAMES = {"nemotron_h": "ssm_state_0", "qwen3_next": "recurrent_state_0", "olmo_hybrid": "recurrent_state_0"}
FAMILIES = list(CONFIGS)


@pytest.fixture(scope="module")
def llms() -> dict[str, tuple[torch.nn.Module, ad_mlir.LLM]]:
    made = {}
    for family, config in CONFIGS.items():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).eval()
        made[family] = model, ad_mlir.LLM(model, max_batch=2, max_seq_len=48)
    return made


@pytest.mark.parametrize("family", FAMILIES)
def test_the_scan_state_is_cached_per_slot_in_fp32(llms, family: str) -> None:  # noqa: ANN001
    _, llm = llms[family]
    states = {name: tuple(c.shape) for name, c in llm.caches.items() if name in llm.slot_states}
    assert states == STATES[family]
    assert llm.caches[STATE_NAMES[family]].dtype == torch.float32  # HF keeps it in fp32 too
    # kv_cache_budget counts these states per slot, apart from the K/V bytes per token (fp32 model: 4 bytes)
    assert llm.state_bytes == sum(4 * torch.Size(shape).numel() for shape in STATES[family].values())
    ops = [type(op) for op in llm.program.function.body.walk()]
    assert ops.count(SCAN_OPS[family]) == 1 and ops.count(ad.CachedCausalConv1dOp) == 1
    assert ops.count(ad.CachedAttentionOp) == 1


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_match_hf_generate(llms, family: str) -> None:  # noqa: ANN001
    """Three prompts in two slots: a slot is reused, its states reset by the new prompt."""
    model, llm = llms[family]
    with reference_kernels():
        outputs = llm.generate(PROMPTS, max_new_tokens=16)
    assert [out.token_ids for out in outputs] == [_hf_tokens(model, prompt, 16) for prompt in PROMPTS]


@pytest.mark.parametrize("family", FAMILIES)
def test_step_logits_match_hf_prefill_and_decode(llms, family: str) -> None:  # noqa: ANN001
    """Prefills of 7 and 11 tokens (HF's scan over one and two chunks), then 4 decode steps of
    both rows; measured: at most 8.8e-6 (nemotron_h) and 7e-5 (qwen3_next) off on logits up to
    15, within `_assert_logits_close`'s 1e-5 x the largest logit."""
    _assert_step_logits_match(*llms[family])


@pytest.mark.parametrize("family", FAMILIES)
def test_a_prompt_prefilled_in_two_chunks_equals_one_prefill(llms, family: str) -> None:  # noqa: ANN001
    """The second chunk (start > 0) continues from the states and K/V the first left."""
    model, llm = llms[family]
    prompt = torch.tensor([PROMPTS[2]])
    with torch.no_grad(), reference_kernels():
        llm.step(prompt[:, :4], torch.arange(4)[None], [1], [0])
        chunked = llm.step(prompt[:, 4:], torch.arange(4, prompt.shape[1])[None], [1], [4])
        _assert_logits_close(chunked, model(prompt).logits[:, 4:])


@pytest.mark.parametrize("family", FAMILIES)
def test_a_decode_step_without_the_scan_state_is_wrong(llms, family: str) -> None:  # noqa: ANN001
    """What the tests above would catch: the same decode step with the slot's scan state
    zeroed (the convolution's kept) moves the logits far beyond their tolerance."""
    model, llm = llms[family]
    prompt = PROMPTS[0]
    with torch.no_grad(), reference_kernels():
        first = int(llm.step(torch.tensor([prompt]), torch.arange(len(prompt))[None], [0], [0])[0, -1].argmax())
        llm.caches[STATE_NAMES[family]][0].zero_()
        stale = llm.step(torch.tensor([[first]]), torch.tensor([[len(prompt)]]), [0], [len(prompt)])[0, -1]
        expected = model(torch.tensor([[*prompt, first]])).logits[0, -1]
    assert (stale - expected).abs().max() > 1.0


@pytest.mark.parametrize("family", FAMILIES)
def test_in_the_interpreter(llms, family: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """Every kernel in the Triton interpreter, the scan's and the convolution's among them, the
    reference refused: three prompts in two slots, 6 new tokens."""
    model, llm = llms[family]
    kernels = graph_kernels(llm.graph)
    assert any(name.startswith(SCAN_OPS[family].name.removeprefix("ad.")) for name in kernels), kernels
    assert any(name.startswith("cached_causal_conv1d") for name in kernels), kernels
    _assert_interpreted_tokens_are_hf(model, llm, monkeypatch, PROMPTS, 6)


@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_next"])  # OLMo-Hybrid's op is Qwen3-Next's
def test_every_pass_and_kernel_verified(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`verify=True`: each pass (the cached function at start 0, the sequential scan, computes
    what the uncached one did with HF's chunked scan) and the compiled kernels against the IR, on
    the same random inputs; strict (no pass may be skipped)."""
    monkeypatch.setenv("AD_MLIR_SKIP_ON_ERROR", "0")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS[family]).eval()
    _, program = compile_program(export_for_cache(model, 2, 32), pipeline=cached_pipeline("default", 2, 32),
                                 verify=True)
    assert any(isinstance(op, SCAN_OPS[family]) for op in program.function.body.walk())


MINIMAX = MiniMaxConfig(
    vocab_size=1000, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
    initializer_range=0.5, max_position_embeddings=256, pad_token_id=0, num_hidden_layers=2,
    layer_types=["linear_attention", "full_attention"], num_local_experts=4, num_experts_per_tok=2, block_size=8)
"""MiniMax: lightning attention (linear attention with a decay per head, exported through Mamba2's
scan, `frontends/export_patches.py`) and full attention, each followed by MoE; blocks of 8 tokens,
so that HF's prefill of 11 tokens loops over two."""


@pytest.fixture(scope="module")
def minimax() -> tuple[torch.nn.Module, ad_mlir.LLM]:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(MINIMAX).eval()
    return model, ad_mlir.LLM(model, max_batch=2, max_seq_len=48)


def test_minimax_caches_its_lightning_attention_as_a_scan_state(minimax) -> None:  # noqa: ANN001
    """HF's linear-attention state [heads, head_dim, head_dim] per slot, in fp32, beside the K/V cache."""
    _, llm = minimax
    assert {name: tuple(c.shape) for name, c in llm.caches.items()} == {
        "k_cache_0": (2, 48, 2, 16), "v_cache_0": (2, 48, 2, 16), "ssm_state_0": (2, 4, 16, 16)}
    assert llm.caches["ssm_state_0"].dtype == torch.float32
    ops = [type(op) for op in llm.program.function.body.walk()]
    assert ops.count(ad.CachedSsmScanOp) == 1 and ops.count(ad.CachedAttentionOp) == 1


def test_minimax_greedy_tokens_match_hf_generate(minimax) -> None:  # noqa: ANN001
    """Three prompts in two slots (HF's decode is its recurrence over its cached state)."""
    model, llm = minimax
    with reference_kernels():
        outputs = llm.generate(PROMPTS, max_new_tokens=16)
    assert [out.token_ids for out in outputs] == [_hf_tokens(model, prompt, 16) for prompt in PROMPTS]


def test_minimax_step_logits_match_hf_prefill_and_decode(minimax) -> None:  # noqa: ANN001
    """Prefills of 7 and 11 tokens, then 4 decode steps of both rows. Within 2e-5 x the largest
    logit, not 1e-5: both sides are fp32 computations of the same sums in other orders (HF's blocks
    multiply decays, the scan steps token by token), each that far from an fp64 forward of the
    model (measured over these steps: HF up to 6.5e-6, ours up to 9.7e-6 x the largest logit of
    ~15), so their difference reaches the sum (measured: 1.15e-5). A state that is wrong or
    missing moves the logits by order 1 (the test below)."""
    _assert_step_logits_match(*minimax, atol=2e-5)


def test_minimax_decode_without_the_lightning_state_is_wrong(minimax) -> None:  # noqa: ANN001
    model, llm = minimax
    prompt = PROMPTS[0]
    with torch.no_grad(), reference_kernels():
        first = int(llm.step(torch.tensor([prompt]), torch.arange(len(prompt))[None], [0], [0])[0, -1].argmax())
        llm.caches["ssm_state_0"][0].zero_()
        stale = llm.step(torch.tensor([[first]]), torch.tensor([[len(prompt)]]), [0], [len(prompt)])[0, -1]
        expected = model(torch.tensor([[*prompt, first]])).logits[0, -1]
    assert (stale - expected).abs().max() > 1.0
