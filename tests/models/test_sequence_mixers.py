"""Sequence mixers other than attention, generating through their caches: LFM2's short
convolution (`ad.cached_causal_conv1d` over a per-slot state), ZAYA's CCA projection (its q/k
convolutions after a left pad and its delayed values, each through `ad.cached_token_window`).
Random weights with a wide init, so that greedy tokens vary and a state that is wrong or missing
shows (it did: HF's first token, then others, before the convolution was cached); per-step logits
against HF's full-prefix forward."""

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
from transformers import AutoModelForCausalLM, Lfm2Config

import ad_mlir
from ad_mlir.bench.families import FamilyRow, check_generation, generation_config, greedy_only
from ad_mlir.compiler import compile_program
from ad_mlir.dialects import ad
from ad_mlir.llm.cache_export import export_for_cache
from ad_mlir.llm.pipelines import cached_pipeline
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.zoo.small import model_from_config, small_config

PROMPTS = [[5, 9, 13, 3, 7, 40, 41], [3, 4], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]


@pytest.fixture(scope="module")
def lfm2() -> tuple[torch.nn.Module, ad_mlir.LLM]:
    """Two layers, a short convolution then attention, in two slots."""
    config = Lfm2Config(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, layer_types=["conv", "full_attention"],
                        initializer_range=0.5, pad_token_id=0, max_position_embeddings=256)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    return model, ad_mlir.LLM(model, max_batch=2, max_seq_len=48)


def test_lfm2_caches_the_conv_state_beside_the_kv_cache(lfm2) -> None:  # noqa: ANN001
    _, llm = lfm2
    assert {name: tuple(c.shape) for name, c in llm.caches.items()} == {
        "k_cache_0": (2, 48, 2, 32), "v_cache_0": (2, 48, 2, 32), "conv_state_0": (2, 128, 2)}
    ops = [type(op) for op in llm.program.function.body.walk()]
    assert ops.count(ad.CachedCausalConv1dOp) == 1 and ops.count(ad.CachedAttentionOp) == 1


def test_a_byte_budget_counts_the_conv_state_per_slot(lfm2) -> None:  # noqa: ANN001
    """2 slots of conv state (128 channels x 2 inputs, fp32: 1 KiB each) beside K/V of 512 bytes a
    token (one attention layer, 2 K/V heads of 32): the budget for 20 tokens a slot buys exactly
    that (counting the state per token would give 21 a slot and overrun the budget)."""
    model, _ = lfm2
    budget = 2 * 1024 + 2 * 20 * 512
    llm = ad_mlir.LLM(model, max_batch=2, kv_cache_budget=budget)
    assert (llm.max_seq_len, llm.state_bytes, llm.cache_bytes) == (20, 2048, budget)


def test_a_byte_budget_leaves_a_model_of_states_alone_at_its_longest() -> None:
    """Two conv layers and no attention: the caches are per-slot states (2 slots x 128 channels x
    2 inputs, fp32: 2 KiB a layer) that do not grow with the tokens, so a budget that holds them buys the
    longest slots the model has positions for, and one that does not is refused."""
    config = Lfm2Config(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, layer_types=["conv", "conv"],
                        pad_token_id=0, max_position_embeddings=256)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with pytest.raises(ValueError, match="kv_cache_budget of 3072 bytes does not hold the 4096 bytes of per-slot states"):
        ad_mlir.LLM(model, max_batch=2, kv_cache_budget=3 * 1024)
    llm = ad_mlir.LLM(model, max_batch=2, kv_cache_budget=4 * 1024)
    assert set(llm.caches) == {"conv_state_0", "conv_state_1"}
    assert (llm.max_seq_len, llm.state_bytes, llm.cache_bytes) == (256, 4096, 4096)


def test_lfm2_generates_hf_greedy_tokens(lfm2) -> None:  # noqa: ANN001
    """Three prompts in two slots: a slot is reused, its state reset by the new prompt."""
    model, llm = lfm2
    with reference_kernels():
        outputs = llm.generate(PROMPTS, max_new_tokens=16)
    expected = [_hf_tokens(model, prompt, 16) for prompt in PROMPTS]
    assert all(len(set(tokens)) > 4 for tokens in expected)  # varied: a decode without the state differs
    assert [out.token_ids for out in outputs] == expected


def test_lfm2_step_logits_match_hf_prefill_and_decode(lfm2) -> None:  # noqa: ANN001
    _assert_step_logits_match(*lfm2)  # measured: at most 1.5e-5 off, on logits up to 23


def test_a_prompt_prefilled_in_two_chunks_equals_one_prefill(lfm2) -> None:  # noqa: ANN001
    """The second chunk (start > 0) continues from the state and K/V the first left."""
    model, llm = lfm2
    prompt = torch.tensor([PROMPTS[2]])
    with torch.no_grad(), reference_kernels():
        llm.step(prompt[:, :4], torch.arange(4)[None], [1], [0])
        chunked = llm.step(prompt[:, 4:], torch.arange(4, prompt.shape[1])[None], [1], [4])
        _assert_logits_close(chunked, model(prompt).logits[:, 4:])


def test_a_decode_step_without_the_conv_state_is_wrong(lfm2) -> None:  # noqa: ANN001
    """What the tests above would catch: the same decode step with the slot's state zeroed moves
    the logits far beyond their tolerance."""
    model, llm = lfm2
    prompt = PROMPTS[0]
    with torch.no_grad(), reference_kernels():
        first = int(llm.step(torch.tensor([prompt]), torch.arange(len(prompt))[None], [0], [0])[0, -1].argmax())
        llm.caches["conv_state_0"][0].zero_()
        stale = llm.step(torch.tensor([[first]]), torch.tensor([[len(prompt)]]), [0], [len(prompt)])[0, -1]
        expected = model(torch.tensor([[*prompt, first]])).logits[0, -1]
    assert (stale - expected).abs().max() > 1.0


def test_lfm2_in_the_interpreter(lfm2, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """Every kernel in the Triton interpreter, the conv state kernel among them, the reference
    refused: three prompts in two slots, 8 new tokens."""
    model, llm = lfm2
    assert any(name.startswith("cached_causal_conv1d") for name in graph_kernels(llm.graph))
    _assert_interpreted_tokens_are_hf(model, llm, monkeypatch, PROMPTS, 8)


def test_every_pass_and_kernel_verified_on_lfm2(lfm2, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """`verify=True`: each pass (the cached function at start 0 computes what the uncached one
    did) and the compiled kernels against the IR, on the same random inputs; strict (no pass may
    be skipped)."""
    model, _ = lfm2
    monkeypatch.setenv("AD_MLIR_SKIP_ON_ERROR", "0")
    _, program = compile_program(export_for_cache(model, 2, 32), pipeline=cached_pipeline("default", 2, 32),
                                 verify=True)
    assert any(isinstance(op, ad.CachedCausalConv1dOp) for op in program.function.body.walk())


def test_the_sweeps_generation_column_runs_lfm2_with_its_conv_layer() -> None:
    """The family sweep's generation column gives a hybrid one layer of each kind: LFM2's conv
    layer is in the model it compares, and its tokens equal HF's."""
    assert generation_config("lfm2").layer_types == ["conv", "full_attention"]
    row = FamilyRow("lfm2", status="ok")
    check_generation(row)
    assert (row.generation, row.generation_reason) == ("equal", "")


def test_the_sweeps_generation_column_runs_a_pure_mamba2() -> None:
    """Mamba2 without any attention layer (`mamba2`, whose small config needs heads of its own:
    `zoo.small.FAMILY_SIZES`) generates HF's tokens from its cached conv and scan states alone."""
    assert generation_config("mamba2").layer_types == ["linear_attention", "linear_attention"]
    row = FamilyRow("mamba2", status="ok")
    check_generation(row)
    assert (row.generation, row.generation_reason) == ("equal", "")


# -- ZAYA: a cached token window before its convolutions and its delayed values ---------------


@pytest.fixture(scope="module")
def zaya() -> tuple[torch.nn.Module, ad_mlir.LLM]:
    """Two layers in two slots; q/k convolutions of kernels 3 and 2 (a window of 2 + 1 = 3 tokens)
    and projection biases, so that the delayed value a sequence starts from (`v_proj_delayed` of
    zeros) is its bias, not zero. HF initializes the keys' scale (`qk_norm.temp`) to 0, which
    zeroes every key, so that no score depends on q or k and the q/k window would go unseen: it
    gets random scales around 1 here."""
    config = generation_config("zaya", settings={"attention_bias": True, "cca_time0": 3})
    torch.manual_seed(0)
    model = greedy_only(model_from_config(config).eval())
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.qk_norm.temp.normal_(1.0, 0.5)
    return model, ad_mlir.LLM(model, max_batch=2, max_seq_len=48)


def test_zaya_caches_two_token_windows_a_layer_beside_the_kv_cache(zaya) -> None:  # noqa: ANN001
    """Per layer: the 3 q/k inputs before a step [slots, channels, 3] (q 4 x 32 + k 2 x 32 = 192
    channels) and the one delayed value before it [slots, 1, 32]: per-slot states, which the byte
    accounting counts apart from the per-token K/V."""
    _, llm = zaya
    windows = {name: tuple(c.shape) for name, c in llm.caches.items() if name.startswith("token_window")}
    assert windows == {"token_window_0": (2, 192, 3), "token_window_1": (2, 1, 32),
                       "token_window_2": (2, 192, 3), "token_window_3": (2, 1, 32)}
    assert llm.slot_states == set(windows)
    assert llm.state_bytes == 2 * 2 * (192 * 3 + 32) * 4
    assert llm.token_bytes == {"model.layers.0.self_attn": 512, "model.layers.1.self_attn": 512}
    ops = list(llm.program.function.body.walk())
    assert sum(isinstance(op, ad.CachedTokenWindowOp) for op in ops) == 4
    assert not any(isinstance(op, ad.TorchOp) and op.target.data == "aten.pad.default" for op in ops)


def test_zaya_generates_hf_greedy_tokens(zaya) -> None:  # noqa: ANN001
    """Three prompts in two slots: a reused slot starts its windows from the model's start rows."""
    model, llm = zaya
    with reference_kernels():
        outputs = llm.generate(PROMPTS, max_new_tokens=8)
    assert [out.token_ids for out in outputs] == [_hf_tokens(model, prompt, 8) for prompt in PROMPTS]


def test_zaya_step_logits_match_hf_prefill_and_decode(zaya) -> None:  # noqa: ANN001
    _assert_step_logits_match(*zaya)  # measured: 1.0e-5 off on logits up to 18.5 (a decode step)


def test_a_zaya_prompt_prefilled_in_three_chunks_equals_one_prefill(zaya) -> None:  # noqa: ANN001
    """The later chunks (start > 0) continue from the windows the earlier left; the middle one of
    a single token, fewer than the q/k window's 3, keeps the two rows before it in the window."""
    model, llm = zaya
    prompt = torch.tensor([PROMPTS[2]])
    with torch.no_grad(), reference_kernels():
        expected = model(prompt).logits
        for first, last in ((0, 4), (4, 5), (5, prompt.shape[1])):
            logits = llm.step(prompt[:, first:last], torch.arange(first, last)[None], [1], [first])
            _assert_logits_close(logits, expected[:, first:last])


@pytest.mark.parametrize("window", ["token_window_0", "token_window_1"])
def test_a_zaya_decode_step_without_a_window_is_wrong(zaya, window: str) -> None:  # noqa: ANN001
    """What the tests above would catch: the same decode step with the first layer's q/k window
    or its delayed-value window zeroed moves the logits beyond their tolerance."""
    model, llm = zaya
    prompt = PROMPTS[0]
    with torch.no_grad(), reference_kernels():
        first = int(llm.step(torch.tensor([prompt]), torch.arange(len(prompt))[None], [0], [0])[0, -1].argmax())
        llm.caches[window][0].zero_()
        stale = llm.step(torch.tensor([[first]]), torch.tensor([[len(prompt)]]), [0], [len(prompt)])[0, -1]
        expected = model(torch.tensor([[*prompt, first]])).logits[0, -1]
    assert (stale - expected).abs().max() > 1.0  # measured: 22 (q/k) and 3.1 (value), against 1e-5 with it


# -- scans that export as opaque ops (frontends/export_patches.py; their generation through cached
# states: test_recurrent_mixers.py) -----------------------------------------------------------


def _small(family: str, **overrides: object) -> torch.nn.Module:
    config = small_config(family)
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    return model_from_config(config)


@pytest.mark.parametrize(("family", "overrides", "scan", "lengths"), [
    # a Mamba2 layer and an attention layer; chunks of 8, so 11 and 40 span several
    ("nemotron_h", {"chunk_size": 8}, "mamba2_chunk_scan", (5, 11, 40)),
    # gated delta rule layers (HF's chunks of 64: 70 spans two)
    ("qwen3_next", {}, "chunk_gated_delta_rule", (11, 40, 70)),
    # Mamba1: HF's loop over time steps
    ("mamba", {}, "selective_scan", (5, 11, 40)),
])
def test_chunked_scans_export_with_a_dynamic_length_and_equal_eager(family: str, overrides: dict, scan: str,
                                                                     lengths: tuple[int, ...]) -> None:
    """HF's chunk (and time-step) loops would fix the length (torch.export: "Constraints violated (seq)"): routed
    through an opaque op, one graph serves every length and equals eager (fp32, reference path:
    the scan is HF's own function, the rest our kernels' torch meaning)."""
    model = _small(family, **overrides)
    ids = torch.randint(1, 1000, (1, max(lengths)), generator=torch.Generator().manual_seed(1))
    seq = torch.export.Dim("seq", min=2, max=256)
    gm, program = compile_program(model, {"input_ids": ids, "use_cache": False},
                                          dynamic_shapes={"input_ids": {1: seq}, "use_cache": None})
    targets = [op.target.data for op in program.function.body.walk() if isinstance(op, ad.TorchOp)]
    assert f"ad_mlir.{scan}.default" in targets
    for n in lengths:
        with torch.no_grad():
            torch.testing.assert_close(gm(ids[:, :n], False)[0], model(input_ids=ids[:, :n]).logits)
