"""`ad_mlir.LLM(path)` on a ModelOpt NVFP4 checkpoint (`zoo/modelopt.py`'s writer: a tiny Llama,
and a tiny Qwen2 with biases on q/k/v, 2 layers, hidden 64, in bf16, wide init so that greedy
tokens vary): the compiled program keeps the packed codes and runs every projection as
`ad.linear_nvfp4`, its kernels in the Triton interpreter (`kernels_ran`) or its reference.
Teacher-forced on the eager model's greedy tokens (each prompt's prefill, then decode steps of two
sequences in two slots), each step's logits are compared with eager models on the same tokens:

- the loaded model itself, eager: its `Nvfp4Linear`s compute `zoo/nvfp4.py`'s weight-only linear,
  so the compiled graph differs only by the order of fp32 sums (fused norms, attention over the
  cache, the kernel's K tiles, Q/K/V and gate/up merged): relative error (L2 over the vocabulary)
  <= 1e-5 (the tolerance of every fp32 generation test here);
- the dequantized model: each `Nvfp4Linear` replaced by a plain linear on ModelOpt's dequantized
  weight (`nvfp4.dequantize`, bit-equal to ModelOpt's `NVFP4QTensor.dequantize`; transformers
  has no loader for these checkpoints). The activations are not quantized on either side, so the
  two differ only in where the global scale is multiplied: each weight element by at most two
  fp32 roundings (2^-23 relative), each linear's output by that times the sum of |x||w|, the same
  order as the fp32 reordering above: the same bound, 1e-5.
"""

from __future__ import annotations

import copy

import pytest
import torch
from eager_reference import eager_greedy, eager_logits
from kernel_guard import kernel_calls, kernels_ran
from test_generate_fp8 import _trajectory

import ad_mlir
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.tools.report import fp8_logits_error
from ad_mlir.zoo import nvfp4
from ad_mlir.zoo.modelopt import Nvfp4Linear, write_nvfp4_checkpoint
from ad_mlir.zoo.tiny import TinyConfig, build_model

PROMPTS = [[5, 9, 13, 3, 7, 40, 41], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]
STEPS = 6
FP32_ERROR = 1e-5


PATHS = {"llama": "kernels", "qwen2": "reference"}
"""Each family on one path (the interpreter's kernels cost ~20 s a family); Qwen2's biases run
through the kernel in test_linear_nvfp4_kernel.py."""


@pytest.fixture(scope="module", params=sorted(PATHS))
def llm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ad_mlir.LLM:
    model = build_model(TinyConfig(family=request.param, layers=2, dtype="bfloat16",
                                   hf_overrides=(("initializer_range", 0.5),)))
    checkpoint = write_nvfp4_checkpoint(model, tmp_path_factory.mktemp("nvfp4") / f"{request.param}-nvfp4")
    return ad_mlir.LLM(str(checkpoint), max_batch=len(PROMPTS), max_seq_len=32)


def _dequantized(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with each `Nvfp4Linear` a plain linear on its dequantized weight (fp32)."""
    plain = copy.deepcopy(model)
    for name, module in list(plain.named_modules()):
        if isinstance(module, Nvfp4Linear):
            linear = torch.nn.Linear(module.in_features, module.out_features, bias=module.bias is not None)
            linear.weight.data = nvfp4.dequantize(module.weight, module.weight_scale, module.weight_scale_2)
            if module.bias is not None:
                linear.bias.data = module.bias.data.float()
            plain.set_submodule(name, linear)
    return plain


def test_the_program_keeps_the_packed_codes_and_runs_nvfp4_kernels(llm: ad_mlir.LLM) -> None:
    """Per layer, 4 GEMMs (Q/K/V and gate/up merged by `fuse-gemms`, o, down), each an NVFP4
    kernel: the program holds every weight they multiply as uint8 codes (the merged ones
    concatenated at compile time); the only wide float weights left are the embeddings and the
    LM head, unquantized in the checkpoint."""
    state = llm.graph.state_dict()
    codes = sorted(tuple(t.shape) for t in state.values() if t.dtype == torch.uint8)
    assert codes == sorted([(128, 32), (64, 32), (256, 32), (64, 64)] * 2)
    wide = sorted(name for name, t in state.items() if t.dim() == 2 and t.dtype == torch.float32 and t.shape[1] == 64
                  and t.shape[0] >= 64)
    assert wide == ["lm_head.weight", "model.embed_tokens.weight"]
    assert sum(name.startswith("linear_nvfp4") for name in kernel_calls(llm.graph)) == 4 * 2
    assert not any(str(n.target) == "ad_mlir.linear_nvfp4.default" for n in llm.graph.graph.nodes), \
        "no projection runs the op's reference"


def test_nvfp4_checkpoint_generates_the_eager_model_s_tokens(llm: ad_mlir.LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    path = PATHS[llm.model.config.model_type]
    forced = [eager_greedy(llm.model, prompt, STEPS) for prompt in PROMPTS]
    assert all(len(set(tokens)) > 3 for tokens in forced), f"greedy tokens barely vary: {forced}"
    with kernels_ran(monkeypatch) if path == "kernels" else reference_kernels():
        logits = _trajectory(llm, PROMPTS, forced)
        outputs = llm.generate(PROMPTS, max_new_tokens=STEPS, ignore_eos=True)
    dequantized = _dequantized(llm.model)
    for i, (prompt, tokens, got) in enumerate(zip(PROMPTS, forced, logits, strict=True)):
        ids = prompt + tokens
        same = fp8_logits_error(eager_logits(llm.model, ids)[len(prompt) - 1:], got)
        assert same <= FP32_ERROR, f"prompt {i}: {same:.3g} from the eager quantized model"
        plain = fp8_logits_error(eager_logits(dequantized, ids)[len(prompt) - 1:], got)
        assert plain <= FP32_ERROR, f"prompt {i}: {plain:.3g} from the dequantized model"
        print(f"{llm.model.config.model_type} {path} prompt {i}: {same:.3g} from the eager quantized model, "
              f"{plain:.3g} from the dequantized model")
    assert [out.token_ids for out in outputs] == forced
