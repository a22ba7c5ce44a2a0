"""`ad_mlir.LLM(path)` on an MXFP4 checkpoint as gpt-oss ships it (`zoo/mxfp4.py`'s writer: a
2-layer gpt-oss built small, 4 experts, top 2, written in bf16 with its experts as MXFP4 blocks and
scales): the compiled program keeps the experts' uint8 bytes and scales and runs each MoE block as
one `ad.moe_mxfp4`, its kernel in the Triton interpreter or its reference. Teacher-forced on the
eager quantized model's greedy tokens (the prefill's logits, then decode steps of two sequences
in two slots), each step's logits are compared with eager models on the same tokens:

- the loaded model itself, eager: its `Mxfp4Experts` dequantize the routed experts and compute
  gpt-oss's expert math in torch, so the compiled graph differs only by the order of fp32 sums
  (fused norms, attention over the cache, the grouped GEMMs). The wide init (initializer_range
  0.5, so that greedy tokens vary and a wrong cache shows) amplifies those: measured 2.2e-5
  relative error (L2 over the vocabulary) on the reference path and 2.3e-5 on the kernels, the
  order of this family's own fp32 noise (test_attention_forms.py measured HF's fp32 gpt-oss 8e-5 x
  the largest logit from a float64 forward); bound 5e-5, while a wrong expert, scale, nibble or
  bias moves logits by order 1e-1;
- transformers' own load of the checkpoint, which dequantizes it on a CPU (`convert_moe_packed_tensors`
  into plain `GptOssExperts`): MXFP4 is weight-only and its dequantization exact in fp32, so
  that model computes the same function on the same weights; only the order of fp32 sums
  differs again (its grouped experts form, its eager attention), amplified by the wide init:
  3e-5 x the largest logit, test_attention_forms.py's bound for the unquantized gpt-oss against
  HF (measured 2.1e-5 and 4.0e-6 for the two prompts; the eager quantized model is 1.6e-6 from
  it).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from eager_reference import eager_greedy, eager_logits
from kernel_guard import kernel_calls, kernels_ran
from test_generate_fp8 import _trajectory

import ad_mlir
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.tools.report import fp8_logits_error
from ad_mlir.zoo.mxfp4 import Mxfp4Experts, write_mxfp4_checkpoint
from ad_mlir.zoo.small import model_from_config, small_config

PROMPTS = [[5, 9, 13, 3, 7, 40, 41], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]
STEPS = 5
SAME_MODEL_ERROR = 5e-5
HF_FP32_NOISE = 3e-5


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = small_config("gpt_oss", 2)
    config.initializer_range = 0.5
    model = model_from_config(config)
    with torch.no_grad():  # HF zero-initializes the experts' biases: a misplaced one would go unseen
        for layer in model.model.layers:
            layer.mlp.experts.gate_up_proj_bias.normal_(std=0.5)
            layer.mlp.experts.down_proj_bias.normal_(std=0.5)
    return write_mxfp4_checkpoint(model.to(torch.bfloat16), tmp_path_factory.mktemp("mxfp4") / "gpt-oss-mxfp4")


@pytest.fixture(scope="module")
def llm(checkpoint: Path) -> ad_mlir.LLM:
    return ad_mlir.LLM(str(checkpoint), max_batch=len(PROMPTS), max_seq_len=32)


def test_the_program_keeps_the_mxfp4_experts(llm: ad_mlir.LLM) -> None:
    """Each layer's experts are the checkpoint's uint8 blocks and scales, multiplied by one MXFP4
    MoE kernel a layer; no expert weight is wide and no grouped GEMM is left."""
    assert all(isinstance(layer.mlp.experts, Mxfp4Experts) for layer in llm.model.model.layers)
    state = llm.graph.state_dict()
    packed = sorted(tuple(t.shape) for t in state.values() if t.dtype == torch.uint8)
    assert packed == sorted([(4, 512, 4, 16), (4, 512, 4), (4, 128, 8, 16), (4, 128, 8)] * 2)
    assert not any(t.dim() == 3 and t.is_floating_point() for t in state.values()), "a wide expert weight"
    assert sum(name.startswith("moe_mxfp4") for name in kernel_calls(llm.graph)) == 2
    assert not any("grouped_mm" in str(n.target) for n in llm.graph.graph.nodes)


def _assert_steps_are_the_eager_models(llm: ad_mlir.LLM, prompts: list[list[int]], steps: int) -> None:
    reference = [eager_greedy(llm.model, prompt, steps) for prompt in prompts]
    assert all(len(set(prompt + tokens)) == len(prompt + tokens) for prompt, tokens in zip(prompts, reference,
                                                                                               strict=True)), \
        f"greedy tokens barely vary: {reference}"
    logits = _trajectory(llm, prompts, reference)
    for i, (prompt, tokens, got) in enumerate(zip(prompts, reference, logits, strict=True)):
        error = fp8_logits_error(eager_logits(llm.model, prompt + tokens)[len(prompt) - 1:], got)
        assert error <= SAME_MODEL_ERROR, f"prompt {i}: {error:.3g} from the eager quantized model"
        assert [int(t) for t in got[:-1].argmax(-1)] == tokens


def test_mxfp4_checkpoint_generates_the_eager_quantized_tokens(llm: ad_mlir.LLM) -> None:
    """The reference path: two prompts in two slots, prefill and 5 decode steps; generating, every
    token is the eager model's."""
    with reference_kernels():
        _assert_steps_are_the_eager_models(llm, PROMPTS, STEPS)
        outputs = llm.generate(PROMPTS, max_new_tokens=STEPS, ignore_eos=True)
    assert [out.token_ids for out in outputs] == [eager_greedy(llm.model, prompt, STEPS) for prompt in PROMPTS]


def test_mxfp4_kernels_in_the_interpreter(llm: ad_mlir.LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every op on its kernel (the interpreter's cost is per program: one short prompt, a prefill
    and a decode step)."""
    with kernels_ran(monkeypatch) as launches:
        _assert_steps_are_the_eager_models(llm, [[3, 4, 5]], 1)
    assert sum(n for name, n in launches.items() if name.startswith("moe_mxfp4")) == 2 * 2


def test_mxfp4_checkpoint_computes_the_dequantized_model(llm: ad_mlir.LLM, checkpoint: Path) -> None:
    """transformers' dequantizing load (see the module docstring), per step on the reference path
    (the kernels equal it: the test above and test_moe_mxfp4_kernel.py)."""
    dequantized = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    assert dequantized.model.layers[0].mlp.experts.gate_up_proj.dtype == torch.float32
    forced = [eager_greedy(dequantized, prompt, STEPS) for prompt in PROMPTS]
    with reference_kernels():
        logits = _trajectory(llm, PROMPTS, forced)
    for i, (prompt, tokens, got) in enumerate(zip(PROMPTS, forced, logits, strict=True)):
        plain = eager_logits(dequantized, prompt + tokens)[len(prompt) - 1:]
        error = (got - plain).abs().max() / plain.abs().max()
        assert error <= HF_FP32_NOISE, f"prompt {i}: {error:.3g} x the largest logit from the dequantized model"
        assert [int(t) for t in got[:-1].argmax(-1)] == tokens
