"""`ad_mlir.LLM(path)` on a compressed-tensors FP8-dynamic checkpoint (`zoo/ct_fp8.py`'s writer: a
tiny Llama or Qwen2 in bf16, per-channel weight scales): the compiled program keeps the fp8
weights and runs every projection as `ad.linear_fp8` on activations quantized per token (that
quantization fused into the norms and SiLU-mul before), its kernels in the Triton interpreter
(`kernel_guard`, the interpreter's e4m3 conversion made torch's: `nearest_e4m3_rounding`) or
its references. Teacher-forced on the reference model's greedy tokens (the prefill's logits,
then decode steps of two sequences in two slots), each step's logits are compared with eager
models on the same tokens:

- the loaded model itself, eager: its `Fp8ChannelLinear`s compute the format's arithmetic in
  torch, the same activation quantization, so the compiled graph differs only by the order of
  fp32 sums (fused norms, attention over the cache): relative error (L2 over the vocabulary)
  <= 1e-5, as for fine-grained FP8 (a last-bit difference that moved an activation across an
  e4m3 rounding boundary would show as ~1e-3);
- the model as transformers dequantizes the checkpoint on a CPU (with the compressed-tensors
  library, not a dependency here: each weight `(fp8.to(bf16) * scale).float()`, checked against
  transformers 5.24 and compressed-tensors 0.20.1 outside this repository), activations not
  quantized. Each quantized linear's activation rounding errs by at most 2^-4 relative, rms
  2^-4 / sqrt(3); two quantized linears in sequence on each residual branch add that twice:
  2 * 2^-4 / sqrt(3) = 0.072; the bf16 rounding of the dequantized weights (2^-9) is far below.
  That needs the default init (a model that does not amplify a perturbation); the wide init
  (initializer_range 0.5, so that greedy tokens vary) is held to the first reference and its
  greedy tokens must be the reference model's.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from eager_reference import assert_logits_follow, eager_greedy
from kernel_guard import kernel_calls, kernels_ran
from test_generate_fp8 import _trajectory

import ad_mlir
from ad_mlir.codegen.interpreter import nearest_e4m3_rounding
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.zoo.ct_fp8 import Fp8ChannelLinear, write_fp8_dynamic_checkpoint
from ad_mlir.zoo.tiny import TinyConfig, build_model

PROMPTS = [[5, 9, 13, 3, 7, 40, 41], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]
STEPS = 6
SAME_QUANTIZATION_ERROR = 1e-5
ACTIVATION_ROUNDING_ERROR = 2 * 2.0**-4 / 3**0.5


def _checkpoint(directory: Path, family: str, initializer_range: float) -> Path:
    overrides = (("initializer_range", initializer_range),)
    model = build_model(TinyConfig(family=family, layers=2, dtype="bfloat16", hf_overrides=overrides))
    return write_fp8_dynamic_checkpoint(model, directory, "channel")


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> ad_mlir.LLM:
    checkpoint = _checkpoint(tmp_path_factory.mktemp("ct") / "llama-ct-wide", "llama", 0.5)
    return ad_mlir.LLM(str(checkpoint), max_batch=len(PROMPTS), max_seq_len=32)


def _dequantized(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with each `Fp8ChannelLinear` a plain linear on `(fp8.to(bf16) * scale).float()`,
    the weight transformers' compressed-tensors quantizer gives on a CPU (the file's scales are
    bf16; the loaded ones their exact fp32 widening)."""
    plain = copy.deepcopy(model)
    for name, module in list(plain.named_modules()):
        if isinstance(module, Fp8ChannelLinear):
            linear = torch.nn.Linear(module.in_features, module.out_features, bias=module.bias is not None)
            scale = module.weight_scale.to(torch.bfloat16)
            linear.weight = torch.nn.Parameter((module.weight.to(torch.bfloat16) * scale).float())
            if module.bias is not None:
                linear.bias = module.bias
            plain.set_submodule(name, linear)
    return plain


def test_the_program_keeps_fp8_weights_and_runs_fp8_kernels(llm: ad_mlir.LLM) -> None:
    """Per layer, 4 GEMMs (Q/K/V and gate/up fused by `fuse-gemms`, o, down), each an FP8
    kernel (`linear_fp8_kernel.py`): the program holds every weight they multiply in fp8 (the
    fused ones concatenated at compile time) with its [N, 1] fp32 scales; the only wide float
    weights left are the embeddings and the LM head; per layer 4 activation quantizations, 3 of
    them in fused kernels (input norm, post-attention norm, SiLU-mul)."""
    state = llm.graph.state_dict()
    fp8 = sorted(tuple(t.shape) for t in state.values() if t.dtype == torch.float8_e4m3fn)
    assert fp8 == sorted([(128, 64), (64, 64), (256, 64), (64, 128)] * 2)
    scales = sorted(tuple(t.shape) for t in state.values() if t.dim() == 2 and t.shape[1] == 1)
    assert scales == sorted((n, 1) for n, _ in fp8)
    wide = sorted(name for name, t in state.items() if t.dim() == 2 and t.dtype == torch.float32 and t.shape[1] == 64
                  and t.shape[0] >= 64)
    assert wide == ["lm_head.weight", "model.embed_tokens.weight"]
    quantizing = [name for name in kernel_calls(llm.graph) if "quantize_fp8_dynamic" in name]
    assert len(quantizing) == 4 * 2
    assert sum(name.startswith(("rms_norm_quantize", "add_rms_norm_quantize", "silu_and_mul_quantize"))
               for name in quantizing) == 3 * 2
    assert sum(name.startswith("linear_fp8") for name in kernel_calls(llm.graph)) == 4 * 2
    assert not any(str(n.target) == "ad_mlir.linear_fp8.default" for n in llm.graph.graph.nodes), \
        "no projection runs the op's reference"


def _assert_same_quantization(llm: ad_mlir.LLM, forced: list[list[int]], logits: list[torch.Tensor]) -> None:
    assert_logits_follow(llm.model, PROMPTS, forced, logits, SAME_QUANTIZATION_ERROR, "the eager quantized model")


@pytest.mark.parametrize("path", ["kernels", "reference"])
def test_ct_fp8_checkpoint_generates_the_reference_tokens(llm: ad_mlir.LLM, path: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    reference = [eager_greedy(llm.model, prompt, STEPS) for prompt in PROMPTS]
    assert all(len(set(tokens)) > 3 for tokens in reference), f"greedy tokens barely vary: {reference}"
    with (kernels_ran(monkeypatch) if path == "kernels" else reference_kernels()), nearest_e4m3_rounding():
        logits = _trajectory(llm, PROMPTS, reference)
        outputs = llm.generate(PROMPTS, max_new_tokens=STEPS, ignore_eos=True)
    _assert_same_quantization(llm, reference, logits)
    assert [out.token_ids for out in outputs] == reference


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_ct_fp8_checkpoint_is_within_activation_rounding_of_the_dequantized_model(tmp_path: Path,
                                                                                 family: str) -> None:
    """The default init (see the module docstring); Qwen2 has biases on q/k/v (the op's bias)."""
    checkpoint = _checkpoint(tmp_path / f"{family}-ct", family, 0.02)
    llm = ad_mlir.LLM(str(checkpoint), max_batch=len(PROMPTS), max_seq_len=32)
    dequantized = _dequantized(llm.model)
    forced = [eager_greedy(llm.model, prompt, STEPS) for prompt in PROMPTS]
    with reference_kernels():
        logits = _trajectory(llm, PROMPTS, forced)
        outputs = llm.generate(PROMPTS, max_new_tokens=STEPS, ignore_eos=True)
    _assert_same_quantization(llm, forced, logits)
    errors = assert_logits_follow(dequantized, PROMPTS, forced, logits, ACTIVATION_ROUNDING_ERROR,
                                  "the dequantized model")
    assert min(errors) > 0, "the activations are quantized"
    assert [out.token_ids for out in outputs] == forced
