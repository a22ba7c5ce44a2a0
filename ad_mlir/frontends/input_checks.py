"""Run-time input checks of a compiled graph: what it is given against what it was compiled for.

Each user input has an `InputSpec` (dtype, device type, rank, static sizes, the dynamic dims'
ranges from the export's `range_constraints`, the value of a specialized scalar); the compiled
GraphModule checks its inputs against them in a forward pre-hook and raises `InputError` naming
the input, expected and actual, before any kernel runs. The checks read only Python-side tensor
metadata (no tensor values), so they never synchronize with the device and are safe around CUDA
graph capture. Dims that share a symbol (the sequence of `input_ids` and `position_ids`) must be
equal. These are the checks `torch.export` puts in `ep.module()`'s `_guards_fn`
(`torch/export/_unlift.py: _get_input_guards_for_graph`, made from the same placeholders and
range constraints), with errors that name the input."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch


class InputError(ValueError):
    """An input of a compiled graph that does not match what it was compiled for."""


@dataclass(frozen=True)
class DynamicDim:
    """A dim whose size varies: within [low, high]; dims with the same `symbol` are equal."""

    symbol: str | None
    low: int = 0
    high: float = math.inf

    def describe(self) -> str:
        high = "inf" if self.high == math.inf else str(int(self.high))
        return f"{self.symbol or '?'} in [{self.low}, {high}]"


Dim = int | DynamicDim


@dataclass(frozen=True)
class InputSpec:
    """What one input must be. `kind` is torch.Tensor, int, float or bool; `device_type` None
    accepts any device (a graph compiled on the meta device); `value` is the exported value of a
    scalar the graph was specialized on (None: the scalar may vary, within `bounds` if given)."""

    name: str
    kind: type
    dtype: torch.dtype | None = None
    device_type: str | None = None
    shape: tuple[Dim, ...] = ()
    value: Any = None
    bounds: DynamicDim | None = None

    def describe(self) -> str:
        if self.kind is not torch.Tensor:
            bounds = f" ({self.bounds.describe()})" if self.bounds else ""
            return self.kind.__name__ + (bounds if self.value is None else f" == {self.value!r}")
        dims = ", ".join(d.describe() if isinstance(d, DynamicDim) else str(d) for d in self.shape)
        return f"{self.dtype} tensor [{dims}] on {self.device_type or 'any device'}"

    def check(self, value: Any, sizes: dict[str, tuple[int, str, int | None]]) -> None:
        """Raise InputError unless `value` fits; `sizes` holds the symbols seen so far."""
        if self.kind is not torch.Tensor:
            self._check_scalar(value, sizes)
            return
        if not isinstance(value, torch.Tensor):
            self._fail(f"a {type(value).__name__}")
        if value.dtype != self.dtype:
            self._fail(f"dtype {value.dtype}")
        if self.device_type is not None and value.device.type != self.device_type:
            self._fail(f"a tensor on {value.device}")
        shape = value.shape
        if shape == self.shape:  # all static and equal (one C-level compare: the common K/V cache case)
            return
        if len(shape) != len(self.shape):
            self._fail(f"rank {len(shape)} (shape {list(shape)})")
        for i, (size, dim) in enumerate(zip(shape, self.shape, strict=True)):
            if isinstance(dim, int):
                if size != dim:
                    self._fail(f"shape {list(shape)}: dim {i} is {size}, compiled for {dim}")
            else:
                self._check_dynamic(size, dim, i, sizes)

    def _check_scalar(self, value: Any, sizes: dict[str, tuple[int, str, int | None]]) -> None:
        # bool is an int in Python: compare types exactly, as torch.export's own checks do
        if type(value) is not self.kind:
            self._fail(f"a {type(value).__name__} ({value!r})")
        if self.value is not None and value != self.value:
            self._fail(f"{value!r} (the graph was compiled for this scalar's value)")
        if self.bounds is not None:
            self._check_dynamic(value, self.bounds, None, sizes)

    def _check_dynamic(self, size: int, dim: DynamicDim, index: int | None, sizes: dict[str, tuple[int, str, int | None]]) -> None:
        """`index`: the dim's, None for a scalar's value (messages are formatted only on failure:
        this runs at every call)."""
        if not dim.low <= size <= dim.high:
            self._fail(f"{_where(index)} of size {size}, outside the compiled range {dim.describe()}")
        if dim.symbol is None:
            return
        seen = sizes.setdefault(dim.symbol, (size, self.name, index))
        if seen[0] != size:
            self._fail(f"{_where(index)} of size {size}, but '{seen[1]}' {_where(seen[2])} "
                       f"(the same symbol {dim.symbol}) is {seen[0]}")

    def _fail(self, actual: str) -> None:
        raise InputError(f"input '{self.name}': expected {self.describe()}, got {actual}")


def _where(index: int | None) -> str:
    return "value" if index is None else f"dim {index}"


class InputChecks:
    """A forward pre-hook (with kwargs) checking a compiled graph's inputs against `specs`."""

    def __init__(self, specs: Sequence[InputSpec]) -> None:
        self.specs = tuple(specs)
        self.names = tuple(s.name for s in self.specs)

    def check(self, args: Sequence[Any]) -> None:
        if len(args) != len(self.specs):
            raise InputError(
                f"expected {len(self.specs)} inputs ({', '.join(self.names)}), got {len(args)}"
            )
        sizes: dict[str, tuple[int, str, int | None]] = {}
        for spec, value in zip(self.specs, args, strict=True):
            spec.check(value, sizes)

    def __call__(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.check(args + self._keyword_inputs(len(args), kwargs) if kwargs else args)

    def _keyword_inputs(self, given: int, kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
        """Inputs given by name (the compiled graph's placeholders are named as the inputs)."""
        unknown = sorted(set(kwargs) - set(self.names[given:]))
        if unknown:
            raise InputError(f"unexpected input(s) {', '.join(unknown)}: the graph takes {', '.join(self.names)}")
        return tuple(kwargs[n] for n in self.names[given:] if n in kwargs)


def dim_spec(size: Any, range_constraints: Mapping[Any, Any]) -> Dim:
    """A size of an exported placeholder's `meta["val"]`: an int, or a SymInt whose symbol's
    range the export recorded (a derived expression, e.g. 2*s0, is checked only as a size).
    A lower bound of 2 or less is not checked, as in torch.export's own guards: export reports
    ranges from 2 up (0/1 specialization) for graphs that also hold at sizes 0 and 1 (a decode
    step of one token)."""
    if isinstance(size, int):
        return size
    expr = size.node.expr
    if expr.is_number:
        return int(expr)
    if not expr.is_symbol:
        return DynamicDim(None)
    bounds = range_constraints.get(expr)
    if bounds is None:
        return DynamicDim(str(expr))
    # torch.export's own conversion (its runtime assertions use it): int, or math.inf
    from torch._export.passes.add_runtime_assertions_for_constraints_pass import _convert_range_to_int

    low, high = _convert_range_to_int(bounds)
    return DynamicDim(str(expr), low if low > 2 else 0, high)


def spec_of_value(name: str, val: Any, range_constraints: Mapping[Any, Any]) -> InputSpec | None:
    """The spec of an exported placeholder from its `meta["val"]` (None when it has none)."""
    if isinstance(val, torch.Tensor):
        device = None if val.device.type == "meta" else val.device.type
        return InputSpec(name, torch.Tensor, val.dtype, device, tuple(dim_spec(d, range_constraints) for d in val.shape))
    if isinstance(val, torch.SymInt):
        dim = dim_spec(val, range_constraints)
        return InputSpec(name, int, value=dim) if isinstance(dim, int) else InputSpec(name, int, bounds=dim)
    if isinstance(val, bool | int | float):
        return InputSpec(name, type(val), value=val)
    return None
