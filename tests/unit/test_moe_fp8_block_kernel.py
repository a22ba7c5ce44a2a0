"""The fine-grained FP8 MoE kernel template (`codegen/templates/moe_fp8_block_kernel.py`: alignment
by expert from the router's choices, the gate/up and down grouped GEMMs quantizing their inputs
per group of bk and multiplying e4m3 tiles with both block scales, the combine) against
`ad.moe_fp8_block`'s torch reference (`torch_ops.moe_fp8_block`: each routed expert's two
`linear_fp8_block` GEMMs, transformers' `FP8Experts` semantics), in the Triton interpreter on CPU
(the interpreter's f32 -> e4m3 and f32 -> bf16 conversions made torch's:
`nearest_e4m3_rounding`, `nearest_bf16_rounding`) or on the GPU; and its PTX for sm_90 at
DeepSeek-V3's and Qwen3-30B-A3B's expert sizes, compiled without a GPU: no spills.

The kernel module is called directly (its `launch`), so nothing can fall back to the reference."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from template_modules import template_builder

from ad_mlir.codegen.interpreter import nearest_bf16_rounding, nearest_e4m3_rounding
from ad_mlir.codegen.ptx import compile_all, record_launches, specialize_launch
from ad_mlir.codegen.templates.moe_fp8_block_kernel import (
    ALIGN,
    COMBINE,
    DOWN,
    GATE_UP,
    MoeFp8BlockSpec,
    emit_moe_fp8_block_module,
    fp8_tiles,
)
from ad_mlir.semantics import torch_ops
from ad_mlir.zoo.fp8_blocks import quantize_blocks

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
H100_SHARED_MEMORY = 227 * 1024

# |kernel - reference| <= tol * max|reference|. Both quantize the same rounded inputs with the same
# fp32 arithmetic (the same e4m3 codes and scales), take exact fp8 x fp8 products and round each
# GEMM, the silu, the product and the weighted output at the same points; they differ in the order
# of the fp32 additions within a block's dot. fp32: that order alone (a few ulps of fp32), or, where
# it moves an intermediate across an e4m3 rounding boundary of the down GEMM's quantization, one
# element's 2^-4 relative change in one of I terms: 1e-4 of the largest output allowed. bf16: one
# ulp of the output's scale (2^-7), as the plain MoE kernel's test allows. Measured: fp32 1.1e-7
# (transposed decode tiles) and 5e-8; bf16 equal, bit for bit.
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2.0**-7}


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Callable[[MoeFp8BlockSpec], ModuleType]:
    return template_builder(tmp_path_factory.mktemp("moe_fp8_block_kernels"), "moe_fp8_block",
                            emit_moe_fp8_block_module)


def _spec(hidden: int = 64, inter: int = 32, experts: int = 4, top_k: int = 2, block: tuple[int, int] = (16, 32),
          dtype: torch.dtype = torch.float32) -> MoeFp8BlockSpec:
    return MoeFp8BlockSpec(hidden, inter, experts, top_k, *block, dtype)


class Case:
    """Random inputs of one call: experts quantized in blocks from normal weights, routing as a
    softmax top-k of random logits (steered by `bias`), its weights in fp32 (DeepSeek-V3's router's
    dtype) so that the kernel's rounding of them to x's dtype counts."""

    def __init__(self, spec: MoeFp8BlockSpec, tokens: int, bias: list[float] | None = None, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        h, inter, e, block = spec.hidden, spec.intermediate, spec.experts, (spec.block_n, spec.block_k)
        self.spec = spec
        self.x = torch.randn(tokens, h, generator=g).to(spec.dtype)
        logits = torch.randn(tokens, e, generator=g) + torch.tensor(bias or 0.0)
        weights, self.ids = torch.topk(torch.softmax(logits, -1), spec.top_k)
        self.weights = weights * 2.5  # a routed scaling factor, as DeepSeek-V3's
        gate_up = [quantize_blocks(w, block) for w in torch.randn(e, 2 * inter, h, generator=g) * 3 * h**-0.5]
        down = [quantize_blocks(w, block) for w in torch.randn(e, h, inter, generator=g) * inter**-0.5]
        self.experts = [torch.stack([w for w, _ in gate_up]), torch.stack([s for _, s in gate_up]),
                        torch.stack([w for w, _ in down]), torch.stack([s for _, s in down])]

    def tensors(self) -> list[torch.Tensor]:
        return [t.to(DEVICE) for t in (self.x, self.ids, self.weights, *self.experts)]

    def reference(self) -> torch.Tensor:
        s = self.spec
        return torch_ops.moe_fp8_block(self.x, self.ids, self.weights, *self.experts, [s.block_n, s.block_k])


def _check(module: ModuleType, case: Case) -> None:
    with nearest_bf16_rounding(), nearest_e4m3_rounding():
        out, = module.launch(getattr(module, module.kernel_name), case.tensors(), [])
    reference = case.reference().float()
    assert reference.abs().max() > 0
    torch.testing.assert_close(out.cpu().float(), reference, atol=TOLERANCE[case.spec.dtype] * reference.abs().max().item(),
                               rtol=0)


@pytest.mark.parametrize(("spec", "tokens", "bias"), [
    (_spec(), 21, None),  # 16-row blocks, computed transposed (`Fp8Tiles.swap_ab`)
    (_spec(), 40, None),  # 32-row blocks, not transposed
    (_spec(), 1, None),  # decode
    (_spec(hidden=96, inter=48, experts=5, top_k=3, block=(16, 16)), 13, None),  # 3 K blocks of 16 a GEMM
    (_spec(top_k=1), 9, [8.0, 0.0, 0.0, 0.0]),  # every token to expert 0
    (_spec(), 11, [0.0, 0.0, 0.0, -20.0]),  # expert 3 receives no token
    (_spec(dtype=torch.bfloat16, block=(32, 32)), 7, None),
], ids=["21_tokens", "40_tokens", "decode", "odd_sizes_top3", "one_expert_for_all", "an_idle_expert", "bf16"])
def test_kernel_matches_the_reference(build, spec: MoeFp8BlockSpec, tokens: int, bias: list | None) -> None:  # noqa: ANN001
    case = Case(spec, tokens, bias)
    assert fp8_tiles(spec, tokens).swap_ab == (tokens < 40)
    if bias is not None:  # the steering did what the case says
        assert set(case.ids.flatten().tolist()) == ({0} if spec.top_k == 1 else {0, 1, 2})
    _check(build(spec), case)


def test_spec_rejects_what_the_kernel_cannot_do() -> None:
    with pytest.raises(ValueError, match="top_k 5 is not in 1..4"):
        _spec(top_k=5)
    with pytest.raises(ValueError, match=r"must be multiples of the blocks \[16, 32\]"):
        _spec(inter=48)
    with pytest.raises(ValueError, match="K block 256 is not in 16..128"):
        _spec(hidden=256, inter=256, block=(16, 256))
    with pytest.raises(ValueError, match="dtype torch.float64"):
        _spec(dtype=torch.float64)


# ---------------------------------------------------------------------------- PTX


def _meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def test_ptx_for_sm90_at_deepseek_v3_sizes_has_no_spills(build) -> None:  # noqa: ANN001
    """DeepSeek-V3's experts (hidden 7168, intermediate 2048, 256 experts, top 8, blocks [128,
    128]), bf16, a decode step of 8 tokens and a prefill of 2048, compiled for sm_90 as the runtime
    specializes them. (Qwen3-30B-A3B's, 2048 / 768 / 128 experts, take the same tiles: measured
    no spills too.) Every GEMM runs on wgmma e4m3, decode's transposed."""
    hidden, inter, experts, top_k, block = 7168, 2048, 256, 8, 128
    module = build(_spec(hidden, inter, experts, top_k, (block, block), torch.bfloat16))
    fn = getattr(module, module.kernel_name)
    fp8, f32 = torch.float8_e4m3fn, torch.float32
    specs = {}
    for tokens in (8, 2048):
        tensors = [_meta(tokens, hidden), _meta(tokens, top_k, dtype=torch.int64), _meta(tokens, top_k, dtype=f32),
                   _meta(experts, 2 * inter, hidden, dtype=fp8), _meta(experts, 2 * inter // block, hidden // block, dtype=f32),
                   _meta(experts, hidden, inter, dtype=fp8), _meta(experts, hidden // block, inter // block, dtype=f32)]
        for launch in record_launches(module, tensors, []):
            s = specialize_launch(module.kernel_name, Path(module.__file__), fn, launch)
            specs.setdefault(tuple(sorted(s.constexprs.items())), s)
    assert {s.constexprs["PHASE"] for s in specs.values()} == {ALIGN, GATE_UP, DOWN, COMBINE}
    assert {s.constexprs["BLOCK_M"] for s in specs.values() if s.constexprs["PHASE"] == GATE_UP} == {16, 64}
    for s, report in zip(specs.values(), compile_all(list(specs.values())), strict=True):
        print(s.constexprs, report)
        assert report.spills == 0, (s.constexprs, report)
        assert report.shared_memory <= H100_SHARED_MEMORY, (s.constexprs, report)
        if s.constexprs["PHASE"] in (GATE_UP, DOWN):  # decode's tiles transposed onto wgmma too
            assert any(mma.startswith("wgmma") and "e4m3.e4m3" in mma for mma in report.mma), (s.constexprs, report)
