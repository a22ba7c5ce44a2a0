"""The compiled graphs on a CUDA GPU, every kernel launched for real (the reference fallback
refuses): the five families against eager on the same GPU, and generation against HF's own
`generate`. Skipped without CUDA: CI has no GPU, so these run only where a GPU is lent (the
README says when they last ran and where their results are).

Tolerances are the CPU tests' (`tests/models/test_compile.py` says why): fp32 at torch.testing's
defaults (the kernels only reorder sums, and cuBLAS keeps fp32 without TF32 by default), bf16
within `low_precision_bound` of the fp32 model."""

from __future__ import annotations

import pytest
import torch
from engine_steps import checked_step
from kernel_guard import graph_kernels
from transformers import AutoModelForCausalLM, Lfm2Config

import ad_mlir
from ad_mlir.frontends.export import export_with_ids
from ad_mlir.llm.engine import SamplingParams, make_engine
from ad_mlir.runtime import kernels
from ad_mlir.tools.report import low_precision_bound
from ad_mlir.zoo.tiny import FAMILIES, TinyConfig, build_model, example_input_ids

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on CI)")

PROMPTS = [[5, 9, 13, 3, 7, 40, 41], [3, 4], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]
WIDE = (("initializer_range", 0.5),)
"""Generation models get wide random weights so that HF's greedy tokens vary (as in
tests/models/test_generate.py), and Mistral a window of 6 that the prompts reach."""


@pytest.fixture
def no_reference_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise AssertionError("a region ran its reference semantics, not its kernel")

    monkeypatch.setattr(kernels, "run_reference", refuse)


def _cuda_model(family: str, dtype: str, layers: int = 1, overrides: tuple = ()) -> torch.nn.Module:
    return build_model(TinyConfig(family=family, layers=layers, dtype=dtype, hf_overrides=overrides)).cuda()


def _lfm2() -> torch.nn.Module:
    """A tiny LFM2 (short convolutions beside attention), fp32, wide init, on the GPU."""
    torch.manual_seed(0)
    config = Lfm2Config(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, layer_types=["conv", "full_attention", "conv"],
                        pad_token_id=0, max_position_embeddings=256, initializer_range=0.5)
    return AutoModelForCausalLM.from_config(config).eval().cuda()


@pytest.mark.usefixtures("no_reference_fallback")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_compiled_kernels_match_eager_on_cuda(family: str, dtype: str) -> None:
    cfg = TinyConfig(family=family, layers=1, dtype=dtype)
    model, truth = _cuda_model(family, dtype), _cuda_model(family, "float32")
    gm = ad_mlir.compile(export_with_ids(model, example_input_ids(cfg, 8).cuda()))
    graph_kernels(gm, at_least=4)
    for seq in (7, 33, 200):  # below, across and above one attention tile
        ids = example_input_ids(cfg, seq, seed=seq).cuda()
        with torch.no_grad():
            expected, got, exact = model(input_ids=ids).logits, gm(ids)[0], truth(input_ids=ids).logits
        assert got.device == expected.device and got.dtype == expected.dtype
        if dtype == "float32":
            torch.testing.assert_close(got, expected)
        else:
            error, bound = (got.float() - exact).abs().max().item(), low_precision_bound(expected, exact)
            assert error <= bound, f"seq {seq}: bf16 error {error:.3g} against the fp32 model, bound {bound:.3g}"


@pytest.mark.usefixtures("no_reference_fallback")
@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "gemma"])
def test_generation_on_cuda_matches_hf(family: str) -> None:
    """A ragged batch of three prompts in two slots, greedy, fp32: the same tokens as HF's
    `generate` of each prompt alone on the same GPU (checked to vary), and each step's logits
    (the prefill's last, then every decode step's, teacher-forced on HF's tokens) those of HF's
    full-prefix forward: torch.testing's fp32 rtol, and an atol of 4e-5 x the largest logit
    (test_generate.py's `_assert_logits_close` scales 1e-5 for 4 decode steps; over these 16 steps
    the same check on CPU, kernels as their reference, measured 1.75e-4 on logits up to ~15). A
    wrong cache entry moves logits by order 1."""
    window = (("sliding_window", 6),) if family == "mistral" else ()
    model = _cuda_model(family, "float32", layers=2, overrides=WIDE + window)
    llm = ad_mlir.LLM(model, max_batch=2, max_seq_len=64)
    assert all(c.is_cuda for c in llm.caches.values()) and llm.decode_graphs is not None
    graph_kernels(llm.graph)
    outputs = llm.generate(PROMPTS, max_new_tokens=16)
    for slot, (prompt, out) in enumerate(zip(PROMPTS, outputs, strict=True)):
        with torch.no_grad():
            hf = model.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=16, do_sample=False)
        tokens = hf[0, len(prompt):].tolist()
        assert out.token_ids == tokens and len(set(tokens)) >= len(tokens) / 4, tokens
        sequence = prompt + tokens
        steps = [llm.step(torch.tensor([prompt]), torch.arange(len(prompt))[None], [slot % 2], [0])[0, -1]]
        for i in range(len(prompt), len(sequence) - 1):
            steps.append(llm.step(torch.tensor([[sequence[i]]]), torch.tensor([[i]]), [slot % 2], [i])[0, -1])
        with torch.no_grad():
            expected = model(torch.tensor([sequence[:-1]], device="cuda")).logits[0, len(prompt) - 1:]
        torch.testing.assert_close(torch.stack(steps), expected, rtol=1.3e-6,
                                   atol=4e-5 * max(1.0, expected.abs().max().item()))


@pytest.mark.usefixtures("no_reference_fallback")
def test_paged_generation_with_cuda_graphs_matches_hf() -> None:
    """The paged form on CUDA, its decode-only steps replayed from CUDA graphs (a scratch page
    for the padding rows): three prompts, greedy, fp32, HF's tokens (checked to vary)."""
    model = _cuda_model("llama", "float32", layers=2, overrides=WIDE)
    llm = ad_mlir.LLM(model, max_batch=4, max_seq_len=64, page_size=16)
    assert llm.decode_graphs is not None and llm.scratch_page == llm.num_pages
    outputs = llm.generate(PROMPTS, max_new_tokens=16)
    for prompt, out in zip(PROMPTS, outputs, strict=True):
        with torch.no_grad():
            hf = model.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=16, do_sample=False)
        tokens = hf[0, len(prompt):].tolist()
        assert out.token_ids == tokens and len(set(tokens)) >= len(tokens) / 4, tokens


@pytest.mark.usefixtures("no_reference_fallback")
def test_paged_hybrid_generation_with_cuda_graphs_matches_hf() -> None:
    """A hybrid in the paged form on CUDA (LFM2: short convolutions beside attention, tiny, fp32),
    its decode-only steps replayed from CUDA graphs (the convolution's varlen kernel reading
    `query_starts` on the device; the padding rows in the scratch page and the scratch state
    slot): three prompts, greedy, HF's tokens (checked to vary), and the graphs replayed."""
    model = _lfm2()
    llm = ad_mlir.LLM(model, max_batch=4, max_seq_len=64, page_size=16)
    assert llm.decode_graphs is not None and llm.num_state_slots == 4 and llm.scratch_state_slot == 4
    replays = []
    run = llm.decode_graphs.run
    llm.decode_graphs.run = lambda *args: replays.append(1) or run(*args)
    outputs = llm.generate(PROMPTS, max_new_tokens=16)
    assert replays, "no decode step was replayed from a CUDA graph"
    for prompt, out in zip(PROMPTS, outputs, strict=True):
        with torch.no_grad():
            hf = model.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=16, do_sample=False)
        tokens = hf[0, len(prompt):].tolist()
        assert out.token_ids == tokens and len(set(tokens)) >= len(tokens) / 4, tokens


@pytest.mark.usefixtures("no_reference_fallback")
@pytest.mark.parametrize("family", ["llama", "lfm2"])
def test_paged_steps_replayed_piecewise_give_the_eager_tokens(family: str) -> None:
    """The paged form on CUDA through the paged engine with a step budget of 8 tokens, so the
    prompts go in chunks beside the others' decodes: its decode-only steps replayed whole, the
    others piecewise (`CudaGraphPiecewise`: the pieces between the cached mixers replayed per
    bucket of tokens, the mixers eager, a hybrid's convolutions among them); three prompts,
    greedy, fp32: the tokens of the same model with `cuda_graphs=False` and HF's (checked to
    vary), and steps that were not decode-only replayed."""
    model = _lfm2() if family == "lfm2" else _cuda_model("llama", "float32", layers=2, overrides=WIDE)
    replayed = ad_mlir.LLM(model, max_batch=4, max_seq_len=64, page_size=16)
    eager = ad_mlir.LLM(model, max_batch=4, max_seq_len=64, page_size=16, cuda_graphs=False)
    assert replayed.step_graphs is not None and eager.step_graphs is None and eager.decode_graphs is None
    steps: list[int] = []
    run = replayed.step_graphs.run
    replayed.step_graphs.run = lambda flat, *states: steps.append(flat[0].shape[1]) or run(flat, *states)

    def generate(llm: ad_mlir.LLM) -> list[list[int]]:
        engine = make_engine(llm, max_step_tokens=8)
        requests = [engine.add(prompt, SamplingParams(max_tokens=12)) for prompt in PROMPTS]
        while engine.has_work:
            checked_step(engine)
        return [r.output.token_ids for r in requests]

    tokens = generate(replayed)
    assert steps and max(steps) > 1, steps
    assert tokens == generate(eager)
    for prompt, out in zip(PROMPTS, tokens, strict=True):
        with torch.no_grad():
            hf = model.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=12, do_sample=False)
        assert out == hf[0, len(prompt):].tolist() and len(set(out)) >= len(out) / 4, out
