"""LayerNorm: the spellings models use reach `ad.layer_norm` (`match-layernorm`), and the
residual add joins it (`fuse-add-layernorm`), computing what eager computes.

`ad.layer_norm`'s meaning is `torch.ops.ad_mlir.layer_norm`: F.layer_norm's math step by step
(test_llm_ops.py compares the two). Against eager the graph therefore differs only by the order
of the row sums: fp32 within torch.testing's defaults; bf16 within one bf16 rounding of the
result (2^-8 relative, both round to nearest)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ad_mlir.frontends.fx_import import import_program
from ad_mlir.semantics.reference import evaluate


def _assert_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape
    if expected.dtype == torch.float32:
        torch.testing.assert_close(got, expected)
    else:
        torch.testing.assert_close(got.float(), expected.float(), rtol=2.0**-8, atol=1e-5)


class Nemotron1P(torch.nn.LayerNorm):
    """Nemotron's LayerNorm1P: the weight is stored as `w` and applied as `w + 1`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight + 1.0, self.bias, self.eps)


class NoAffine(torch.nn.Module):
    """OLMo's form: F.layer_norm in fp32 without weight or bias, cast back."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.float(), x.shape[-1:], None, None, 1e-5).to(x.dtype)


SPELLINGS = {
    "nn_layer_norm": lambda: torch.nn.LayerNorm(96),
    "no_bias": lambda: torch.nn.LayerNorm(96, bias=False),
    "no_affine": lambda: torch.nn.LayerNorm(96, elementwise_affine=False),
    "one_plus_weight": lambda: Nemotron1P(96),
    "functional_fp32": NoAffine,
}


def _randomized(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Norm weights and biases (and linear biases) random rather than 1 and 0; linear weights
    keep their default init (scaled by the fan-in, as a model's are)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() == 1:
                p.normal_()
    return module.to(dtype).eval()


def _op_names(program) -> list[str]:  # noqa: ANN001 (an ImportedProgram)
    """The function's ops, torch ops by their target."""
    return [op.target.data if op.name == "ad.torch_op" else op.name for op in program.function.body.block.ops]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_layer_norm_spellings_become_one_op(spelling: str, dtype: torch.dtype) -> None:
    """Imported, torch's LayerNorm stays torch's (the `none` pipeline runs what eager runs);
    `match-layernorm` makes it the op."""
    from ad_mlir.passes.pipeline import run_pipeline

    module = _randomized(SPELLINGS[spelling](), dtype)
    x = (torch.randn(3, 5, 96) * 2 + 0.5).to(dtype)
    program = import_program(torch.export.export(module, (x,)))
    assert "aten.layer_norm.default" in _op_names(program)
    run_pipeline(program.module, "canonicalize,match-layernorm")
    names = _op_names(program)
    assert names.count("ad.layer_norm") == 1 and not any("layer_norm" in n for n in names if n.startswith("aten")), names
    with torch.no_grad():
        _assert_close(evaluate(program.module, program.weights, [x])[0], module(x))


def test_layer_norm_over_two_dims_stays_torchs() -> None:
    """`ad.layer_norm` normalizes the last dim only: any other normalized shape stays the torch
    op it is (and computes what eager does)."""
    from ad_mlir.passes.pipeline import run_pipeline

    module = _randomized(torch.nn.LayerNorm((5, 96)), torch.float32)
    x = torch.randn(3, 5, 96)
    program = import_program(torch.export.export(module, (x,)))
    run_pipeline(program.module, "canonicalize,match-layernorm")
    names = _op_names(program)
    assert "ad.layer_norm" not in names and "aten.layer_norm.default" in names
    with torch.no_grad():
        assert torch.equal(evaluate(program.module, program.weights, [x])[0], module(x))


# ------------------------------------------------------- the default pipeline, kernels run


@pytest.fixture
def no_reference_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kernel must run as its Triton kernel (in the interpreter), not its reference."""
    from ad_mlir.runtime import kernels

    def refuse(*_: object) -> None:
        raise AssertionError("a kernel ran its reference semantics")

    monkeypatch.setattr(kernels, "run_reference", refuse)


class PreNorm(torch.nn.Module):
    """GPT-2 / OPT: residual add, norm, projection, residual add, next norm (and the sum on)."""

    def __init__(self, hidden: int, norm: type[torch.nn.Module] = torch.nn.LayerNorm) -> None:
        super().__init__()
        self.ln_1, self.proj, self.ln_2 = norm(hidden), torch.nn.Linear(hidden, hidden), norm(hidden)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x + residual
        h = h + self.proj(self.ln_1(h))
        return self.ln_2(h), h


class Parallel(torch.nn.Module):
    """Phi / Falcon: one norm feeds attention and MLP (two users), the sum is the residual."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.ln, self.attn, self.mlp = torch.nn.LayerNorm(hidden), torch.nn.Linear(hidden, hidden), torch.nn.Linear(
            hidden, hidden)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        h = x + residual
        n = self.ln(h)
        return self.attn(n) + torch.relu(self.mlp(n)) + h


class Cohere(torch.nn.Module):
    """CohereLayerNorm, spelled out (no bias), after a residual add."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        h = x + residual
        hf = h.to(torch.float32)
        mean = hf.mean(-1, keepdim=True)
        variance = (hf - mean).pow(2).mean(-1, keepdim=True)
        hf = (hf - mean) * torch.rsqrt(variance + 1e-5)
        return (self.weight.to(torch.float32) * hf).to(h.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_spelled_out_layer_norm_becomes_the_op_bit_for_bit(dtype: torch.dtype) -> None:
    """Cohere's spelling does the reference's steps in fp32 and rounds once: after
    `match-layernorm` the graph computes the same bits as eager (reference evaluator)."""
    from ad_mlir.passes.pipeline import run_pipeline

    module = _randomized(Cohere(96), dtype)
    args = ((torch.randn(3, 5, 96) * 2).to(dtype), (torch.randn(3, 5, 96) + 1).to(dtype))
    program = import_program(torch.export.export(module, args))
    run_pipeline(program.module, "canonicalize,match-layernorm")
    ops = [op.name for op in program.function.body.block.ops]
    assert ops.count("ad.layer_norm") == 1 and "ad.rsqrt" not in ops and "ad.mean" not in ops, ops
    with torch.no_grad():
        got, expected = evaluate(program.module, program.weights, list(args))[0], module(*args)
    assert got.dtype == expected.dtype and torch.equal(got, expected)


BLOCKS = {
    # name: (module, the LLM-level ops the default pipeline leaves in it)
    "pre_norm": (lambda h: PreNorm(h), ["ad.add_layer_norm", "ad.add_layer_norm"]),
    "nemotron_1p": (lambda h: PreNorm(h, Nemotron1P), ["ad.add_layer_norm", "ad.add_layer_norm"]),
    "parallel": (Parallel, ["ad.add_layer_norm"]),
    "cohere": (Cohere, ["ad.add_layer_norm"]),
}


@pytest.mark.parametrize("hidden", [96, 200])
@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_layer_norm_blocks_fuse_and_match_eager(block: str, hidden: int, no_reference_fallback: None) -> None:
    """fp32 (the kernels only reorder the row sums: torch.testing's defaults) at odd hidden
    sizes; the residual add joins the norm even where the sum has other users (the next add,
    the output) and the norm's result has two (the parallel block)."""
    from ad_mlir.compiler import compile_program

    make, expected_ops = BLOCKS[block]
    module = _randomized(make(hidden), torch.float32)
    args = (torch.randn(2, 5, hidden), torch.randn(2, 5, hidden) * 2 + 1)
    gm, program = compile_program(torch.export.export(module, args))
    ops = [op.name for op in program.function.body.block.ops]
    assert [n for n in ops if n.endswith("layer_norm")] == expected_ops, ops
    assert "ad.rsqrt" not in ops and "ad.mean" not in ops
    with torch.no_grad():
        for got, expected in zip(gm(*args), torch.utils._pytree.tree_leaves(module(*args)), strict=True):
            _assert_close(got, expected)


# ------------------------------------------------------------------- PTX at real sizes

PTX_KERNELS = {
    # name: the function's arguments (H the hidden size, bf16), its body, what it returns
    "layer_norm": (
        "%x: tensor<?xHxbf16>, %w: tensor<Hxbf16>, %b: tensor<Hxbf16>",
        "%n = ad.layer_norm %x weight %w bias %b eps 1.0e-05 : (tensor<?xHxbf16> weight tensor<Hxbf16> "
        "bias tensor<Hxbf16>) -> tensor<?xHxbf16>",
        "%n : tensor<?xHxbf16>",
    ),
    "add_layer_norm": (
        "%x: tensor<?xHxbf16>, %r: tensor<?xHxbf16>, %w: tensor<Hxbf16>, %b: tensor<Hxbf16>",
        "%n, %h = ad.add_layer_norm %x, %r weight %w bias %b eps 1.0e-05 : (tensor<?xHxbf16>, tensor<?xHxbf16> "
        "weight tensor<Hxbf16> bias tensor<Hxbf16>) -> (tensor<?xHxbf16>, tensor<?xHxbf16>)",
        "%n, %h : tensor<?xHxbf16>, tensor<?xHxbf16>",
    ),
    "add_layer_norm_quantize_fp8_dynamic": (
        "%x: tensor<?xHxbf16>, %r: tensor<?xHxbf16>, %w: tensor<Hxbf16>, %b: tensor<Hxbf16>",
        "%n, %h = ad.add_layer_norm %x, %r weight %w bias %b eps 1.0e-05 : (tensor<?xHxbf16>, tensor<?xHxbf16> "
        "weight tensor<Hxbf16> bias tensor<Hxbf16>) -> (tensor<?xHxbf16>, tensor<?xHxbf16>)\n"
        "%q, %s = ad.quantize_fp8_dynamic %n per_token : tensor<?xHxbf16> -> (tensor<?xHxf8E4M3FN>, tensor<?x1xf32>)",
        "%h, %q, %s : tensor<?xHxbf16>, tensor<?xHxf8E4M3FN>, tensor<?x1xf32>",
    ),
}


@pytest.mark.parametrize("hidden", [4096, 8192])
def test_layer_norm_kernels_compile_for_sm90_without_spills(hidden: int, tmp_path) -> None:
    """bf16 LayerNorm, add + LayerNorm and add + LayerNorm + per-token FP8 at hidden 4096 and
    8192 (the largest single tile), as the runtime specializes them for 256 tokens: PTX for
    sm_90 without a GPU, no spills, vector loads and stores."""
    from xdsl.parser import Parser

    from ad_mlir.codegen.cache import KernelCache
    from ad_mlir.codegen.lowering import kernel_ops
    from ad_mlir.codegen.ptx import ptx_reports
    from ad_mlir.passes.pipeline import make_context, run_pipeline
    from ad_mlir.runtime.kernels import region_kernel

    cache, kernels = KernelCache(tmp_path), {}
    for name, (args, body, returns) in PTX_KERNELS.items():
        text = f"func.func @f({args}) -> ({returns.split(' : ')[1]}) {{\n{body}\nfunc.return {returns}\n}}"
        module = Parser(make_context(), text.replace("xHx", f"x{hidden}x").replace("<Hx", f"<{hidden}x")).parse_module()
        run_pipeline(module, "fuse-rmsnorm-quant")
        (op,) = kernel_ops(module)
        kernels[name] = region_kernel(op, cache)
        assert kernels[name].name.startswith(name + "_"), kernels[name].name
    for report in ptx_reports(kernels.values()):
        assert report.registers > 0 and report.spills == 0, report
        assert report.vectorized_loads and report.vectorized_stores, report
        assert report.block_c == hidden, report
