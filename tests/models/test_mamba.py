"""Mamba1's selective scan generating through its per-slot states (`ad.cached_selective_scan`
beside its short convolution's `ad.cached_causal_conv1d`): Mamba and Falcon-Mamba, models with no
attention at all. HF's `mamba_selective_scan` (a Python loop over time steps) is routed through
an opaque op while exporting (`frontends/export_patches.py`), which the cache pass replaces. Tiny
configs built with a wide init (0.5), so that greedy tokens vary and a wrong or missing state
shows; tokens against HF `generate` (three prompts in two slots), per-step logits against HF's
full-prefix forward, with the kernels as their torch reference and in the Triton interpreter."""

from __future__ import annotations

import pytest
import torch
from kernel_guard import graph_kernels, kernels_ran
from test_generate import _assert_logits_close, _assert_step_logits_match, _hf_tokens
from transformers import AutoConfig, AutoModelForCausalLM

import ad_mlir
from ad_mlir.compiler import compile_program
from ad_mlir.dialects import ad
from ad_mlir.llm.cache_export import export_for_cache
from ad_mlir.llm.pipelines import cached_pipeline
from ad_mlir.runtime.kernels import reference_kernels

PROMPTS = [[5, 9, 13, 3, 7, 40, 41], [3, 4], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]
FAMILIES = ["mamba", "falcon_mamba"]
CHANNELS, STATE, KERNEL = 128, 8, 4
"""Hidden 64 expanded twice; Mamba's state size 16 halved; its convolution of 4."""


def _model(family: str) -> torch.nn.Module:
    config = AutoConfig.for_model(family, vocab_size=1000, hidden_size=64, state_size=STATE, num_hidden_layers=2,
                                  expand=2, conv_kernel=KERNEL, time_step_rank=8, initializer_range=0.5,
                                  pad_token_id=0)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.fixture(scope="module", params=FAMILIES)
def mamba(request: pytest.FixtureRequest) -> tuple[torch.nn.Module, ad_mlir.LLM]:
    model = _model(request.param)
    return model, ad_mlir.LLM(model, max_batch=2, max_seq_len=48)


def test_the_states_are_cached_per_slot(mamba) -> None:  # noqa: ANN001
    """Per layer a convolution state [slots, channels, kernel - 1] and an fp32 SSM state [slots,
    channels, state]; nothing per token."""
    _, llm = mamba
    assert {name: tuple(c.shape) for name, c in llm.caches.items()} == {
        f"{role}_{i}": shape for i in range(2)
        for role, shape in (("conv_state", (2, CHANNELS, KERNEL - 1)), ("ssm_state", (2, CHANNELS, STATE)))}
    assert all(llm.caches[f"ssm_state_{i}"].dtype == torch.float32 for i in range(2))
    assert llm.token_bytes == {} and llm.state_bytes == 2 * 2 * 4 * CHANNELS * (KERNEL - 1 + STATE)
    ops = [type(op) for op in llm.program.function.body.walk()]
    assert ops.count(ad.CachedSelectiveScanOp) == 2 and ops.count(ad.CachedCausalConv1dOp) == 2


def test_greedy_tokens_match_hf_generate(mamba) -> None:  # noqa: ANN001
    """Three prompts in two slots, 16 new tokens: a slot is reused, its states reset."""
    model, llm = mamba
    expected = [_hf_tokens(model, prompt, 16) for prompt in PROMPTS]
    assert all(len(set(tokens)) > 4 for tokens in expected), f"HF's tokens hardly vary: {expected}"
    with reference_kernels():
        outputs = llm.generate(PROMPTS, max_new_tokens=16)
    assert [out.token_ids for out in outputs] == expected


def test_step_logits_match_hf_prefill_and_decode(mamba) -> None:  # noqa: ANN001
    _assert_step_logits_match(*mamba)


def test_a_prompt_prefilled_in_two_chunks_equals_one_prefill(mamba) -> None:  # noqa: ANN001
    model, llm = mamba
    prompt = torch.tensor([PROMPTS[2]])
    with torch.no_grad(), reference_kernels():
        llm.step(prompt[:, :4], torch.arange(4)[None], [1], [0])
        chunked = llm.step(prompt[:, 4:], torch.arange(4, prompt.shape[1])[None], [1], [4])
        _assert_logits_close(chunked, model(prompt).logits[:, 4:])


def test_a_decode_step_without_the_scan_state_is_wrong(mamba) -> None:  # noqa: ANN001
    """What the tests above would catch: the same decode step with the slot's SSM states zeroed
    (the convolutions' kept) moves the logits far beyond their tolerance."""
    model, llm = mamba
    prompt = PROMPTS[0]
    with torch.no_grad(), reference_kernels():
        first = int(llm.step(torch.tensor([prompt]), torch.arange(len(prompt))[None], [0], [0])[0, -1].argmax())
        for i in range(2):
            llm.caches[f"ssm_state_{i}"][0].zero_()
        stale = llm.step(torch.tensor([[first]]), torch.tensor([[len(prompt)]]), [0], [len(prompt)])[0, -1]
        expected = model(torch.tensor([[*prompt, first]])).logits[0, -1]
    assert (stale - expected).abs().max() > 1.0


@pytest.mark.parametrize("mamba", ["mamba"], indirect=True)  # Falcon-Mamba's extra norms are no kernel of the scan
def test_in_the_interpreter(mamba, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """Every kernel in the Triton interpreter, the selective scan's and the convolution's among
    them, the reference refused: three prompts in two slots, 6 new tokens."""
    model, llm = mamba
    kernels = graph_kernels(llm.graph)
    assert any(name.startswith("cached_selective_scan") for name in kernels), kernels
    with kernels_ran(monkeypatch):
        outputs = llm.generate(PROMPTS, max_new_tokens=6)
    assert [out.token_ids for out in outputs] == [_hf_tokens(model, prompt, 6) for prompt in PROMPTS]


def test_every_pass_and_kernel_verified(monkeypatch: pytest.MonkeyPatch) -> None:
    """`verify=True`: each pass (the cached function at start 0, the sequential scan, computes
    what the uncached one did with HF's scan) and the compiled kernels against the IR; strict."""
    monkeypatch.setenv("AD_MLIR_SKIP_ON_ERROR", "0")
    _, program = compile_program(export_for_cache(_model("mamba"), 2, 32), pipeline=cached_pipeline("default", 2, 32),
                                 verify=True)
    assert sum(isinstance(op, ad.CachedSelectiveScanOp) for op in program.function.body.walk()) == 2
