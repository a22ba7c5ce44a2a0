"""The MXFP4 MoE kernel template (gpt-oss's routing, alignment by expert, the gate/up and down
grouped GEMMs decoding E2M1 and applying E8M0 scales in registers, the combine) against
`ad.moe_mxfp4`'s torch reference (`torch_ops.moe_mxfp4`: the routed experts dequantized, then
gpt-oss's expert math), in the Triton interpreter on CPU or on the GPU; and its PTX for sm_90 at
gpt-oss-20b's expert sizes, compiled without a GPU: no spills.

The kernel module is called directly (its `launch`), so nothing can fall back to the reference."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from template_modules import template_builder

from ad_mlir.codegen.interpreter import nearest_bf16_rounding
from ad_mlir.codegen.ptx import compile_all, record_launches, specialize_launch
from ad_mlir.codegen.templates.moe_mxfp4_kernel import (
    ALIGN,
    COMBINE,
    DOWN,
    GATE_UP,
    ROUTE,
    MoeMxfp4Spec,
    emit_moe_mxfp4_module,
)
from ad_mlir.semantics import torch_ops
from ad_mlir.zoo.mxfp4 import mx_dequantize, mx_quantize

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
H100_SHARED_MEMORY = 227 * 1024

# |kernel - reference| <= tol * max|reference|: an output is a sum of terms of the output's scale
# that cancel, so elements near 0 carry the absolute error of that scale. The decoded weights are
# exact in both (E2M1 times a power of two). fp32: only the order of the GEMMs' and the combine's
# sums differs (measured 4.5e-7). bf16, with the interpreter's f32 -> bf16 conversions rounding to
# nearest as compiled kernels' do (`nearest_bf16_rounding`): both round each GEMM, the bias adds,
# the SwiGLU's steps and the weighted products at the same points, so they differ only where an
# fp32 sum in another order crosses a bf16 rounding boundary: one ulp (2^-7 at the largest output)
# allowed (measured: equal, bit for bit).
TOLERANCE = {torch.float32: 2e-6, torch.bfloat16: 2.0**-7}


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Callable[[MoeMxfp4Spec], ModuleType]:
    return template_builder(tmp_path_factory.mktemp("moe_mxfp4_kernels"), "moe_mxfp4", emit_moe_mxfp4_module)


def _spec(hidden: int = 64, inter: int = 96, experts: int = 4, top_k: int = 2,
          dtype: torch.dtype = torch.float32) -> MoeMxfp4Spec:
    return MoeMxfp4Spec(hidden, inter, experts, top_k, dtype, alpha=1.702, limit=7.0)


class Case:
    """Random inputs of one call: experts quantized from normal weights (gpt-oss's scale: the
    gate/up outputs reach the SwiGLU's clamp at 7), biases, logits steered by `bias`."""

    def __init__(self, spec: MoeMxfp4Spec, tokens: int, bias: list[float] | None = None, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        h, inter, e = spec.hidden, spec.intermediate, spec.experts
        self.spec = spec
        self.x = torch.randn(tokens, h, generator=g).to(spec.dtype).to(DEVICE)
        logits = torch.randn(tokens, e, generator=g) + torch.tensor(bias or 0.0)
        self.logits = logits.to(spec.dtype).to(DEVICE)
        gate_up = mx_quantize(torch.randn(e, 2 * inter, h, generator=g) * 3 * h**-0.5)
        down = mx_quantize(torch.randn(e, h, inter, generator=g) * inter**-0.5)
        self.gate_up = [t.to(DEVICE) for t in gate_up]
        self.down = [t.to(DEVICE) for t in down]
        self.gate_up_bias = torch.randn(e, 2 * inter, generator=g).to(spec.dtype).to(DEVICE)
        self.down_bias = torch.randn(e, h, generator=g).to(spec.dtype).to(DEVICE)

    def tensors(self) -> list[torch.Tensor]:
        return [self.x, self.logits, *self.gate_up, self.gate_up_bias, *self.down, self.down_bias]

    def reference(self) -> torch.Tensor:
        s = self.spec
        return torch_ops.moe_mxfp4(*self.tensors(), s.top_k, s.alpha, s.limit)


def _run(module: ModuleType, case: Case) -> torch.Tensor:
    out, = module.launch(getattr(module, module.kernel_name), case.tensors(), [])
    return out


def _check(module: ModuleType, case: Case) -> None:
    with nearest_bf16_rounding():
        out = _run(module, case).float()
    reference = case.reference().float()
    torch.testing.assert_close(out, reference, atol=TOLERANCE[case.spec.dtype] * reference.abs().max().item(), rtol=0)


@pytest.mark.parametrize(("spec", "tokens", "bias"), [
    (_spec(), 21, None),
    (_spec(), 1, None),  # decode
    (_spec(hidden=96, inter=64, experts=5, top_k=3), 13, None),
    (_spec(top_k=1), 9, [8.0, 0.0, 0.0, 0.0]),  # every token to expert 0
    (_spec(), 11, [0.0, 0.0, 0.0, -20.0]),  # expert 3 receives no token
], ids=["21_tokens", "decode", "odd_sizes_top3", "one_expert_for_all", "an_idle_expert"])
def test_kernel_matches_the_reference(build, spec: MoeMxfp4Spec, tokens: int, bias: list | None) -> None:  # noqa: ANN001
    case = Case(spec, tokens, bias)
    if bias is not None:  # the steering did what the case says
        chosen = set(torch.topk(case.logits.float(), spec.top_k).indices.flatten().tolist())
        assert chosen == ({0} if spec.top_k == 1 else {0, 1, 2})
    _check(build(spec), case)


def test_the_clamp_is_reached() -> None:
    """The cases' gate/up outputs cross gpt-oss's limit (7), so a kernel without the clamp fails."""
    spec = _spec()
    case = Case(spec, 21)
    w = mx_dequantize(*case.gate_up, torch.float32)[0]
    assert (case.x.float() @ w.T + case.gate_up_bias[0].float()).abs().max() > spec.limit


@pytest.mark.parametrize("tokens", [1, 21])
def test_kernel_in_bf16(build, tokens: int) -> None:  # noqa: ANN001
    """bf16's K tiles are 64 wide: hidden 96 leaves a masked rest of one MX block."""
    spec = _spec(hidden=96, inter=64, experts=5, top_k=3, dtype=torch.bfloat16)
    _check(build(spec), Case(spec, tokens))


def test_spec_rejects_what_the_kernel_cannot_do() -> None:
    with pytest.raises(ValueError, match="top_k 5 is not in 1..4"):
        _spec(top_k=5)
    with pytest.raises(ValueError, match="multiples of 32"):
        _spec(hidden=48)
    with pytest.raises(ValueError, match="dtype torch.float64"):
        _spec(dtype=torch.float64)


# ---------------------------------------------------------------------------- PTX


def _meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def test_ptx_for_sm90_at_gpt_oss_20b_sizes_has_no_spills(build) -> None:  # noqa: ANN001
    """gpt-oss-20b's experts (hidden 2880, intermediate 2880, 32 experts, top 4), bf16, a decode
    step of 8 tokens and a prefill of 2048, compiled for sm_90 as the runtime specializes them."""
    hidden, inter, experts, top_k = 2880, 2880, 32, 4
    spec = _spec(hidden, inter, experts, top_k, dtype=torch.bfloat16)
    module = build(spec)
    fn = getattr(module, module.kernel_name)
    specs = {}
    u8 = torch.uint8
    for tokens in (8, 2048):
        tensors = [_meta(tokens, hidden), _meta(tokens, experts),
                   _meta(experts, 2 * inter, hidden // 32, 16, dtype=u8), _meta(experts, 2 * inter, hidden // 32, dtype=u8),
                   _meta(experts, 2 * inter), _meta(experts, hidden, inter // 32, 16, dtype=u8),
                   _meta(experts, hidden, inter // 32, dtype=u8), _meta(experts, hidden)]
        for launch in record_launches(module, tensors, []):
            s = specialize_launch(module.kernel_name, Path(module.__file__), fn, launch)
            specs.setdefault(tuple(sorted(s.constexprs.items())), s)
    assert {s.constexprs["PHASE"] for s in specs.values()} == {ROUTE, ALIGN, GATE_UP, DOWN, COMBINE}
    for s, report in zip(specs.values(), compile_all(list(specs.values())), strict=True):
        print(s.constexprs, report)
        assert report.spills == 0, (s.constexprs, report)
        assert report.shared_memory <= H100_SHARED_MEMORY, (s.constexprs, report)
