"""The MoE kernel template (routing, alignment by expert, the gate/up and down grouped GEMMs, the
combine) against `ad.moe`'s torch reference (`torch_ops.moe`, a plain loop over experts, itself
checked against HF's blocks in test_moe_op.py), in the Triton interpreter on CPU (conftest sets
TRITON_INTERPRET=1 where CUDA is absent) or on the GPU; and its PTX for sm_90 at Mixtral-8x7B and
Qwen3-30B-A3B sizes, compiled without a GPU: no spills, shared memory within an H100's.

The kernel module is called directly (its `launch`), so nothing can fall back to the reference."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from template_modules import template_builder

from ad_mlir.codegen.ptx import compile_all, record_launches, specialize_launch
from ad_mlir.codegen.templates.moe_kernel import (
    ALIGN,
    COMBINE,
    DOWN,
    GATE_UP,
    ROUTE,
    MoeSpec,
    emit_moe_module,
)
from ad_mlir.semantics import torch_ops

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
H100_SHARED_MEMORY = 227 * 1024

# |kernel - reference| <= tol (1 + |reference|). fp32: the GEMMs and sums run in another order
# (measured 8e-7). bf16: both round gate, up, silu, the product and each expert's output to bf16
# at the same points, but the interpreter's f32 -> bf16 conversions truncate where torch rounds
# to nearest (DESIGN.md): up to one ulp (2^-7 relative) at each of those five roundings, which
# the down GEMM and the combine carry on (measured 3.8 ulps).
TOLERANCE = {torch.float32: 2e-6, torch.bfloat16: 6 * 2.0**-7}


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Callable[[MoeSpec], ModuleType]:
    return template_builder(tmp_path_factory.mktemp("moe_kernels"), "moe", emit_moe_module)


class Case:
    """Random inputs of one call; `bias` is added to the router logits (steering tokens)."""

    def __init__(self, spec: MoeSpec, tokens: int, bias: list[float] | None = None, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        h, inter, experts = spec.hidden, spec.intermediate, spec.experts + spec.shared_experts
        self.spec = spec
        self.x = torch.randn(tokens, h, generator=g).to(spec.dtype).to(DEVICE)
        logits = torch.randn(tokens, spec.experts, generator=g) + torch.tensor(bias or 0.0)
        self.logits = logits.to(spec.dtype).to(DEVICE)
        self.gate_up = (torch.randn(experts, 2 * inter, h, generator=g) * h**-0.5).to(spec.dtype).to(DEVICE)
        self.down = (torch.randn(experts, h, inter, generator=g) * inter**-0.5).to(spec.dtype).to(DEVICE)
        self.gate = None
        if spec.shared_gate:
            self.gate = torch.randn(tokens, 1, generator=g).to(spec.dtype).to(DEVICE)

    def tensors(self) -> list[torch.Tensor]:
        return [self.x, self.logits, self.gate_up, self.down, *([self.gate] if self.gate is not None else [])]

    def reference(self) -> torch.Tensor:
        s = self.spec
        return torch_ops.moe(self.x, self.logits, self.gate_up, self.down, self.gate, s.top_k, s.shared_experts,
                             s.normalize, s.round_weights)


def _spec(hidden: int = 48, inter: int = 32, experts: int = 4, top_k: int = 2, shared: int = 0, gate: bool = False,
          dtype: torch.dtype = torch.float32, normalize: bool = True, round_weights: bool = False) -> MoeSpec:
    return MoeSpec(hidden, inter, experts, shared, top_k, dtype, gate, normalize, round_weights)


def _run(module: ModuleType, case: Case) -> torch.Tensor:
    out, = module.launch(getattr(module, module.kernel_name), case.tensors(), [])
    return out


def _check(module: ModuleType, case: Case) -> None:
    tol = TOLERANCE[case.spec.dtype]
    torch.testing.assert_close(_run(module, case).float(), case.reference().float(), atol=tol, rtol=tol)


@pytest.mark.parametrize(("spec", "tokens", "bias"), [
    (_spec(), 37, None),
    (_spec(), 1, None),  # decode
    (_spec(hidden=96, inter=40, experts=5, top_k=1), 37, None),
    (_spec(normalize=False, top_k=3), 11, None),
    (_spec(top_k=1), 9, [8.0, 0.0, 0.0, 0.0]),  # every token to expert 0
    (_spec(), 19, [0.0, 0.0, 0.0, -20.0]),  # expert 3 receives no token
    (_spec(hidden=96, inter=40, experts=5, shared=2, gate=True, round_weights=True), 37, None),
    (_spec(shared=1), 5, None),  # a shared expert without a gate: weight 1
], ids=["37_tokens", "decode", "odd_sizes_top1", "unnormalized_top3", "one_expert_for_all", "an_idle_expert",
        "shared_gated", "shared_ungated"])
def test_kernel_matches_the_reference(build, spec: MoeSpec, tokens: int, bias: list | None) -> None:  # noqa: ANN001
    case = Case(spec, tokens, bias)
    if bias is not None:  # the steering did what the case says
        chosen = set(torch.topk(case.logits.float(), spec.top_k).indices.flatten().tolist())
        assert chosen == ({0} if spec.top_k == 1 else {0, 1, 2})
    _check(build(spec), case)


@pytest.mark.parametrize("tokens", [1, 37])
def test_kernel_in_bf16(build, tokens: int) -> None:  # noqa: ANN001
    spec = _spec(hidden=96, inter=40, experts=5, shared=2, gate=True, dtype=torch.bfloat16, round_weights=True)
    _check(build(spec), Case(spec, tokens))


class _Recording:
    """The kernel, launched for real, with each launch's arguments kept."""

    def __init__(self, fn: object):
        self.fn, self.launches = fn, []

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
        def run(*args: object, **kwargs: object) -> None:
            self.launches.append((grid, args, kwargs))
            self.fn[grid](*args, **kwargs)
        return run


@pytest.mark.parametrize(("tokens", "bias", "used"), [
    (1, None, 2),  # decode: the token's 2 experts, one block each
    (37, [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -30.0], None),
])
def test_only_experts_with_tokens_get_blocks(build, tokens: int, bias: list | None, used: int | None) -> None:  # noqa: ANN001
    """Of 8 experts, blocks go to those that received (token, slot) pairs, ceil(pairs / BLOCK_M)
    each; the rest of the static grid has expert -1 and returns at once. Five launches in all."""
    spec = _spec(experts=8)
    module = build(spec)
    case = Case(spec, tokens, bias)
    kernel = _Recording(getattr(module, module.kernel_name))
    module.launch(kernel, case.tensors(), [])
    assert [kw["PHASE"] for _, _, kw in kernel.launches] == [ROUTE, ALIGN, GATE_UP, DOWN, COMBINE]
    _, args, kwargs = kernel.launches[GATE_UP]
    block_expert = args[kernel.fn.arg_names.index("block_expert")].cpu()
    experts = torch.topk(case.logits.float(), 2).indices.flatten()
    counts = torch.bincount(experts, minlength=8)
    expected = [e for e in range(8) for _ in range(-(-int(counts[e]) // kwargs["BLOCK_M"]))]
    real = block_expert[block_expert >= 0].tolist()
    assert real == expected and (used is None or len(real) == used)
    assert (block_expert[len(real):] == -1).all()


def test_spec_rejects_what_the_kernel_cannot_do() -> None:
    with pytest.raises(ValueError, match="top_k 5 is not in 1..4"):
        _spec(top_k=5)
    with pytest.raises(ValueError, match="top_k 0 is not in 1..4"):  # no routed expert: nothing to route to
        _spec(top_k=0)
    with pytest.raises(ValueError, match="dtype torch.float64"):
        _spec(dtype=torch.float64)


# ---------------------------------------------------------------------------- PTX


def _meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


@pytest.mark.parametrize(("hidden", "inter", "experts", "top_k", "shared"), [
    (4096, 14336, 8, 2, 0),  # Mixtral-8x7B
    (2048, 768, 128, 8, 0),  # Qwen3-30B-A3B
    (2048, 1408, 60, 4, 4),  # Qwen1.5-MoE-A2.7B: a gated shared expert of 5632 = 4 x 1408
], ids=["mixtral_8x7b", "qwen3_30b_a3b", "qwen1.5_moe_a2.7b"])
def test_ptx_for_sm90_at_real_sizes_has_no_spills(build, hidden: int, inter: int, experts: int, top_k: int,  # noqa: ANN001
                                                  shared: int) -> None:
    """bf16, a decode step of 8 tokens and a prefill of 2048, compiled for sm_90 as the runtime
    specializes them (each distinct specialization once)."""
    spec = _spec(hidden, inter, experts, top_k, shared, gate=shared > 0, dtype=torch.bfloat16)
    module = build(spec)
    fn = getattr(module, module.kernel_name)
    specs = {}
    for tokens in (8, 2048):
        all_experts = experts + shared
        tensors = [_meta(tokens, hidden), _meta(tokens, experts), _meta(all_experts, 2 * inter, hidden),
                   _meta(all_experts, hidden, inter), *([_meta(tokens, 1)] if shared else [])]
        for launch in record_launches(module, tensors, []):
            s = specialize_launch(module.kernel_name, Path(module.__file__), fn, launch)
            specs.setdefault(tuple(sorted(s.constexprs.items())), s)
    assert {s.constexprs["PHASE"] for s in specs.values()} == {ROUTE, ALIGN, GATE_UP, DOWN, COMBINE}
    for s, report in zip(specs.values(), compile_all(list(specs.values())), strict=True):
        assert report.spills == 0, (s.constexprs, report)
        assert report.shared_memory <= H100_SHARED_MEMORY, (s.constexprs, report)


def test_ptx_report_of_a_compiled_moe_has_a_row_per_phase() -> None:
    """`ptx_reports` on an `ad.moe` kernel built by the compiler (a small Mixtral block through
    match-moe and codegen): one report per phase, none spilling."""
    from xdsl.parser import Parser

    from ad_mlir.codegen.ptx import ptx_reports
    from ad_mlir.passes.pipeline import make_context
    from ad_mlir.runtime.kernels import build_kernels

    text = """func.func @f(%x: tensor<?x48xbf16>, %l: tensor<?x4xbf16>, %gu: tensor<4x64x48xbf16>,
                         %d: tensor<4x48x32xbf16>) -> tensor<?x48xbf16> {
      %0 = ad.moe %x, %l experts %gu, %d top_k 2 normalize : (tensor<?x48xbf16>, tensor<?x4xbf16>,
           tensor<4x64x48xbf16>, tensor<4x48x32xbf16>) -> tensor<?x48xbf16>
      func.return %0 : tensor<?x48xbf16>
    }"""
    kernels = build_kernels(Parser(make_context(), text).parse_module())
    reports = ptx_reports(kernels.values())
    name = next(iter(kernels.values())).name
    assert [r.name for r in reports] == [f"{name} phase {p}" for p in (ROUTE, ALIGN, GATE_UP, DOWN, COMBINE)]
    assert all(r.spills == 0 for r in reports), reports
