"""Property tests: random elementwise programs, compiled with the default pipeline, match eager.

Hypothesis draws small programs (unary and binary ops with Python-scalar, 0-d and broadcast
operands, compares and `where`, bool logic, float/int/bool casts, last-dim keepdim row
reductions and softmax, values used several times, several outputs), builds each as an
`nn.Module`, exports it with `torch.export` and compiles it with `ad_mlir.compile`. Every fused
region then runs as its generated Triton kernel (in the Triton interpreter on CPU, see conftest;
a region that fell back to its torch reference fails the test) and must match eager PyTorch on
the same inputs. Inputs are also passed transposed, sliced or expanded (stride 0), or viewed
inside the graph, and some programs are exported with a dynamic leading dim and run at a second
size too. Besides the random mix, each case runs in a few random programs of its own, and RMSNorm
and softmax (rows up to 8200: the looped row kernel) in programs of their own.

No NaN or inf by construction: the generator keeps an interval per value and inserts
`abs(x) + 0.5` before log/sqrt/rsqrt/reciprocal/a divisor, and `tanh(x)` where a result could
pass CAP (exp, products, sums).

Tolerances. A program that touches only float32 is compared with eager by torch.testing's
defaults: both compute each op in fp32 and differ only in the last ulp of transcendental
functions and in the order of row sums. A program that touches bfloat16 or float16 anywhere is
compared with the truth instead: eager rounds after every op while the kernel keeps fp32 between
ops and rounds once at each store, so the two differ by a few narrow ulps, amplified by whatever
follows (a difference of near-equal values, a row sum). The truth is the same program in float64
that rounds only where a cast states a precision, as the kernel does: a cast to a narrower float,
and a cast of a value the program holds in a narrow float. The kernel's error from it must stay
within twice eager's largest error (the kernel rounds less often than eager, so its error should
not exceed eager's; the factor 2 covers elements where eager's happens to be smaller, and a
narrow value stored between two kernels), plus what the output's store adds: one ulp of a narrow
output (the interpreter's f32->bf16 conversion truncates, DESIGN.md), or torch.testing's fp32
tolerance. Because the interpreter truncates the casts to bf16 too, the kernel may follow a
second truth that rounds them toward zero. A cast the kernel skips still fails (its error is a
narrow ulp, far above eager's fp32 error around it). Integer and bool results are compared
exactly: the generator derives them only from values that are exact in every evaluation
(inputs, sign flips, max/min, power-of-two scales, compares of those).
"""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

import ad_mlir
from ad_mlir.codegen.cache import KernelCache
from ad_mlir.codegen.templates import region_kernel
from ad_mlir.dialects import ad
from ad_mlir.runtime import kernels
from ad_mlir.semantics import op_table

Shape = tuple[int, ...]

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
"""Where the kernels run: on a GPU, or on CPU in the Triton interpreter (conftest)."""
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
NARROW = (torch.bfloat16, torch.float16)
INTS = (torch.int32, torch.int64)
CAP = 100.0
"""Largest magnitude a value may reach (a sum: CAP per element summed). Keeps fp32 rounding
differences of intermediates below torch.testing's absolute tolerance after cancellation."""
POSITIVE = 0.25
"""Smallest value log, sqrt, rsqrt, reciprocal and a divisor see (keeps them well conditioned)."""
SCALARS = (0.5, -1.5, 2.0, 3.0, -0.25)
"""Python-scalar operands: none is neutral, so canonicalize cannot remove the op they feed."""
EXACT_SCALES = (0.5, 2.0, -0.25, 4.0)
"""Powers of two: multiplying an exact value by them stays exact in every dtype."""
POINTWISE_LAST_DIMS = (5, 33, 2, 8, 3, 1)
ROW_LENGTHS = (17, 96, 5, 100, 3, 1)
"""Odd row lengths: BLOCK_C pads them to a power of two, and padding must not reach a reduction."""
LONG_ROWS = (*ROW_LENGTHS, 8200)
"""8200 > MAX_ROW_BLOCK: the looped row kernel."""


def _examples(n: int) -> settings:
    """`n` examples (AD_MLIR_RANDOM_EXAMPLES overrides, for a longer local search), the same
    ones on every run (derandomized, no example database), no deadline (a cold compile of a
    kernel takes a second). The first failing program is reported as drawn (noted one step a
    line): shrinking it costs minutes of compiles, so it runs only with AD_MLIR_RANDOM_SHRINK=1;
    each failure found so far has its minimal program below as a regression test."""
    phases = [Phase.explicit, Phase.generate]
    if os.environ.get("AD_MLIR_RANDOM_SHRINK"):
        phases.append(Phase.shrink)
    return settings(
        max_examples=int(os.environ.get("AD_MLIR_RANDOM_EXAMPLES", n)),
        deadline=None,
        derandomize=True,
        database=None,
        phases=phases,
        report_multiple_bugs=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# ------------------------------------------------------------------ the programs


@dataclass(frozen=True)
class Input:
    """A graph input: the shape the program computes with, its dtype and values, and how the
    tensor is laid out: "contiguous", passed in as a non-contiguous "arg_transposed",
    "arg_sliced" or "arg_expanded" (stride 0) tensor, or passed contiguous and viewed inside
    the graph ("graph_transposed", "graph_sliced") before the elementwise part."""

    shape: Shape
    dtype: torch.dtype
    layout: str = "contiguous"
    low: float = -3.0
    high: float = 3.0
    dynamic_dim0: bool = False
    """Dim 0 is the domain's dynamic leading dim."""
    sym_sliced_dim: int | None = None
    """A dim of size 1 that broadcasts, sliced in the graph from `max(0, 1 - rows)` (rows: the
    dynamic leading dim): torch.export types it `?`, it is 1 at run time (MPT's ALiBi bias)."""


@dataclass(frozen=True)
class Ref:
    """Operand: the value with this index (inputs first, then one per step)."""

    index: int


@dataclass(frozen=True)
class Step:
    """`OPS[op](*args, **kwargs)`; a float or int arg is a Python scalar."""

    op: str
    args: tuple[Ref | float | int, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Program:
    """Inputs, steps (each adds one value) and the values returned."""

    inputs: tuple[Input, ...]
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]
    seed: int
    dtypes: tuple[torch.dtype, ...]
    """Each value's dtype in eager (inputs, then steps)."""
    dynamic_rows: bool = False
    """Export dim 0 of the domain as dynamic, and run at a second size too."""

    @property
    def domain(self) -> Shape:
        return self.inputs[0].shape

    @property
    def narrow(self) -> bool:
        """Whether the program touches bfloat16 or float16 anywhere (else it is compared tightly)."""
        return any(d in NARROW for d in self.dtypes)


def describe(program: Program) -> str:
    """The program one step a line (hypothesis notes it with a failing example)."""
    p = program
    lines = [f"seed={p.seed} narrow={p.narrow} dynamic_rows={p.dynamic_rows} outputs={p.outputs}"]
    lines += [f"  v{i} = input {x.shape} {x.dtype} {x.layout} [{x.low}, {x.high}]"
              + ("" if x.sym_sliced_dim is None else f" sym-sliced on dim {x.sym_sliced_dim}")
              for i, x in enumerate(p.inputs)]
    n = len(program.inputs)
    lines += [f"  v{n + i} = {_step_text(s)}" for i, s in enumerate(program.steps)]
    return "\n".join(lines)


def _step_text(step: Step) -> str:
    args = ", ".join(f"v{a.index}" if isinstance(a, Ref) else repr(a) for a in step.args)
    kwargs = "".join(f", {k}={v}" for k, v in step.kwargs)
    return f"{step.op}({args}{kwargs})"


def _row_reduction(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    return lambda x, **kw: fn(x, -1, keepdim=True, **kw)


OPS: dict[str, Callable[..., Any]] = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal, "sin": torch.sin, "cos": torch.cos,
    "tanh": torch.tanh, "erf": torch.erf, "sigmoid": torch.sigmoid, "silu": F.silu, "relu": torch.relu,
    "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "square": lambda x: torch.pow(x, 2), "pow_half": lambda x: torch.pow(x, 0.5),
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "maximum": torch.maximum, "minimum": torch.minimum,
    "radd": lambda s, x: s + x, "rsub": lambda s, x: s - x,
    "rmul": lambda s, x: s * x, "rdiv": lambda s, x: s / x,
    "gt": torch.gt, "lt": torch.lt, "ge": torch.ge, "le": torch.le, "eq": torch.eq, "ne": torch.ne,
    "where": torch.where, "and": operator.and_, "or": operator.or_, "logical_and": torch.logical_and,
    "logical_or": torch.logical_or, "invert": operator.invert, "logical_not": torch.logical_not,
    "sum": _row_reduction(torch.sum), "mean": _row_reduction(torch.mean),
    "amax": _row_reduction(torch.amax), "amin": _row_reduction(torch.amin),
    "softmax": lambda x, **kw: torch.softmax(x, -1, **kw),
}
"""Step ops; "cast" (`x.to(dtype)`) is handled apart because the float64 truth changes it."""
UNARY = ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh", "erf",
         "sigmoid", "silu", "relu", "gelu", "gelu_tanh", "square", "pow_half")
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum")
SCALAR_LEFT = ("radd", "rsub", "rmul", "rdiv")
COMPARES = ("gt", "lt", "ge", "le", "eq", "ne")
LOGIC = ("and", "or", "logical_and", "logical_or", "invert", "logical_not")
REDUCTIONS = ("amax", "sum", "mean", "amin")
NEEDS_POSITIVE = {"log": 0, "sqrt": 0, "rsqrt": 0, "reciprocal": 0, "pow_half": 0, "div": 1, "rdiv": 1}
"""Op -> the operand that must be >= POSITIVE."""
KEEPS_EXACT = frozenset({"neg", "abs", "relu", "maximum", "minimum", "where", "amax", "amin"})


def _run_step(step: Step, values: Sequence[Any], rounding: str | None, dtypes: Sequence[torch.dtype]) -> Any:
    """One step, as eager runs it (`rounding` None) or in the float64 truth (see `_truth_cast`)."""
    args = [values[a.index] if isinstance(a, Ref) else a for a in step.args]
    kwargs = dict(step.kwargs)
    if step.op == "cast" and rounding is not None:
        return _truth_cast(args[0], dtypes[step.args[0].index], kwargs["dtype"], rounding)
    if step.op == "cast":
        return args[0].to(kwargs["dtype"])
    if rounding is not None:
        kwargs.pop("dtype", None)  # sum/softmax accumulate in float64 in the truth
    return OPS[step.op](*args, **kwargs)


def _truth_cast(x: torch.Tensor, source: torch.dtype, target: torch.dtype, rounding: str) -> torch.Tensor:
    """The truth rounds only where a cast states a precision, bf16 to "nearest" (GPU) or
    "toward_zero" (interpreter): a value the program holds in a narrow float is rounded to it
    (the kernel computed it in fp32), then the cast rounds to its target."""
    if source in NARROW:
        x = _round(x, source, rounding)
    return _round(x, target, rounding) if target.is_floating_point else x.to(target)


def _round(x: torch.Tensor, dtype: torch.dtype, rounding: str) -> torch.Tensor:
    """`x` (float64) rounded to `dtype`, kept in float64."""
    if rounding == "toward_zero" and dtype == torch.bfloat16:
        # As the interpreter converts the kernel's f32 value: drop the low 16 bits.
        return (x.float().view(torch.int32) & -65536).view(torch.float32).double()
    return x.to(dtype).double()


def _view_in_graph(spec: Input, arg: torch.Tensor, rows: int) -> torch.Tensor:
    if spec.sym_sliced_dim is not None:
        k = spec.sym_sliced_dim
        return arg[(slice(None),) * k + (slice(max(0, arg.size(k) - rows), None),)]
    if spec.layout == "graph_transposed":
        return arg.transpose(-1, -2)
    if spec.layout == "graph_sliced":
        return arg[..., 1 : 1 + spec.shape[-1]]
    return arg


class RandomProgram(torch.nn.Module):
    """Runs `program`'s steps in order: as written (`rounding` None), or in float64 (see
    `_run_step`): the truth, or with `every_value` eager's rounding of every value to its
    type done in `rounding`'s mode."""

    def __init__(self, program: Program, rounding: str | None = None, every_value: bool = False):
        super().__init__()
        self.program = program
        self.rounding = rounding
        self.every_value = every_value

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        p = self.program
        rows = _view_in_graph(p.inputs[0], args[0], 0).size(0)  # the domain's leading dim
        values: list[Any] = [_view_in_graph(s, a, rows) for s, a in zip(p.inputs, args, strict=True)]
        for step in p.steps:
            value = _run_step(step, values, self.rounding, p.dtypes)
            if self.every_value and p.dtypes[len(values)] in NARROW:
                value = _round(value, p.dtypes[len(values)], self.rounding)
            values.append(value)
        return tuple(values[i] for i in p.outputs)


# -------------------------------------------------------------------- the inputs


def _argument_shape(spec: Input, rows: int | None) -> Shape:
    """The shape of the tensor passed for `spec` (before any in-graph view); `rows` replaces
    dim 0 of the domain (dynamic runs)."""
    shape = list(spec.shape)
    if rows is not None and spec.dynamic_dim0:
        shape[0] = rows
    if spec.layout == "graph_transposed":
        shape[-1], shape[-2] = shape[-2], shape[-1]
    if spec.layout == "graph_sliced":
        shape[-1] += 3
    return tuple(shape)


def _make_input(spec: Input, gen: torch.Generator, rows: int | None) -> torch.Tensor:
    shape = list(_argument_shape(spec, rows))
    if spec.layout == "arg_transposed":
        shape[-1], shape[-2] = shape[-2], shape[-1]
    if spec.layout == "arg_sliced":
        shape[-1] += 3
    if spec.layout == "arg_expanded":
        shape[_expanded_dim(spec.shape)] = 1
    base = torch.rand(shape, generator=gen, dtype=torch.float64) * (spec.high - spec.low) + spec.low
    base = base.to(spec.dtype).to(DEVICE)
    if spec.layout == "arg_transposed":
        return base.transpose(-1, -2)
    if spec.layout == "arg_sliced":
        return base[..., 2 : 2 + spec.shape[-1]]
    if spec.layout == "arg_expanded":
        return base.expand(_argument_shape(spec, rows))
    return base


def _expanded_dim(shape: Shape) -> int:
    return max(range(len(shape)), key=lambda d: shape[d])


def _inputs(program: Program, rows: int | None = None) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(program.seed + (rows or 0))
    return [_make_input(spec, gen, rows) for spec in program.inputs]


def _truth_inputs(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [t.double() if t.is_floating_point() else t for t in inputs]


# ------------------------------------------------------------------ the generator


@dataclass
class _Value:
    meta: torch.Tensor
    """The value on the meta device: its shape and dtype."""
    low: float
    high: float
    exact: bool
    """Bit-identical in eager, in the kernel and in the float64 truth."""

    @property
    def kind(self) -> str:
        if self.meta.dtype == torch.bool:
            return "bool"
        return "float" if self.meta.dtype.is_floating_point else "int"

    @property
    def magnitude(self) -> float:
        return max(abs(self.low), abs(self.high))


Interval = tuple[float, float]


def _interval(op: str, bounds: list[Interval], kwargs: dict[str, Any], n_cols: int) -> Interval:
    """An interval holding every result of `op` on operands in `bounds` (ends computed in
    float64 math: the margins of POSITIVE and CAP absorb their rounding)."""
    (lo, hi), *rest = bounds
    increasing: dict[str, Callable[[float], float]] = {
        "exp": math.exp, "log": math.log, "sqrt": math.sqrt, "pow_half": math.sqrt, "tanh": math.tanh,
        "erf": math.erf, "sigmoid": lambda x: 0.5 * (1 + math.tanh(x / 2)), "relu": lambda x: max(x, 0.0),
        "cast": lambda x: float(math.trunc(x)) if kwargs["dtype"] in INTS else x,
        "mean": lambda x: x, "amax": lambda x: x, "amin": lambda x: x, "sum": lambda x: x * n_cols,
    }
    decreasing: dict[str, Callable[[float], float]] = {"neg": lambda x: -x, "rsqrt": lambda x: x**-0.5,
                                                      "reciprocal": lambda x: 1 / x}
    if op == "cast" and kwargs["dtype"] == torch.bool:
        return 0.0, 1.0
    if op in increasing:
        return increasing[op](lo), increasing[op](hi)
    if op in decreasing:
        return decreasing[op](hi), decreasing[op](lo)
    if op in ("sin", "cos"):
        return -1.0, 1.0
    if op in ("silu", "gelu", "gelu_tanh"):  # silu >= -0.279, gelu >= -0.17 (both approximations)
        return -0.3, max(hi, 0.0)
    if op in ("abs", "square"):
        a, b = (lo, hi) if lo >= 0 else (-hi, -lo) if hi <= 0 else (0.0, max(-lo, hi))
        return (a, b) if op == "abs" else (a * a, b * b)
    if op in COMPARES + LOGIC + ("softmax",):
        return 0.0, 1.0
    if op == "where":
        return min(rest[0][0], rest[1][0]), max(rest[0][1], rest[1][1])
    if op in ("maximum", "minimum"):
        f = max if op == "maximum" else min
        return f(lo, rest[0][0]), f(hi, rest[0][1])
    if op == "rsub":
        return lo - rest[0][1], hi - rest[0][0]
    if op in SCALAR_LEFT:  # s + x, s * x, s / x: as x + s, x * s, s * (1 / x)
        return _interval(op[1:], [rest[0], (lo, hi)], {}, n_cols)
    (olo, ohi) = rest[0]
    if op in ("add", "sub"):
        alpha = kwargs.get("alpha", 1.0) * (1 if op == "add" else -1)
        olo, ohi = sorted((alpha * olo, alpha * ohi))
        return lo + olo, hi + ohi
    if op == "div":
        olo, ohi = 1 / ohi, 1 / olo
    ends = [a * b for a in (lo, hi) for b in (olo, ohi)]
    return min(ends), max(ends)


@dataclass
class _Builder:
    """Builds a program step by step, keeping every value in its ops' domains."""

    inputs: list[Input]
    floats: tuple[torch.dtype, ...] = FLOATS
    """Float dtypes the program may cast to (float32 alone: the program is compared tightly)."""
    values: list[_Value] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)

    def __post_init__(self) -> None:
        for spec in self.inputs:
            meta = torch.empty(spec.shape, dtype=spec.dtype, device="meta")
            self.values.append(_Value(meta, spec.low, spec.high, exact=True))

    def candidates(self, kind: str | tuple[str, ...], exact: bool = False, min_rank: int = 0) -> list[int]:
        kinds = (kind,) if isinstance(kind, str) else kind
        return [
            i for i, v in enumerate(self.values)
            if v.kind in kinds and (v.exact or not exact) and v.meta.dim() >= min_rank
        ]

    def pick(
        self, draw: st.DrawFn, kind: str | tuple[str, ...], exact: bool = False, min_rank: int = 0
    ) -> Ref:
        return Ref(draw(st.sampled_from(self.candidates(kind, exact, min_rank))))

    def emit(self, op: str, args: Sequence[Ref | float | int], **kwargs: Any) -> Ref:
        """Append `op(args)`, first squashing (tanh) operands whose result could pass CAP and
        making the operand that needs it >= POSITIVE."""
        args = list(args)
        while True:
            if op in NEEDS_POSITIVE:
                args[NEEDS_POSITIVE[op]] = self.positive(args[NEEDS_POSITIVE[op]])
            n_cols = self.values[args[0].index].meta.shape[-1] if op in REDUCTIONS else 1
            low, high = _interval(op, [self.bounds(a) for a in args], kwargs, n_cols)
            if max(abs(low), abs(high)) <= CAP * n_cols:
                break
            refs = [a for a in args if isinstance(a, Ref)]
            widest = max(refs, key=lambda a: self.values[a.index].magnitude)
            squashed = self.emit("tanh", [widest])
            args = [squashed if a == widest else a for a in args]
        return self.append(Step(op, tuple(args), tuple(kwargs.items())), low, high)

    def raw(self, op: str, args: Sequence[Ref | float | int], **kwargs: Any) -> Ref:
        """Append `op(args)` as it is (the fixed norm and softmax programs, in domain by design)."""
        return self.append(Step(op, tuple(args), tuple(kwargs.items())), -math.inf, math.inf)

    def append(self, step: Step, low: float, high: float) -> Ref:
        meta = _run_step(step, [v.meta for v in self.values], None, ())
        self.steps.append(step)
        self.values.append(_Value(meta, low, high, self.stays_exact(step.op, step.args, meta)))
        return Ref(len(self.values) - 1)

    def bounds(self, a: Ref | float | int) -> tuple[float, float]:
        if isinstance(a, Ref):
            v = self.values[a.index]
            return v.low, v.high
        return float(a), float(a)

    def positive(self, a: Ref | float) -> Ref | float:
        if not isinstance(a, Ref) or self.values[a.index].low >= POSITIVE:  # scalars are never 0
            return a
        return self.emit("add", [self.emit("abs", [a]), 0.5])

    def stays_exact(self, op: str, args: Sequence[Ref | float | int], meta: torch.Tensor) -> bool:
        refs = [self.values[a.index] for a in args if isinstance(a, Ref)]
        if not all(v.exact for v in refs):
            return False
        if op in KEEPS_EXACT or op in COMPARES + LOGIC:
            return True
        if op in ("mul", "rmul"):
            scalars = [a for a in args if not isinstance(a, Ref)]
            return bool(scalars) and scalars[0] in EXACT_SCALES or all(v.kind != "float" for v in refs)
        if op in ("add", "sub"):  # integer arithmetic
            return all(v.kind != "float" for v in refs) and not meta.dtype.is_floating_point
        if op == "cast":
            return _cast_is_exact(refs[0], meta.dtype)
        return False

    def program(self, outputs: Sequence[int], seed: int, dynamic_rows: bool = False) -> Program:
        dtypes = tuple(v.meta.dtype for v in self.values)
        return Program(tuple(self.inputs), tuple(self.steps), tuple(outputs), seed, dtypes, dynamic_rows)


def _cast_is_exact(source: _Value, target: torch.dtype) -> bool:
    """A cast that every evaluation does alike: to int or bool (of an exact value), to a float
    that holds every value of the source (the interpreter truncates what eager rounds)."""
    if not target.is_floating_point:
        return True
    if source.kind != "float":  # integers up to 2 / eps (the significand's range) are exact
        return source.magnitude <= 2 / torch.finfo(target).eps
    return source.meta.dtype == target or target == torch.float32


Drawer = Callable[[st.DrawFn, _Builder, str], None]
"""Emits one case (an op, or a small idiom such as a round trip) into a program."""


def _draw_unary(draw: st.DrawFn, b: _Builder, op: str) -> None:
    b.emit(op, [b.pick(draw, "float")])


def _alpha(draw: st.DrawFn, b: _Builder, op: str, args: Sequence[Ref | float]) -> dict[str, float]:
    """add/sub take alpha (a float alpha needs a float result)."""
    floats = all(not isinstance(a, Ref) or b.values[a.index].kind == "float" for a in args)
    if op not in ("add", "sub") or not floats:
        return {}
    alpha = draw(st.sampled_from((None, 2.0, -0.5)))
    return {} if alpha is None else {"alpha": alpha}


def _draw_binary(draw: st.DrawFn, b: _Builder, op: str) -> None:
    """Two tensors (any dtypes, broadcast shapes), or a tensor and a Python scalar."""
    x = b.pick(draw, ("float", "int"))
    if op not in ("maximum", "minimum") and draw(st.integers(0, 2)) == 0:
        y: Ref | float = draw(st.sampled_from(SCALARS))
    else:
        y = b.pick(draw, ("float", "int"))
        if op == "div" and b.values[y.index].kind == "int":
            y = b.pick(draw, "float")  # an int divisor could be 0 after the positivity fix
    b.emit(op, [x, y], **_alpha(draw, b, op, [x, y]))


def _draw_scalar_left(draw: st.DrawFn, b: _Builder, op: str) -> None:
    """`s op x` with a Python scalar s (aten's rsub, reciprocal * s, Scalar overloads)."""
    b.emit(op, [draw(st.sampled_from(SCALARS)), b.pick(draw, "float")])


def _draw_mask(draw: st.DrawFn, b: _Builder, compare: str | None = None) -> Ref:
    """An existing bool value, or a new compare of exact values (a compare of inexact values
    may flip between eager and kernel)."""
    masks = b.candidates("bool")
    if compare is None and masks and draw(st.booleans()):
        return Ref(draw(st.sampled_from(masks)))
    x = b.pick(draw, ("float", "int"), exact=True)
    scalar = st.sampled_from((0.0, 0.5, -1.0, 1.0))
    other = draw(st.one_of(scalar, st.just(b.pick(draw, ("float", "int"), exact=True))))
    return b.emit(compare or draw(st.sampled_from(COMPARES)), [x, other])


def _draw_compare(draw: st.DrawFn, b: _Builder, op: str) -> None:
    mask = _draw_mask(draw, b, op)
    if draw(st.booleans()):
        _emit_where(draw, b, mask)


def _draw_where(draw: st.DrawFn, b: _Builder, op: str) -> None:
    _emit_where(draw, b, _draw_mask(draw, b))


def _emit_where(draw: st.DrawFn, b: _Builder, mask: Ref) -> None:
    x = b.pick(draw, ("float", "int"))
    y: Ref | float = b.pick(draw, ("float", "int")) if draw(st.booleans()) else draw(st.sampled_from(SCALARS))
    b.emit("where", [mask, y, x] if draw(st.booleans()) else [mask, x, y])


def _draw_logic(draw: st.DrawFn, b: _Builder, op: str) -> None:
    a = _draw_mask(draw, b)
    b.emit(op, [a] if op in ("invert", "logical_not") else [a, _draw_mask(draw, b)])


def _draw_to_bool(draw: st.DrawFn, b: _Builder, op: str) -> None:
    b.emit("cast", [b.pick(draw, ("float", "int"), exact=True)], dtype=torch.bool)


def _draw_mask_use(draw: st.DrawFn, b: _Builder, op: str) -> None:
    """A mask as a number: `x * mask` (bool promotes) or `mask.to(dtype)`."""
    mask = _draw_mask(draw, b)
    if draw(st.booleans()):
        b.emit("mul", [b.pick(draw, "float"), mask])
    else:
        b.emit("cast", [mask], dtype=draw(st.sampled_from(b.floats)))


def _draw_cast(draw: st.DrawFn, b: _Builder, op: str) -> None:
    x = b.pick(draw, "float")
    targets = [d for d in b.floats if d != b.values[x.index].meta.dtype]
    if targets:
        b.emit("cast", [x], dtype=draw(st.sampled_from(targets)))
    else:
        _draw_int_round_trip(draw, b, op)


def _draw_narrow_round_trip(draw: st.DrawFn, b: _Builder, op: str) -> None:
    """fp32 -> bf16/fp16 -> fp32 (a narrow value goes through fp32 and back to its own type
    first): the kernel must round where the program says, though it computes in fp32 (the
    float64 truth rounds there too)."""
    x = b.pick(draw, "float")
    narrow = b.values[x.index].meta.dtype
    if narrow != torch.float32:
        x = b.emit("cast", [x], dtype=torch.float32)
    else:
        narrow = draw(st.sampled_from(NARROW))
    b.emit("cast", [b.emit("cast", [x], dtype=narrow)], dtype=torch.float32)


def _draw_int_round_trip(draw: st.DrawFn, b: _Builder, op: str) -> None:
    """float -> int (truncates) [-> int arithmetic] [-> float]: of an exact value times 4, so
    the truncation sees the same number in eager, in the kernel and in the truth."""
    x = b.emit("mul", [b.pick(draw, "float", exact=True), 4.0])
    i = b.emit("cast", [x], dtype=draw(st.sampled_from(INTS)))
    if draw(st.booleans()):
        i = b.emit("add", [i, draw(st.sampled_from((3, -2)))])
    if draw(st.booleans()):
        b.emit("cast", [i], dtype=draw(st.sampled_from(b.floats)))


def _draw_reduction(draw: st.DrawFn, b: _Builder, op: str) -> None:
    x = b.pick(draw, "float" if op in ("mean", "softmax") else ("float", "int"), min_rank=1)
    if op in ("sum", "softmax") and b.values[x.index].meta.dtype in NARROW and draw(st.booleans()):
        b.emit(op, [x], dtype=torch.float32)  # a reduction's dtype must survive the import
    else:
        b.emit(op, [x])


POINTWISE_CASES: dict[str, Drawer] = {
    **dict.fromkeys(UNARY, _draw_unary),
    **dict.fromkeys(BINARY, _draw_binary),
    **dict.fromkeys(SCALAR_LEFT, _draw_scalar_left),
    **dict.fromkeys(COMPARES, _draw_compare),
    **dict.fromkeys(LOGIC, _draw_logic),
    "where": _draw_where,
    "to_bool": _draw_to_bool,
    "mask_use": _draw_mask_use,
    "cast": _draw_cast,
    "narrow_round_trip": _draw_narrow_round_trip,
    "int_round_trip": _draw_int_round_trip,
}
ROW_CASES: dict[str, Drawer] = {**POINTWISE_CASES, **dict.fromkeys((*REDUCTIONS, "softmax"), _draw_reduction)}
ROW_WEIGHTED = (*ROW_CASES, *[*REDUCTIONS, "softmax"] * 4)
"""Row programs draw reductions about as often as all the pointwise cases together."""


# ------------------------------------------------------------ shapes and inputs


def _broadcast_shape(draw: st.DrawFn, domain: Shape) -> Shape:
    """A shape that broadcasts to `domain`: its trailing dims, each kept or set to 1 (covers 0-d,
    per-column [C], per-row [..., 1], same-rank [1, 1, C] and rank-2 vs rank-3)."""
    rank = draw(st.integers(0, len(domain)))
    tail = domain[len(domain) - rank :]
    return tuple(d if draw(st.booleans()) else 1 for d in tail)


def _broadcast_dim(spec: Input, domain: Shape) -> int | None:
    """A dim of a contiguous input where it has size 1 and the domain does not."""
    offset = len(domain) - len(spec.shape)
    if spec.layout != "contiguous":
        return None
    return next((k for k, n in enumerate(spec.shape) if n == 1 and domain[k + offset] > 1), None)


def _layout(draw: st.DrawFn, shape: Shape) -> str:
    layouts = ["contiguous", "contiguous", "contiguous"]
    if shape:
        layouts += ["arg_sliced", "graph_sliced"]
    if len(shape) >= 2:
        layouts += ["arg_transposed", "graph_transposed"]
    if any(d > 1 for d in shape):
        layouts.append("arg_expanded")
    return draw(st.sampled_from(layouts))


def _input(draw: st.DrawFn, shape: Shape, dtype: torch.dtype) -> Input:
    low = 0.5 if draw(st.integers(0, 3)) == 0 else -3.0  # some inputs positive as they come
    return Input(shape, dtype, _layout(draw, shape), low, 3.0)


@st.composite
def _domains(draw: st.DrawFn, min_rank: int, last_dims: Sequence[int]) -> Shape:
    """Rank min_rank..3: leading dims 1 to 3 (small: the interpreter's cost is per program
    instance), the last from `last_dims`."""
    rank = draw(st.integers(min_rank, 3))
    leading = draw(st.lists(st.integers(1, 3), min_size=rank - 1, max_size=rank - 1))
    return (*leading, draw(st.sampled_from(last_dims)))


@st.composite
def programs(
    draw: st.DrawFn, last_dims: Sequence[int], cases: Sequence[str], required: str | None = None,
    sym_sliced: bool = False,
) -> Program:
    """A random program over a domain with last dim from `last_dims`: 1 to 6 cases drawn from
    `cases` (or `required` last, so that its result is an output), then its last value and up
    to two others as outputs. With `sym_sliced`, the leading dim is dynamic and one more input
    [1, ...] is sym-sliced on it (typed `?`, 1 at run time)."""
    domain = draw(_domains(2 if sym_sliced else 1, last_dims))
    if sym_sliced:
        domain = (max(domain[0], 2), *domain[1:])
    rank = len(domain)
    # Half the programs stay in float32 (compared tightly), half mix the three float types.
    floats = draw(st.sampled_from(((torch.float32,), FLOATS)))
    dtype = draw(st.sampled_from(floats))
    inputs = [_input(draw, domain, dtype)]
    for _ in range(draw(st.integers(0, 3))):
        other = dtype if draw(st.booleans()) else draw(st.sampled_from(floats))
        inputs.append(_input(draw, _broadcast_shape(draw, domain), other))
    if sym_sliced:
        inputs.append(Input((1, *domain[1:]), dtype, "contiguous", sym_sliced_dim=0))
    dynamic_rows = sym_sliced or (rank >= 2 and domain[0] >= 2 and draw(st.integers(0, 3)) == 0)
    inputs = [replace(i, dynamic_dim0=dynamic_rows and len(i.shape) == rank and i.shape[0] > 1)
              for i in inputs]
    if dynamic_rows:
        inputs = [replace(i, sym_sliced_dim=k) if (k := _broadcast_dim(i, domain)) is not None and draw(st.booleans())
                  else i for i in inputs]
    b = _Builder(inputs, floats)
    n = draw(st.integers(1, 6))
    for k in range(n):
        case = required if k == n - 1 and required is not None else draw(st.sampled_from(cases))
        ROW_CASES[case](draw, b, case)
    computed = range(len(inputs), len(b.values))
    extra = draw(st.lists(st.sampled_from(computed), max_size=2, unique=True))
    outputs = [len(b.values) - 1, *(i for i in extra if i != len(b.values) - 1)]
    return b.program(outputs, draw(st.integers(0, 2**16)), dynamic_rows)


@st.composite
def norm_and_softmax_programs(draw: st.DrawFn) -> Program:
    """RMSNorm as HF writes it (optionally after a residual add, whose sum is a second output)
    and last-dim softmax of a scaled, biased input, in fp32, bf16 or fp16; rows up to 8200
    (past MAX_ROW_BLOCK: the looped row kernel)."""
    domain = draw(_domains(2, LONG_ROWS))
    dtype = draw(st.sampled_from(FLOATS))
    inputs = [_input(draw, domain, dtype), Input(domain[-1:], dtype, "contiguous", 0.5, 1.5)]
    if draw(st.booleans()):
        inputs.append(_input(draw, domain, dtype))
    b = _Builder(inputs)
    x, w, residual = Ref(0), Ref(1), (Ref(2) if len(inputs) == 3 else None)
    if residual is not None:
        x = b.raw("add", [x, residual])
    if draw(st.booleans()):
        eps = draw(st.sampled_from((1e-6, 1e-5, 0.1)))
        xf = b.raw("cast", [x], dtype=torch.float32) if dtype != torch.float32 else x
        square = b.raw("square", [xf]) if draw(st.booleans()) else b.raw("mul", [xf, xf])
        normed = b.raw("mul", [xf, b.raw("rsqrt", [b.raw("add", [b.raw("mean", [square]), eps])])])
        normed = b.raw("cast", [normed], dtype=dtype) if dtype != torch.float32 else normed
        out = b.raw("mul", [w, normed])
    else:
        logits = b.raw("mul", [x, draw(st.sampled_from((0.125, 1.0, 3.0)))])
        logits = b.raw("add", [logits, w]) if draw(st.booleans()) else logits
        to_f32 = dtype != torch.float32 and draw(st.booleans())
        out = b.raw("softmax", [logits], **({"dtype": torch.float32} if to_f32 else {}))
    outputs = [out.index] + ([x.index] if residual is not None else [])
    return b.program(outputs, draw(st.integers(0, 2**16)))


# ------------------------------------------------------------ compile, run, compare


def _dynamic_shapes(program: Program) -> tuple[tuple[dict[int, Any] | None, ...]] | None:
    if not program.dynamic_rows:
        return None
    rows = torch.export.Dim("rows", min=2, max=16)
    # forward(*args): one entry, the tuple of the inputs' specs
    return (tuple({_rows_dim(spec): rows} if spec.dynamic_dim0 else None for spec in program.inputs),)


def _rows_dim(spec: Input) -> int:
    """The dim of the passed tensor that is the domain's dim 0."""
    return 1 if spec.layout == "graph_transposed" and len(spec.shape) == 2 else 0


def _compile(program: Program) -> torch.fx.GraphModule:
    ep = torch.export.export(
        RandomProgram(program), tuple(_inputs(program)), dynamic_shapes=_dynamic_shapes(program), strict=False
    )
    return ad_mlir.compile(ep)


@contextmanager
def _kernels_only() -> Iterator[None]:
    """Fail if a region runs its torch reference instead of its Triton kernel."""

    def refuse(*_: object) -> None:
        raise AssertionError("a region ran its reference semantics, not its kernel")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kernels, "run_reference", refuse)
        yield


def _is_kernel(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and str(node.target).startswith(f"{kernels.NAMESPACE}.")


_PASS_THROUGH = frozenset({
    "operator.getitem", "aten.transpose.int", "aten.slice.Tensor", "aten.expand.default",
    "aten.permute.default", "aten.alias.default", "aten.reshape.default", "aten.view.default",
})
"""Calls that only view their first argument (or pick a kernel's output)."""


def _fusible(node: torch.fx.Node) -> bool:
    """A call the `ad` dialect imports as an elementwise op or cast (fuse-elementwise takes them all)."""
    entry = op_table.OVERLOAD_BY_TARGET.get(op_table.target_name(node.target))
    return entry is not None and issubclass(entry[0].op, ad.ElementwiseOp | ad.CastOp)


def _reduces_one_element(node: torch.fx.Node) -> bool:
    """A reduction over a last dim of size 1: fuse-elementwise leaves it (it copies, or widens
    an int sum), so it may be what computes an output."""
    name = op_table.target_name(node.target)
    entry = op_table.OVERLOAD_BY_TARGET.get(name)
    reduction = entry is not None and issubclass(entry[0].op, ad.ReductionOp)
    return reduction and node.args[0].meta["val"].shape[-1] == 1


def _computed_outside_kernels(gm: torch.fx.GraphModule) -> list[str]:
    """Outputs that neither a kernel, nor an input (canonicalize may fold a program away), nor an
    op without an `ad` counterpart produced."""
    (output,) = (n for n in gm.graph.nodes if n.op == "output")
    bad = []
    for node in output.args[0]:
        while node.op == "call_function" and op_table.target_name(node.target) in _PASS_THROUGH:
            node = node.args[0]
        if node.op == "placeholder" or _is_kernel(node):
            continue
        has_ad_op = op_table.target_name(node.target) in op_table.OVERLOAD_BY_TARGET
        if has_ad_op and not _reduces_one_element(node):
            bad.append(node.format_node())
    return bad


def _assert_kernels_compute(gm: torch.fx.GraphModule, inputs: Sequence[torch.Tensor]) -> None:
    FakeTensorProp(gm, FakeTensorMode()).propagate(*inputs)  # shapes for _reduces_one_element
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    unfused = [op_table.target_name(n.target) for n in calls if _fusible(n)]
    assert not unfused, f"elementwise ops left outside every kernel: {unfused}\n{gm.graph}"
    outside = _computed_outside_kernels(gm)
    assert not outside, f"outputs computed without a kernel: {outside}\n{gm.graph}"


def _hands_over_narrow_values(gm: torch.fx.GraphModule) -> bool:
    """Whether a kernel stores a bf16/fp16 value that another op then reads (needs the shapes
    `_assert_kernels_compute` propagated)."""
    return any(
        n.target is operator.getitem and _is_kernel(n.args[0]) and n.meta["val"].dtype in NARROW
        and any(u.op == "call_function" for u in n.users)
        for n in gm.graph.nodes
    )


def _assert_matches(
    program: Program, got: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], truncating: bool
) -> None:
    """`truncating`: kernels hand bf16 values over, which the interpreter truncates where eager
    rounds to nearest; eager as if it truncated then bounds the kernel's error too."""
    with torch.no_grad():
        expected = RandomProgram(program)(*inputs)
        truths = [RandomProgram(program, r)(*_truth_inputs(inputs)) for r in ("nearest", "toward_zero")]
        references = [expected]
        if truncating:
            references.append(RandomProgram(program, "toward_zero", every_value=True)(*_truth_inputs(inputs)))
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        kind, eager_kind = (g.dtype, tuple(g.shape)), (e.dtype, tuple(e.shape))
        assert kind == eager_kind, f"output {i}: {kind}, eager {eager_kind}"
        if not e.is_floating_point():
            assert torch.equal(g, e), f"output {i} (exact {e.dtype}) differs:\n{g}\n{e}"
        elif not program.narrow:
            torch.testing.assert_close(g, e, msg=lambda m, i=i: f"output {i}: {m}")
        else:
            _assert_near_truth(i, g, [r[i].double() for r in references], [t[i].double() for t in truths])


def _assert_near_truth(
    i: int, got: torch.Tensor, eagers: list[torch.Tensor], truths: list[torch.Tensor]
) -> None:
    """Within twice the largest error of eager (`eagers`: eager, and eager as if it truncated)
    from the truth that rounds to nearest, plus what the store may add: one ulp of a narrow
    output type (the interpreter truncates to bf16), or torch.testing's float32 tolerance. The
    kernel may follow either truth (`truths`: nearest, toward zero): the interpreter truncates
    its casts to bf16, a GPU rounds them to nearest."""
    nearest = truths[0]
    error = torch.stack([(got.double() - t).abs() for t in truths]).amin(0)
    eager_error = max((e - nearest).abs().max() for e in eagers)
    if got.dtype in NARROW:
        store = torch.finfo(got.dtype).eps * nearest.abs()
    else:
        store = 1e-5 + 1.3e-6 * nearest.abs()
    allowed = 2 * eager_error + store
    worst = int((error - allowed).flatten().argmax()) if error.numel() else 0
    at = {name: t.flatten()[worst].item() for name, t in
          (("error", error), ("allowed", allowed), ("got", got), ("eager", eagers[0]), ("truth", nearest))}
    assert bool((error <= allowed).all()), f"output {i}, flat index {worst}: {at}"


_CHECKED = [0]
"""Random programs checked so far in this process."""


@pytest.fixture(autouse=True)
def _count_programs(record_property: Callable[[str, object], None]) -> Iterator[None]:
    """Each test reports how many random programs it checked (summed in conftest's summary)."""
    before = _CHECKED[0]
    yield
    record_property("random_programs", _CHECKED[0] - before)


def check_program(program: Program) -> None:
    """Compile `program`, check that kernels compute it, and compare it with eager (and with the
    float64 truth) on its inputs, and at one more row for a dynamic leading dim."""
    _CHECKED[0] += 1
    note(describe(program))
    gm = _compile(program)
    _assert_kernels_compute(gm, _inputs(program))
    truncating = _hands_over_narrow_values(gm)
    for rows in (None, program.domain[0] + 1) if program.dynamic_rows else (None,):
        inputs = _inputs(program, rows)
        with torch.no_grad(), _kernels_only():
            got = gm(*inputs)
        _assert_matches(program, got, inputs, truncating)


# --------------------------------------------------------------------- the tests


@_examples(200)
@given(programs(POINTWISE_LAST_DIMS, tuple(POINTWISE_CASES)))
def test_random_pointwise_programs_match_eager(program: Program) -> None:
    check_program(program)


@_examples(200)
@given(programs(ROW_LENGTHS, ROW_WEIGHTED))
def test_random_row_programs_match_eager(program: Program) -> None:
    check_program(program)


@_examples(40)
@given(programs(ROW_LENGTHS, ROW_WEIGHTED, sym_sliced=True))
def test_operands_typed_dynamic_but_one_at_run_time(program: Program) -> None:
    """The broadcast class of MPT's ALiBi bias: an input typed `?` on the dynamic dim that is 1
    at run time, in random programs (pointwise and row regions, outputs computed from it alone)."""
    check_program(program)


@_examples(80)
@given(norm_and_softmax_programs())
def test_norm_and_softmax_match_eager(program: Program) -> None:
    check_program(program)


@pytest.mark.parametrize("case", sorted(ROW_CASES))
@_examples(10)
@given(data=st.data())
def test_each_case_in_random_programs(case: str, data: st.DataObject) -> None:
    """Every case at least a few times, whatever the random tests above happen to draw."""
    last_dims = ROW_LENGTHS if case in (*REDUCTIONS, "softmax") else POINTWISE_LAST_DIMS
    check_program(data.draw(programs(last_dims, tuple(POINTWISE_CASES), required=case)))


# ------------------------------------------- regressions: failures the random tests found
# Each is the minimal program of one failure, with what the generated kernel did then.


Written = Callable[..., tuple[torch.Tensor, ...]]


class _Written(torch.nn.Module):
    """A regression program, written out as a function."""

    def __init__(self, fn: Written):
        super().__init__()
        self.fn = fn

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.fn(*args)


def _compile_and_compare(fn: Written, *inputs: torch.Tensor) -> torch.fx.GraphModule:
    """Compile `fn`, check that kernels compute it and that it matches eager (float32 programs:
    torch.testing's defaults; bool and int results exactly)."""
    gm = ad_mlir.compile(torch.export.export(_Written(fn), inputs, strict=False))
    _assert_kernels_compute(gm, inputs)
    with torch.no_grad(), _kernels_only():
        got = gm(*inputs)
    torch.testing.assert_close(got, fn(*inputs))
    return gm


def _rand(*shape: int) -> torch.Tensor:
    return (torch.rand(shape, generator=torch.Generator().manual_seed(0)) * 4 - 2).to(DEVICE)


@pytest.mark.parametrize("shape", [(3,), (1, 5), (1, 1, 5)])
def test_row_reduction_output_of_a_single_row(shape: Shape) -> None:
    """The row sum of a single row (no leading dim over 1) is an output. region_kernel's
    `store_address` found no dim to index it by and stored through `out0 + 0`, a scalar
    pointer for a [BLOCK_R, 1] value."""
    _compile_and_compare(lambda x: (x.sum(-1, keepdim=True),), _rand(*shape))


def test_per_column_output_of_a_region_with_rows() -> None:
    """exp(w) [5] is an output of the region computing x + exp(w) [2, 5]: its store pointer
    `out0 + cols` was [1, BLOCK_C], narrower than its mask `row_mask & col_mask & (i0 == 0)`."""
    _compile_and_compare(lambda x, w: (x + w.exp(), w.exp()), _rand(2, 5), _rand(5))


def test_one_element_output_of_a_region_with_rows() -> None:
    """abs(b) [1, 1] is an output of the region computing a + abs(b) [2, 1]: it was stored through
    the scalar pointer `out0 + 0` under a block mask."""
    _compile_and_compare(lambda a, b: (a + b.abs(), b.abs()), _rand(2, 1), _rand(1, 1))


def test_per_row_output_of_a_pointwise_region() -> None:
    """exp(a) [3, 1] is an output of the pointwise region computing x + exp(a) [3, 5]. Its store
    mask `row_mask & (tl.program_id(1) == 0)` came out int64 in the Triton interpreter, which
    rejected it (a block bool `&` a scalar bool; compiled Triton takes it)."""
    _compile_and_compare(lambda x, a: (x + a.exp(), a.exp()), _rand(3, 5), _rand(3, 1))


def test_and_of_a_mask_with_a_compare_of_a_0d_input() -> None:
    """`t2 & t3` with t3 = `s > 0.5` of a 0-d input loaded as a scalar: the interpreter's numpy
    bitwise_and got float32 data for the broadcast scalar bool and failed."""
    s = torch.tensor(1.0, device=DEVICE)
    _compile_and_compare(lambda x, s: ((x != s) & (s > 0.5),), _rand(3, 3), s)


def test_int32_plus_a_python_int() -> None:
    """The literal 3 (i64) meets an i32 value: `KernelEmitter.convert` wrote `3.to(tl.int32)`,
    a SyntaxError in the kernel file."""
    _compile_and_compare(lambda x: ((x * 4).to(torch.int32) + 3,), _rand(2, 17))


def test_explicit_round_trip_through_bf16_of_a_computed_value() -> None:
    """`cos(x).float().to(bf16).float()` must come out bf16-valued. canonicalize folds the exact
    chain bf16 -> f32 -> bf16 away (exact in eager, where cos(x) is bf16-valued), but in the
    region cos(x) is an fp32 intermediate: region_kernel's `_emit_cast` passed the bf16 -> f32
    cast through without rounding it, so the program's rounding was lost."""
    x = _rand(5).to(torch.bfloat16)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor]:
        return (x.cos().float().to(torch.bfloat16).float(),)

    gm = ad_mlir.compile(torch.export.export(_Written(fn), (x,), strict=False))
    with torch.no_grad(), _kernels_only():
        (got,) = gm(x)
    assert torch.equal(got, got.to(torch.bfloat16).float()), f"not bf16-valued: {got.tolist()}"
    # One bf16 ulp: the interpreter truncates where eager rounds to nearest.
    torch.testing.assert_close(got, fn(x)[0], rtol=2**-7, atol=0)


def test_a_kernel_that_failed_to_import_loads_once_regenerated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hypothesis replays of the int-literal failure above were "flaky": the second compile of
    the same kernel raised AttributeError, not the SyntaxError. cache.py's `_import` put the
    module in sys.modules before executing it and left it there when that raised, so every
    later load of the kernel in the process, even from a fresh and correct file, got the
    half-made module."""
    x = _rand(4, 3)
    ep = torch.export.export(_Written(lambda x: (x * 7.25 + 1.75,)), (x,), strict=False)
    emit = region_kernel.emit_kernel_module
    monkeypatch.setattr(region_kernel, "emit_kernel_module", lambda *args: emit(*args) + "\n)\n")
    with pytest.raises(SyntaxError):
        ad_mlir.compile(ep, cache=KernelCache(tmp_path / "broken"))
    monkeypatch.setattr(region_kernel, "emit_kernel_module", emit)
    gm = ad_mlir.compile(ep, cache=KernelCache(tmp_path / "regenerated"))
    with torch.no_grad(), _kernels_only():
        torch.testing.assert_close(gm(x), (x * 7.25 + 1.75,))


def _assert_only_kernels(gm: torch.fx.GraphModule) -> None:
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and not _is_kernel(n)]
    assert all(n.target is operator.getitem for n in calls), f"computed outside kernels:\n{gm.graph}"


@pytest.mark.parametrize(
    "fn", [lambda x: (2.0 - x,), lambda x: (torch.square(x),)], ids=["scalar_minus_tensor", "square"]
)
def test_rsub_and_square_are_fused(fn: Written) -> None:
    """aten.rsub.Scalar (`2.0 - x`) and aten.square had no `ad` op: they stayed opaque torch calls
    between kernels (an elementwise op without an `ad` op is invisible to the random tests'
    fusion check, which asks the op table what is elementwise)."""
    _assert_only_kernels(_compile_and_compare(fn, _rand(2, 5)))


def test_last_dim_slice_with_a_negative_start() -> None:
    """cat([g, x[..., -2:]]) (Inkling's rotary): region_kernel's `_emit_slice` read column
    `-2 + c` of x, before the row, instead of `4 + c` (errors of 0.5 in the logits)."""
    _compile_and_compare(lambda x, g: (torch.cat([g, x[..., -2:]], -1).exp(),), _rand(3, 6), _rand(3, 2))
