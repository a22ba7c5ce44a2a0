"""Generated kernels against eager on the cases that break naive codegen: rows longer than one
tile, odd row lengths (padding lanes must not reach a reduction), NaN in a max, strided and
broadcast inputs, integer and boolean math, and empty inputs. Kernels run in the Triton
interpreter (tests/conftest.py); the shared guard (tests/kernel_guard.py) proves they ran.

fp32 tolerances are torch.testing's defaults: the kernels compute in fp32 like eager and only
change the order of a row's sum."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from kernel_guard import graph_kernels, kernel_calls, kernels_ran

import ad_mlir


@pytest.fixture(autouse=True)
def kernels_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every region runs its Triton kernel: no reference semantics, no op left as torch calls."""
    with kernels_ran(monkeypatch):
        yield


class Fn(torch.nn.Module):
    def __init__(self, fn: Callable[..., torch.Tensor]):
        super().__init__()
        self.fn = fn

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.fn(*args)


def _compiled(fn: Callable[..., torch.Tensor], *args: torch.Tensor, dynamic_rows: bool = False):
    # forward(*args) takes one tuple: its dynamic shapes are one tuple too.
    shapes = ((({0: torch.export.Dim("rows")},) + (None,) * (len(args) - 1)),) if dynamic_rows else None
    ep = torch.export.export(Fn(fn), args, dynamic_shapes=shapes)
    gm = ad_mlir.compile(ep)
    graph_kernels(gm)
    return gm


def _rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def test_softmax_over_rows_longer_than_one_tile() -> None:
    x = torch.randn(3, 10000) * 4
    gm = _compiled(lambda t: torch.softmax(t, -1), x)
    torch.testing.assert_close(gm(x)[0], torch.softmax(x, -1))


def test_pointwise_over_rows_longer_than_one_tile() -> None:
    """A pointwise kernel tiles a long row in power-of-2 blocks of at most POINTWISE_TILE columns."""
    x = torch.randn(2, 3000)
    fn = lambda t: torch.exp(t) * 2 - t  # noqa: E731
    torch.testing.assert_close(_compiled(fn, x)(x)[0], fn(x))


@pytest.mark.parametrize("hidden", [1, 5, 96, 100, 2688])
def test_rmsnorm_at_odd_row_lengths(hidden: int) -> None:
    """exp/rsqrt/+eps map a padding lane's 0 to non-zero: only a masked reduction is right."""
    x, w = torch.randn(7, hidden) + 0.5, torch.randn(hidden)
    gm = _compiled(_rmsnorm, x, w)
    torch.testing.assert_close(gm(x, w)[0], _rmsnorm(x, w))
    s = torch.randn(7, hidden)
    sm = _compiled(lambda t: torch.softmax(t, -1), s)
    torch.testing.assert_close(sm(s)[0], torch.softmax(s, -1))


def test_amax_keeps_nan_like_torch() -> None:
    x = torch.randn(4, 33)
    x[1, 7] = float("nan")
    fn = lambda t: t - t.amax(-1, keepdim=True)  # noqa: E731
    got = _compiled(fn, x)(x)[0]
    torch.testing.assert_close(got, fn(x), equal_nan=True)
    assert got[1].isnan().all() and not got[0].isnan().any()


def test_strided_and_broadcast_inputs_are_read_in_place() -> None:
    """A transposed graph input, a per-row and a per-column input, a scalar tensor."""
    x = torch.randn(16, 12).t()  # 12 x 16, column-major
    row, col, s = torch.randn(12, 1), torch.randn(16), torch.tensor(0.5)
    fn = lambda a, r, c, k: (a * r + c).sigmoid() - k  # noqa: E731
    gm = _compiled(fn, torch.randn(12, 16), row, col, s)
    assert not x.is_contiguous()
    torch.testing.assert_close(gm(x, row, col, s)[0], fn(x, row, col, s))


def test_integer_and_boolean_math() -> None:
    a, b = torch.randint(-50, 50, (5, 9)), torch.randn(5, 9)
    fn = lambda i, f: torch.where((i > 0) & (f < 0.5), i * 3 - 1, (f * 10).to(torch.int64))  # noqa: E731
    got = _compiled(fn, a, b)(a, b)[0]
    assert got.dtype == torch.int64
    torch.testing.assert_close(got, fn(a, b), rtol=0, atol=0)


def test_cat_along_rows_then_elementwise() -> None:
    """torch.cat's default dim is 0: the kernel after it must see the rows of both inputs."""
    a, b = torch.randn(2, 4), torch.randn(3, 4)
    fn = lambda x, y: torch.exp(torch.cat([x, y]))  # noqa: E731
    torch.testing.assert_close(_compiled(fn, a, b)(a, b)[0], fn(a, b))


def test_bf16_output_is_cast_at_the_store() -> None:
    """bf16 in and out: fp32 inside, one rounding at the store (the interpreter's truncates),
    so at most one bf16 ulp (2^-7 relative) from eager, which rounds after every op."""
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    fn = lambda t: torch.nn.functional.gelu(t, approximate="tanh") * 1.5 + t  # noqa: E731
    got = _compiled(fn, x)(x)[0]
    assert got.dtype == torch.bfloat16
    exact = fn(x.float())
    torch.testing.assert_close(got.float(), exact, rtol=2**-7, atol=1e-5)


def test_bf16_stores_round_to_nearest_within_nearest_bf16_rounding() -> None:
    """The interpreter truncates fp32 -> bf16 stores (toward zero, DESIGN.md); within
    `nearest_bf16_rounding` it rounds them to nearest even as compiled kernels do: bit for bit
    torch's conversion of the same fp32 values, and back to truncating after it."""
    from ad_mlir.codegen.interpreter import nearest_bf16_rounding

    x = torch.randn(8, 64)
    fn = lambda t: (t * 3.0).to(torch.bfloat16)  # noqa: E731 (exact-ish fp32 product, one rounding)
    gm = _compiled(fn, x)
    nearest, toward_zero = fn(x), ((x * 3.0).view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)
    assert not torch.equal(nearest, toward_zero)
    with nearest_bf16_rounding():
        assert torch.equal(gm(x)[0], nearest)
    assert torch.equal(gm(x)[0], toward_zero)


def test_zero_rows_launch_nothing() -> None:
    x, w = torch.randn(4, 32), torch.randn(32)
    gm = _compiled(_rmsnorm, x, w, dynamic_rows=True)
    empty = torch.randn(0, 32)
    out = gm(empty, w)[0]
    assert out.shape == (0, 32)
    torch.testing.assert_close(gm(x, w)[0], _rmsnorm(x, w))


def test_compiled_graph_exports_again() -> None:
    """The kernel ops have fake implementations: a compiled graph is itself `torch.export`-able
    (dynamic rows included) and the re-exported program runs the same kernels."""
    x, w = torch.randn(6, 48), torch.randn(48)
    gm = _compiled(_rmsnorm, x, w, dynamic_rows=True)
    again = torch.export.export(gm, (x, w), dynamic_shapes=({0: torch.export.Dim("rows")}, None))
    assert kernel_calls(again.graph_module) == kernel_calls(gm)
    longer = torch.randn(11, 48)
    torch.testing.assert_close(again.module()(longer, w)[0], _rmsnorm(longer, w))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
def test_integer_min_and_max_over_rows_longer_than_one_tile(dtype: torch.dtype) -> None:
    """A looped row reduction starts from the dtype's extreme, its neutral element: positive rows
    keep a min above 0, negative rows a max below 0, a row holding the extremes keeps them, and a
    row within 1000 of the dtype's lowest value keeps its max there (any neutral above it would win)."""
    x = torch.randint(1, 1000, (4, 10000), dtype=dtype)
    x[1] = -x[1]
    x[2, 7], x[2, 9000] = torch.iinfo(dtype).max, torch.iinfo(dtype).min
    x[3] += torch.iinfo(dtype).min
    gm = _compiled(lambda t: (t.amin(-1, keepdim=True), t.amax(-1, keepdim=True)), x)
    low, high = gm(x)
    assert torch.equal(low, x.amin(-1, keepdim=True)) and torch.equal(high, x.amax(-1, keepdim=True))


def test_a_region_of_zero_dim_tensors() -> None:
    """0-d inputs and output: the kernel's domain is one element, written once."""
    a, b = torch.tensor(1.5), torch.tensor(-0.25)
    gm = _compiled(lambda x, y: torch.exp(x) * y + 1, a, b)
    torch.testing.assert_close(gm(a, b)[0], torch.exp(a) * b + 1)
