"""Generation composed with FP8: `ad_mlir.LLM(model, pipeline="quantize-linear-fp8,default")`, fp32
and bf16 models, its kernels in the Triton interpreter (`kernel_guard`), against the UNQUANTIZED
eager model: each step's logits (the prefill's last, then 8 decode steps of two sequences in two
slots) within the relative error e4m3 allows (`report.E4M3_LOGITS_ERROR`, derived there), and
every generated token equal to HF's greedy tokens of the unquantized model (measured: all 8 of
both prompts, fp32 and bf16, on the kernels and on their reference)."""

from __future__ import annotations

import pytest
import torch
from kernel_guard import kernel_calls, kernels_ran

import ad_mlir
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.tools.report import E4M3_LOGITS_ERROR, fp8_logits_error
from ad_mlir.zoo.tiny import TinyConfig, build_model

PIPELINE = "quantize-linear-fp8,default"
PROMPTS = [[5, 9, 13, 3, 7, 40, 41], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]
STEPS = 8


def _hf_tokens(model: torch.nn.Module, prompt: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=STEPS, do_sample=False, use_cache=True)
    return out[0, len(prompt):].tolist()


def _trajectory(llm: ad_mlir.LLM, prompts: list[list[int]], forced: list[list[int]]) -> list[torch.Tensor]:
    """Prefill each prompt in its own slot, then one decode step of all together per token of
    `forced` (one list per prompt, all as long), fed those tokens. Returns, per prompt, the
    logits of every step [steps + 1, vocab]."""
    logits: list[list[torch.Tensor]] = []
    for slot, prompt in enumerate(prompts):
        logits.append([llm.step(torch.tensor([prompt]), torch.arange(len(prompt))[None], [slot], [0])[0, -1]])
    for step in range(len(forced[0])):
        starts = [len(p) + step for p in prompts]
        out = llm.step(torch.tensor([[f[step]] for f in forced]), torch.tensor(starts)[:, None], range(len(prompts)),
                       starts)
        for i in range(len(prompts)):
            logits[i].append(out[i, -1])
    return [torch.stack(steps) for steps in logits]


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def fp8_llm(request: pytest.FixtureRequest) -> tuple[torch.nn.Module, ad_mlir.LLM]:
    model = build_model(TinyConfig(family="llama", layers=2, dtype=request.param))
    return model, ad_mlir.LLM(model, max_batch=len(PROMPTS), max_seq_len=32, pipeline=PIPELINE)


def test_fp8_pipeline_quantizes_every_projection(fp8_llm) -> None:
    _, llm = fp8_llm
    assert sum(name.startswith("linear_fp8") for name in kernel_calls(llm.graph)) == 7 * 2  # q, k, v, o, gate, up, down
    assert sum(name.startswith("cached_attention") for name in kernel_calls(llm.graph)) == 2


@pytest.mark.parametrize("path", ["kernels", "reference"])
def test_fp8_generation_is_within_e4m3_of_the_unquantized_model(fp8_llm, path: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Teacher-forced on the unquantized model's greedy tokens, each step's logits are within
    E4M3_LOGITS_ERROR of the unquantized model's; generating, every token is HF's. The kernels
    run in the interpreter, whose fp8 stores are wrong for a few percent of values (DESIGN.md):
    the bound holds all the same (measured: the same 0.053 as the reference)."""
    model, llm = fp8_llm
    hf = [_hf_tokens(model, prompt) for prompt in PROMPTS]
    with kernels_ran(monkeypatch) if path == "kernels" else reference_kernels():
        logits = _trajectory(llm, PROMPTS, hf)
        outputs = llm.generate(PROMPTS, max_new_tokens=STEPS, ignore_eos=True)
    with torch.no_grad():
        for i, (prompt, tokens, got) in enumerate(zip(PROMPTS, hf, logits, strict=True)):
            eager = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:]
            error = fp8_logits_error(eager, got)
            assert error <= E4M3_LOGITS_ERROR, f"prompt {i}: relative error {error:.3g} > {E4M3_LOGITS_ERROR:.3g}"
    assert [out.token_ids for out in outputs] == hf
