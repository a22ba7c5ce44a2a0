"""The LLM-level ops (`ad.rms_norm`, `ad.add_rms_norm`, `ad.silu_and_mul`): their decomposition
computes exactly what their torch reference computes, and their Triton kernel (run in the
interpreter on CPU) matches the reference.

Decomposition vs reference: both are eager torch on CPU doing the same steps in the same
dtypes, so they must agree bit for bit. Kernel vs reference: the kernel rounds at the same
points (the decomposition's types) and keeps fp32 in between, so with fp32 all the way it
differs only by the order of the row sum (torch.testing's fp32 tolerance). Each conversion to
bf16, though, truncates in the interpreter (DESIGN.md) where eager rounds to nearest: at most
one bf16 ulp, which is at most 2^-7 of the value (8 significant bits), and the steps after it
(products, the normalization) carry that relative error on. So a case allows 2^-7 relative
error per bf16 rounding on the way from the fp32 math to an output (an explicit cast, a bf16
intermediate, the store): `roundings` in CASES."""

from __future__ import annotations

import pytest
import torch
from kernel_guard import kernels_ran
from xdsl.dialects.builtin import ModuleOp
from xdsl.parser import Parser

from ad_mlir.codegen.cache import KernelCache
from ad_mlir.codegen.lowering import kernel_region
from ad_mlir.dialects import ad
from ad_mlir.frontends.fx_import import import_program
from ad_mlir.passes.pipeline import make_context
from ad_mlir.runtime.kernels import region_kernel
from ad_mlir.semantics.op_table import torch_dtype
from ad_mlir.semantics.reference import evaluate, run_block, run_op

X_BF16, X_F32 = "%x: tensor<5x96xbf16>", "%x: tensor<5x96xf32>"
CASES = {
    # name: (the function's arguments, the op on them, bf16 roundings on the way to an output)
    "llama_bf16": (
        f"{X_BF16}, %w: tensor<96xbf16>",
        "ad.rms_norm %x weight %w eps 1.0e-05 : (tensor<5x96xbf16>, tensor<96xbf16>) -> tensor<5x96xbf16>",
        2,
    ),
    "llama_promotes": (
        f"{X_BF16}, %w: tensor<96xf32>",
        "ad.rms_norm %x weight %w eps 1.0e-06 : (tensor<5x96xbf16>, tensor<96xf32>) -> tensor<5x96xf32>",
        1,
    ),
    "gemma_bf16": (
        f"{X_BF16}, %w: tensor<96xbf16>",
        "ad.rms_norm %x weight %w eps 1.0e-06 offset 1.0 weight_in_fp32 : "
        "(tensor<5x96xbf16>, tensor<96xbf16>) -> tensor<5x96xbf16>",
        1,
    ),
    "no_weight_f32": (X_F32, "ad.rms_norm %x eps 1.0e-06 : (tensor<5x96xf32>) -> tensor<5x96xf32>", 0),
    "long_row_f32": (
        "%x: tensor<3x8200xf32>, %w: tensor<8200xf32>",
        "ad.rms_norm %x weight %w eps 1.0e-06 : (tensor<3x8200xf32>, tensor<8200xf32>) -> tensor<3x8200xf32>",
        0,
    ),
    "add_llama_bf16": (
        f"{X_BF16}, %r: tensor<5x96xbf16>, %w: tensor<96xbf16>",
        "ad.add_rms_norm %x, %r weight %w eps 1.0e-06 : (tensor<5x96xbf16>, tensor<5x96xbf16>, "
        "tensor<96xbf16>) -> (tensor<5x96xbf16>, tensor<5x96xbf16>)",
        3,
    ),
    "add_gemma_f32": (
        f"{X_F32}, %r: tensor<5x96xf32>, %w: tensor<96xf32>",
        "ad.add_rms_norm %x, %r weight %w eps 1.0e-06 offset 1.0 weight_in_fp32 : (tensor<5x96xf32>, "
        "tensor<5x96xf32>, tensor<96xf32>) -> (tensor<5x96xf32>, tensor<5x96xf32>)",
        0,
    ),
    "layer_norm_bf16": (
        f"{X_BF16}, %w: tensor<96xbf16>, %b: tensor<96xbf16>",
        "ad.layer_norm %x weight %w bias %b eps 1.0e-05 : (tensor<5x96xbf16> weight tensor<96xbf16> bias tensor<96xbf16>) "
        "-> tensor<5x96xbf16>",
        1,
    ),
    "layer_norm_mixed_bf16": (
        "%x: tensor<5x200xbf16>, %w: tensor<200xf32>, %b: tensor<200xf32>",
        "ad.layer_norm %x weight %w bias %b eps 1.0e-05 : (tensor<5x200xbf16> weight tensor<200xf32> bias tensor<200xf32>) "
        "-> tensor<5x200xbf16>",
        1,
    ),
    "layer_norm_weight_only_f32": (
        "%x: tensor<5x200xf32>, %w: tensor<200xf32>",
        "ad.layer_norm %x weight %w eps 1.0e-06 : (tensor<5x200xf32> weight tensor<200xf32>) -> tensor<5x200xf32>",
        0,
    ),
    "layer_norm_no_affine_bf16": (
        X_BF16, "ad.layer_norm %x eps 1.0e-05 : (tensor<5x96xbf16>) -> tensor<5x96xbf16>", 1,
    ),
    "layer_norm_bias_only_bf16": (
        f"{X_BF16}, %b: tensor<96xf32>",
        "ad.layer_norm %x bias %b eps 1.0e-05 : (tensor<5x96xbf16> bias tensor<96xf32>) -> tensor<5x96xbf16>",
        1,
    ),
    "layer_norm_long_row_f32": (
        "%x: tensor<3x8200xf32>, %w: tensor<8200xf32>, %b: tensor<8200xf32>",
        "ad.layer_norm %x weight %w bias %b eps 1.0e-05 : (tensor<3x8200xf32> weight tensor<8200xf32> "
        "bias tensor<8200xf32>) "
        "-> tensor<3x8200xf32>",
        0,
    ),
    "add_layer_norm_f32": (
        f"{X_F32}, %r: tensor<5x96xf32>, %w: tensor<96xf32>, %b: tensor<96xf32>",
        "ad.add_layer_norm %x, %r weight %w bias %b eps 1.0e-05 : (tensor<5x96xf32>, tensor<5x96xf32> "
        "weight tensor<96xf32> bias tensor<96xf32>) -> (tensor<5x96xf32>, tensor<5x96xf32>)",
        0,
    ),
    "silu_and_mul_bf16": (
        f"{X_BF16}, %u: tensor<5x96xbf16>",
        "ad.silu_and_mul %x, %u : (tensor<5x96xbf16>, tensor<5x96xbf16>) -> tensor<5x96xbf16>",
        2,
    ),
    "silu_and_mul_f32": (
        "%x: tensor<5x7xf32>, %u: tensor<5x7xf32>",
        "ad.silu_and_mul %x, %u : (tensor<5x7xf32>, tensor<5x7xf32>) -> tensor<5x7xf32>",
        0,
    ),
    **{
        # gelu, then the product: two bf16 roundings; an intermediate size of 200 and one like
        # Llama-7B's 2752-wide shards (neither a power of two)
        f"gelu_{name}_and_mul_{element}_{shape}": (
            f"%x: tensor<{shape}x{element}>, %u: tensor<{shape}x{element}>",
            f"ad.gelu_and_mul %x, %u{approximate} : (tensor<{shape}x{element}>, tensor<{shape}x{element}>) -> "
            f"tensor<{shape}x{element}>",
            2 if element == "bf16" else 0,
        )
        for name, approximate in (("tanh", ' approximate "tanh"'), ("erf", ""))
        for element, shape in (("bf16", "3x200"), ("f32", "5x7"), ("bf16", "2x2752"))
    },
    **{
        # the activation rounds once in bf16 (the kernel tests make the bias add exact: _kernel_inputs)
        f"activation_{kind}{'_bias' if bias else ''}_{element}": (
            f"%x: tensor<3x200x{element}>" + (f", %b: tensor<200x{element}>" if bias else ""),
            f'ad.activation "{kind}" %x' + (" bias %b" if bias else "")
            + f" : (tensor<3x200x{element}>" + (f", tensor<200x{element}>" if bias else "")
            + f") -> tensor<3x200x{element}>",
            1 if element == "bf16" else 0,
        )
        for kind in ad.ACTIVATIONS
        for bias, element in ((True, "bf16"), (False, "f32"))
    },
}


def _op(case: str) -> ad.KernelOp:
    args, text, _ = CASES[case]
    return _parse_op(args, text)


def _parse_op(args: str, text: str) -> ad.KernelOp:
    """The op, parsed inside a function whose arguments are `args`."""
    module: ModuleOp = Parser(make_context(), f"func.func @f({args}) {{\n  {text}\n  func.return\n}}").parse_module()
    return next(op for op in module.walk() if isinstance(op, ad.KernelOp))


def _inputs(op: ad.KernelOp) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [
        torch.randn(v.type.get_shape(), generator=generator).to(torch_dtype(v.type)) * 2 for v in op.operands
    ]


def _kernel_inputs(op: ad.KernelOp) -> list[torch.Tensor]:
    """`_inputs`, but an activation's input and bias are eighths below 16 in magnitude, so
    that their sum is exact in bf16: the interpreter's truncating conversion to bf16
    (DESIGN.md) would otherwise move the activation's input by an ulp, which an activation
    can magnify without bound relative to its output (GELU where it nears 0 on the left).
    The decomposition test checks the rounding of the sum with general inputs."""
    inputs = _inputs(op)
    if isinstance(op, ad.ActivationOp) and op.bias is not None:
        inputs = [(t.float() * 4).round().clamp(-63, 63).div(8).to(t.dtype) for t in inputs]
    return inputs


@pytest.mark.parametrize("case", sorted(CASES))
def test_decomposition_is_the_reference(case: str) -> None:
    op = _op(case)
    inputs = _inputs(op)
    reference = run_op(op, inputs)
    region = kernel_region(op).region
    decomposed = run_block(region.body.block, inputs)
    assert len(decomposed) == len(reference)
    for got, expected in zip(decomposed, reference, strict=True):
        assert got.dtype == expected.dtype and torch.equal(got, expected)


@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_matches_the_reference(case: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    op = _op(case)
    inputs = _kernel_inputs(op)
    kernel = region_kernel(op, KernelCache(tmp_path))
    assert kernel.name.startswith(op.kernel_label() + "_")
    with kernels_ran(monkeypatch):
        got = kernel.run(*kernel.split_inputs(inputs))
    roundings = CASES[case][2]
    for out, expected in zip(got, run_op(op, inputs), strict=True):
        assert out.dtype == expected.dtype and out.shape == expected.shape
        torch.testing.assert_close(out.float(), expected.float(), rtol=1.3e-6 + roundings * 2.0**-7, atol=1e-5)


def test_add_layer_norm_kernel_bf16_normalizes_the_sum_it_writes(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 add + LayerNorm: the sum is rounded to bf16 before it is normalized (as in torch).
    The interpreter truncates that rounding (one bf16 ulp of the sum), and centering turns it
    into an absolute error of up to an ulp of max|sum| / std on every output, not a relative
    one. So each result is checked against the reference of its own input: the sum against
    `x + r` (one rounding), the normalized value against the reference LayerNorm of the sum
    the kernel wrote (the output's own rounding)."""
    args = "%x: tensor<5x96xbf16>, %r: tensor<5x96xbf16>, %w: tensor<96xbf16>, %b: tensor<96xbf16>"
    op = _parse_op(args, "ad.add_layer_norm %x, %r weight %w bias %b eps 1.0e-05 : (tensor<5x96xbf16>, "
                   "tensor<5x96xbf16> weight tensor<96xbf16> bias tensor<96xbf16>) -> (tensor<5x96xbf16>, "
                   "tensor<5x96xbf16>)")
    x, r, w, b = inputs = _inputs(op)
    kernel = region_kernel(op, KernelCache(tmp_path))
    with kernels_ran(monkeypatch):
        normed, total = kernel.run(*kernel.split_inputs(inputs))
    expected_total = run_op(op, inputs)[1]
    assert normed.dtype == total.dtype == torch.bfloat16
    torch.testing.assert_close(total.float(), expected_total.float(), rtol=2.0**-7, atol=0)
    own = torch.ops.ad_mlir.layer_norm(total, w, b, 1e-5)
    torch.testing.assert_close(normed.float(), own.float(), rtol=1.3e-6 + 2.0**-7, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("affine", ["weight_bias", "none", "weight", "bias", "one_plus_weight", "fp32_weight_bias"])
def test_layer_norm_reference_is_torchs_layer_norm(dtype: torch.dtype, affine: str) -> None:
    """`torch.ops.ad_mlir.layer_norm` (the op's meaning, and what the kernel computes) against
    `F.layer_norm` itself: the same fp32 math and the one rounding at the end; only the order of
    the row sums differs (torch's CPU kernel accumulates its own way). So fp32 agrees to
    torch.testing's tolerance and bf16 to one bf16 rounding (2^-8 relative: both round to
    nearest, so a result on a rounding boundary can go either way). `one_plus_weight` is
    Nemotron's LayerNorm1P: `w + 1` in the weight's dtype is the weight."""
    generator = torch.Generator().manual_seed(1)
    x = (torch.randn(7, 200, generator=generator) * 3 + 1).to(dtype)
    w, b = (torch.randn(200, generator=generator).to(dtype) for _ in range(2))
    weight, bias = {
        "weight_bias": (w, b), "none": (None, None), "weight": (w, None), "bias": (None, b),
        "one_plus_weight": (w + 1, b), "fp32_weight_bias": (w.float(), b.float()),
    }[affine]
    got = torch.ops.ad_mlir.layer_norm(x, weight, bias, 1e-5)
    expected = torch.nn.functional.layer_norm(x, (200,), weight, bias, 1e-5)
    assert got.dtype == expected.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(got, expected)
    else:
        torch.testing.assert_close(got.float(), expected.float(), rtol=2.0**-8, atol=1e-5)


ROPE = (
    "%q: tensor<2x4x5x{d}x{t}>, %k: tensor<2x2x5x{d}x{t}>, %c: tensor<1x5x{r}x{t}>, %s: tensor<1x5x{r}x{t}>",
    "ad.rope %q, %k rope %c, %s{pairs} : (tensor<2x4x5x{d}x{t}>, tensor<2x2x5x{d}x{t}>, tensor<1x5x{r}x{t}>, "
    "tensor<1x5x{r}x{t}>) -> (tensor<2x4x5x{d}x{t}>, tensor<2x2x5x{d}x{t}>)",
)


def _rope_op(element: str, head_dim: int = 32, rotary_dim: int | None = None, interleaved: bool = False) -> ad.RopeOp:
    fields = {"t": element, "d": head_dim, "r": rotary_dim or head_dim, "pairs": " interleaved" if interleaved else ""}
    return _parse_op(ROPE[0].format(**fields), ROPE[1].format(**fields))


@pytest.mark.parametrize(("head_dim", "rotary_dim", "interleaved"),
                         [(32, None, False), (80, None, False), (80, 32, False), (32, 8, False), (80, 20, False),
                          (32, None, True), (96, 48, True)])
@pytest.mark.parametrize("element", ["f32", "bf16"])
def test_rope_kernel_matches_the_reference(element: str, head_dim: int, rotary_dim: int | None, interleaved: bool,
                                           tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The RoPE template on q and k (cos/sin of batch 1, broadcast; q/k transposed views, as HF
    makes them), at head dims that are not powers of two, partial rotary and interleaved pairs.
    The reference rounds each of `x * cos`, `rotate(x) * sin` and their sum to the dtype; the
    kernel rounds the fp32 result once (truncating in the interpreter). The terms are at most
    max|x| (|cos|, |sin| <= 1), so in bf16 the difference is at most three bf16 ulps of max|x|
    (3 * 2^-7 relative); fp32 agrees to torch.testing's tolerance; the dims past the rotary dim
    pass unchanged (exactly)."""
    op = _rope_op(element, head_dim, rotary_dim, interleaved)
    dtype = torch_dtype(op.query.type)
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2, 5, 4, head_dim, generator=generator).to(dtype).transpose(1, 2)
    k = torch.randn(2, 5, 2, head_dim, generator=generator).to(dtype).transpose(1, 2)
    angles = torch.randn(1, 5, rotary_dim or head_dim, generator=generator)
    inputs = [q, k, angles.cos().to(dtype), angles.sin().to(dtype)]
    kernel = region_kernel(op, KernelCache(tmp_path))
    assert kernel.name.startswith("rope_")
    with kernels_ran(monkeypatch):
        got = kernel.run(*kernel.split_inputs(inputs))
    for out, expected, x in zip(got, run_op(op, inputs), (q, k), strict=True):
        assert out.dtype == expected.dtype and out.shape == expected.shape and out.is_contiguous()
        if dtype == torch.float32:
            torch.testing.assert_close(out, expected)
        else:
            atol = 3 * 2.0**-7 * x.float().abs().max().item()
            torch.testing.assert_close(out.float(), expected.float(), rtol=0, atol=atol)
        passed = rotary_dim or head_dim
        assert torch.equal(out[..., passed:], x[..., passed:])


def _hf_module(family: str):  # noqa: ANN202 (a transformers modeling module)
    import importlib

    return importlib.import_module(f"transformers.models.{family}.modeling_{family}")


def _tables(rotary: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's cos/sin [2, 5, rotary] (cat(freqs, freqs), as GLM and Ernie 4.5 also build them) at
    positions that differ per batch row."""
    positions = torch.arange(5.0)[None, :] * torch.tensor([[1.0], [3.0]])
    freqs = positions[..., None] * 10000.0 ** (-torch.arange(0, rotary, 2) / rotary)
    emb = torch.cat((freqs, freqs), -1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


HF_ROPES = [
    (family, rotary, dtype)
    for family, rotary in (("llama", 32), ("gpt_neox", 8), ("phi3", 32), ("glm", 16), ("ernie4_5", 32))
    # Ernie 4.5 rotates in fp32 and casts back: in bf16 that is another spelling (not matched).
    for dtype in (torch.float32, torch.bfloat16) if family != "ernie4_5" or dtype == torch.float32
]


@pytest.mark.parametrize(("family", "rotary_dim", "dtype"), HF_ROPES,
                         ids=[f"{f}-{str(t)[6:]}" for f, _, t in HF_ROPES])
def test_rope_reference_is_hf(family: str, rotary_dim: int, dtype: torch.dtype) -> None:
    """`ad.rope`'s torch reference computes exactly what the family's own apply_rotary_pos_emb
    does (bit for bit, also in bf16: the same ops in the same dtype): full (Llama), partial
    (GPT-NeoX's 8 of 32, Phi-3's slice of all), interleaved pairs with GLM's partial rotary and
    Ernie 4.5's full; GLM and Ernie take the first half of HF's table and repeat_interleave it,
    which is what the op's tables are (`ad.RopeAttentionOp`)."""
    from ad_mlir.semantics import torch_ops

    generator = torch.Generator().manual_seed(1)
    q, k = (torch.randn(2, h, 5, 32, generator=generator).to(dtype) for h in (4, 2))
    cos, sin = _tables(rotary_dim, dtype)
    expected = _hf_module(family).apply_rotary_pos_emb(q, k, cos, sin)
    interleaved = family in ("glm", "ernie4_5")
    if interleaved:  # what HF multiplies x by: the first half of each table, each entry twice
        cos, sin = (t[..., : rotary_dim // 2].repeat_interleave(2, -1) for t in (cos, sin))
    got = torch_ops.rope(q, k, cos, sin, interleaved)
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == e.dtype and torch.equal(g, e)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rope_reference_is_gptj(dtype: torch.dtype) -> None:
    """GPT-J rotates [b, s, h, d] with its half tables (sin, cos [b, s, R/2]) repeat_interleaved,
    then concatenates the dims past rotary_dim: the reference on the transposed tensors, with the
    repeated tables and `interleaved`, gives the same bits."""
    from ad_mlir.semantics import torch_ops

    gptj = _hf_module("gptj")
    generator = torch.Generator().manual_seed(2)
    q, k = (torch.randn(2, 5, 4, 32, generator=generator).to(dtype) for _ in range(2))
    sincos = gptj.create_sinusoidal_positions(16, 16)[torch.tensor([[0, 1, 2, 3, 4], [3, 5, 7, 9, 11]])].to(dtype)
    sin, cos = torch.split(sincos, 8, dim=-1)
    expected = [torch.cat([gptj.apply_rotary_pos_emb(x[..., :16], sin, cos), x[..., 16:]], -1) for x in (q, k)]
    tables = [t.repeat_interleave(2, -1) for t in (cos, sin)]
    got = torch_ops.rope(q.transpose(1, 2), k.transpose(1, 2), *tables, True)
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g.transpose(1, 2), e)


def test_a_compiled_graph_calling_multi_result_reference_ops_imports() -> None:
    """The reference ops of ops with several results (add_rms_norm, quantize_fp8_dynamic) import
    as those ops, not as opaque calls, and evaluate as torch does."""

    class Calls(torch.nn.Module):
        def forward(self, x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
            normed, total = torch.ops.ad_mlir.add_rms_norm(x, r, w, 1e-6)
            q, scale = torch.ops.ad_mlir.quantize_fp8_dynamic(normed, True)
            return q, scale, total

    args = (torch.randn(3, 16), torch.randn(3, 16), torch.randn(16))
    program = import_program(torch.export.export(Calls(), args))
    names = [op.name for op in program.function.body.block.ops]
    assert "ad.add_rms_norm" in names and "ad.quantize_fp8_dynamic" in names, names
    for got, want in zip(evaluate(program.module, program.weights, list(args)), Calls()(*args), strict=True):
        assert torch.equal(got.float(), want.float())


def test_a_compiled_graph_calling_mlp_activation_reference_ops_imports() -> None:
    """`torch.ops.ad_mlir.gelu_and_mul` / `.activation` import as their ops, with their
    approximation and kind, and evaluate as torch does."""

    class Calls(torch.nn.Module):
        def forward(self, g: torch.Tensor, u: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (torch.ops.ad_mlir.gelu_and_mul(g, u, "tanh"), torch.ops.ad_mlir.activation(g, b, "relu2"),
                    torch.ops.ad_mlir.activation(u, None, "gelu"))

    args = (torch.randn(3, 16), torch.randn(3, 16), torch.randn(16))
    program = import_program(torch.export.export(Calls(), args))
    ops = [op for op in program.function.body.block.ops if isinstance(op, ad.KernelOp)]
    assert [op.kernel_label() for op in ops] == ["gelu_tanh_and_mul", "bias_relu2", "gelu"]
    for got, want in zip(evaluate(program.module, program.weights, list(args)), Calls()(*args), strict=True):
        assert torch.equal(got, want)


def _with_special_values(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The first input with NaN, +-inf and a huge value (its square overflows) in its first rows."""
    x = inputs[0].clone()
    flat = x.view(x.shape[0], -1)
    for i, value in enumerate((float("nan"), float("inf"), -float("inf"), 3e38)):
        flat[i % len(flat), i] = value
    return [x, *inputs[1:]]


def _dynamic_rows(case: str) -> ad.KernelOp:
    args, text, _ = CASES[case]
    rows = args.split("tensor<")[1].split("x")[0]
    return _parse_op(args.replace(f"tensor<{rows}x", "tensor<?x"), text.replace(f"tensor<{rows}x", "tensor<?x"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_keeps_nan_inf_and_huge_values_like_the_reference(case: str, tmp_path) -> None:
    """A row holding NaN, inf or a value whose square overflows comes out as the reference's
    (NaN where torch has NaN), and the other rows are untouched by it."""
    op = _op(case)
    inputs = _with_special_values(_kernel_inputs(op))
    kernel = region_kernel(op, KernelCache(tmp_path))
    got = kernel.run(*kernel.split_inputs(inputs))
    roundings = CASES[case][2]
    for out, expected in zip(got, _special_values_reference(op, inputs), strict=True):
        torch.testing.assert_close(out.float(), expected.float(), rtol=1.3e-6 + roundings * 2.0**-7, atol=1e-5,
                                   equal_nan=True)


def _special_values_reference(op: ad.KernelOp, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The reference, except for erf GELU, which runs in float64 (then cast): torch's vectorized
    CPU erf-GELU gives NaN for +inf and inf for values near the float max, where its scalar
    path, float64 and the math give inf and the value itself (as the kernel does)."""
    erf_gelu = (isinstance(op, ad.GeluAndMulOp) and op.kernel_label() == "gelu_and_mul") or (
        isinstance(op, ad.ActivationOp) and op.kind.data == "gelu")
    if not erf_gelu:
        return run_op(op, inputs)
    wide = run_op(op, [t.double() for t in inputs])
    return [r.to(torch_dtype(v.type)) for r, v in zip(wide, op.results, strict=True)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_with_zero_rows_returns_empty_results(case: str, tmp_path) -> None:
    op = _dynamic_rows(case)
    inputs = [t[:0] if t.dim() > 1 else t for t in _inputs(_op(case))]
    kernel = region_kernel(op, KernelCache(tmp_path))
    for out, expected in zip(kernel.run(*kernel.split_inputs(inputs)), run_op(op, inputs), strict=True):
        assert out.shape == expected.shape and out.shape[0] == 0 and out.dtype == expected.dtype


def test_rope_kernel_with_zero_tokens_and_special_values(tmp_path) -> None:
    """The RoPE template with a dynamic sequence: no tokens gives empty results; NaN and inf in q
    come out where the reference has them."""
    fields = {"t": "f32", "d": 32, "r": 32, "pairs": ""}
    op = _parse_op(ROPE[0].format(**fields).replace("5x32", "?x32"), ROPE[1].format(**fields).replace("5x32", "?x32"))
    kernel = region_kernel(op, KernelCache(tmp_path))
    for tokens in (0, 5):
        generator = torch.Generator().manual_seed(tokens)
        q, k = torch.randn(2, 4, tokens, 32, generator=generator), torch.randn(2, 2, tokens, 32, generator=generator)
        angles = torch.randn(1, tokens, 32, generator=generator)
        qk = _with_special_values([q, k]) if tokens else [q, k]
        inputs = [*qk, angles.cos(), angles.sin()]
        for out, expected in zip(kernel.run(*kernel.split_inputs(inputs)), run_op(op, inputs), strict=True):
            assert out.shape == expected.shape
            torch.testing.assert_close(out, expected, equal_nan=True)
