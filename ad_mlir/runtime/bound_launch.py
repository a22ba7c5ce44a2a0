"""Kernel launches bound once per specialization: what a kernel call on CUDA goes through.

Triton's `kernel[grid](*args, **kwargs)` (`JITFunction.run`) binds the arguments to the kernel's
signature, specializes each one, builds a cache key from those and the options (a string of
them), looks the compiled kernel up, reads the launch hooks and only then calls the compiled
kernel's launcher, `CompiledKernel.run`. A decode step makes a hundred such calls of tens of
arguments each, and the binding costs more host time than the launch.

`BoundKernel` stands for the kernel in a generated launcher (`launch(kernel, tensors, scalars)`
writes `kernel[grid](...)`). The first call of a specialization goes through the JIT, which
compiles the kernel (or finds it in its cache) and launches it, and the `CompiledKernel` it
returns is kept; later calls of that specialization call its `run` directly, on the stream
current at the call. The key is computed per call site (how many arguments come positionally,
which by keyword) and per tuple of argument types, from only what Triton specializes on: each
tensor's dtype and address modulo 16, each int's value modulo 16, whether it is 1 (Triton makes
a 1 a constant) and its width, and the values of constexprs and options. It is at least as fine
as Triton's own key, so two calls that Triton would compile apart never share a kernel here
(tests/unit/test_bound_launch.py checks it against the JIT's binder on every kernel of a decode
step).

Not re-read per call, unlike the JIT: the environment knobs that go into the compile options
(`TRITON_DEBUG`, instrumentation), `pre_run_hooks` added after a specialization's first call, and
the check that the kernel's globals have not changed (a generated kernel module never changes
its own). Arguments of a type Triton specializes otherwise (a tuple, a numpy scalar) and callable
grids go through the JIT on every call, as does everything with a Triton whose API differs from
the one this binds to (said once in the log).
"""

from __future__ import annotations

import functools
import itertools
import logging
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

_INT32 = 2**31
_INT64 = 2**63
_DTYPE = operator.attrgetter("dtype")
_ADDRESS = torch.Tensor.data_ptr
_FIFTEENS = itertools.repeat(15)
"""Triton specializes ints and addresses on divisibility by 16: the residue mod 16 keeps that (and more)."""
_FIXED = (float, bool, type(None))
"""Types whose every value Triton specializes alike (fp32, u1, a None constant)."""


@dataclass(frozen=True)
class Compiled:
    """One compiled specialization, bound: `CompiledKernel.run` and the arguments it always gets."""

    run: Callable[..., Any]
    function: Any
    """The kernel's CUfunction handle."""
    metadata: Any
    """`CompiledKernel.packed_metadata`."""
    kernel: Any
    """The `CompiledKernel`, for the launch hooks' metadata."""


class NotBindable(Exception):
    """The compiled kernel the JIT returned is not one this binds to (another Triton's)."""


def compile_through_jit(fn: Any, grid: Sequence[int], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Compiled | None:
    """The JIT's launch of this call (compiling the kernel, or finding it in its cache) and its
    compiled kernel, bound; None when a JIT cache hook took the launch over."""
    kernel = fn.run(*args, grid=grid, warmup=False, **kwargs)
    if kernel is None:
        return None
    missing = [a for a in ("run", "function", "packed_metadata", "launch_metadata") if not hasattr(kernel, a)]
    if missing:
        raise NotBindable(f"{type(kernel).__name__} has no {', '.join(missing)}")
    return Compiled(kernel.run, kernel.function, kernel.packed_metadata, kernel)


def _getter(keys: Sequence[Any]) -> Callable[[Any], tuple[Any, ...]]:
    """`lambda seq: tuple(seq[k] for k in keys)`, in C where it can be (`itemgetter` of one key
    returns the item, not a tuple)."""
    if not keys:
        return lambda _: ()
    if len(keys) == 1:
        only = keys[0]
        return lambda seq: (seq[only],)
    return operator.itemgetter(*keys)


def _int_width(value: int) -> int:
    return 32 if -_INT32 <= value < _INT32 else 64 if -_INT64 <= value < _INT64 else 65


class _Plan:
    """Where each kind of argument sits in the bound arguments, for one call site and one tuple of
    argument types, and the specializations compiled for it."""

    def __init__(self, tensors: list[int], ints: list[int], values: list[int]) -> None:
        self.tensors = _getter(tensors)
        self.ints = _getter(ints)
        self.values = _getter(values)
        self.compiled: dict[tuple[Any, ...], Compiled] = {}

    def key(self, bound: tuple[Any, ...], options: tuple[Any, ...], device: int) -> tuple[Any, ...]:
        tensors, ints = self.tensors(bound), self.ints(bound)
        # an int's class: its residue mod 16, or 16 for a 1 (which Triton makes a constant)
        key = (device, tuple(map(_DTYPE, tensors)), tuple(map(operator.and_, map(_ADDRESS, tensors), _FIFTEENS)),
               tuple([16 if v == 1 else v & 15 for v in ints]), self.values(bound), options)
        if ints and (min(ints) < -_INT32 or max(ints) >= _INT32):
            key += (tuple(map(_int_width, ints)),)
        return key


class _Site:
    """One way of calling the kernel: this many arguments positionally, these by keyword. Binds a
    call to the kernel's parameters in order (defaults filled in), with the other keywords (the
    compile options: `num_warps`, ...) apart."""

    def __init__(self, params: Sequence[Any], positional: int, keywords: tuple[str, ...]) -> None:
        names = [p.name for p in params]
        later = params[positional:]
        self.bindable = positional <= len(params) and not set(keywords) & set(names[:positional]) and all(
            p.name in keywords or p.has_default for p in later)
        self.constexpr = [p.is_constexpr for p in params]
        self.defaults = {p.name: p.default for p in later if p.name not in keywords}
        self.rest = _getter([p.name for p in later])
        self.options = _getter([k for k in keywords if k not in names])
        self.plans: dict[tuple[type, ...], _Plan | None] = {}

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        return args + self.rest({**self.defaults, **kwargs} if self.defaults else kwargs)

    def plan(self, bound: tuple[Any, ...], types: tuple[type, ...]) -> _Plan | None:
        """The plan for arguments of these types; None where one of them is not one this binds."""
        tensors, ints, values = [], [], []
        for i, (value, constexpr) in enumerate(zip(bound, self.constexpr, strict=True)):
            if constexpr:
                values.append(i)
            elif isinstance(value, torch.Tensor):
                tensors.append(i)
            elif type(value) is int:
                ints.append(i)
            elif not isinstance(value, _FIXED):
                self.plans[types] = None
                return None
        plan = self.plans[types] = _Plan(tensors, ints, values)
        return plan


@functools.cache
def _say_once(reason: str) -> None:
    log.info("bound launches: %s; these kernels launch through Triton's JIT on every call", reason)


def _runtime_knobs(fn: Any) -> tuple[Any, str | None]:
    """Triton's runtime knobs (the launch hooks live there), and why this Triton's kernels cannot
    be bound (its API is not the one this calls), or None."""
    if not all(hasattr(fn, a) for a in ("params", "run")):
        return None, f"{type(fn).__name__} has no `params` or `run`"
    try:
        from triton import knobs

        if hasattr(knobs.runtime, "launch_enter_hook") and hasattr(knobs.runtime, "launch_exit_hook"):
            return knobs.runtime, None
    except ImportError:
        pass
    return None, "this Triton has no triton.knobs.runtime launch hooks"


def _hook(hook: Any) -> Any:
    """The hook to hand the launcher: None for none (a HookChain with nothing in it calls
    nothing, so the launcher skips it and the metadata it would get is not built)."""
    return hook if hook is not None and getattr(hook, "calls", True) else None


class BoundKernel:
    """A Triton kernel (`JITFunction`) as a generated launcher calls it (`kernel[grid](*args,
    **kwargs)`), launched through its compiled kernel's `run` once its specialization has been
    compiled. The current device and stream are Triton's driver's (torch's, on CUDA), whose
    functions are looked up at the first launch."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self._knobs, self.unbindable = _runtime_knobs(fn)
        self._params = tuple(fn.params) if self.unbindable is None else ()
        self._device: Callable[[], int] | None = None
        self._stream: Callable[[int], int] | None = None
        self._sites: dict[tuple[Any, ...], _Site] = {}

    def __getitem__(self, grid: Sequence[int]) -> Callable[..., None]:
        return functools.partial(self.launch, grid)

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any], device: int = 0,
             ) -> tuple[_Plan, tuple[Any, ...], tuple[Any, ...]] | None:
        """A call's plan, specialization key and bound arguments (the kernel's parameters in
        order, what `CompiledKernel.run` takes after its fixed arguments); None for a call this
        does not bind (it goes through the JIT)."""
        shape = (len(args), *kwargs)
        site = self._sites.get(shape)
        if site is None:
            site = self._sites[shape] = _Site(self._params, len(args), tuple(kwargs))
        if not site.bindable:
            return None
        bound, options = site.bind(args, kwargs), site.options(kwargs)
        types = tuple(map(type, bound + options))
        plan = site.plans.get(types, False)
        if plan is False:
            plan = site.plan(bound, types)
        if plan is None:
            return None
        return plan, plan.key(bound, options, device), bound

    def launch(self, grid: Sequence[int], *args: Any, **kwargs: Any) -> None:
        if self.unbindable is not None or callable(grid):
            if self.unbindable is not None:
                _say_once(self.unbindable)
            self.fn.run(*args, grid=grid, warmup=False, **kwargs)
            return
        if self._device is None:
            self._use_triton_driver()
        device = self._device()
        found = self.bind(args, kwargs, device)
        if found is None:
            self.fn.run(*args, grid=grid, warmup=False, **kwargs)
            return
        plan, key, bound = found
        try:
            compiled = plan.compiled.get(key)
        except TypeError:  # an unhashable constexpr or option: the JIT keys on its text
            self.fn.run(*args, grid=grid, warmup=False, **kwargs)
            return
        if compiled is None:
            self._first_launch(plan, key, grid, args, kwargs)
            return
        self._run(compiled, grid, device, bound)

    def _first_launch(self, plan: _Plan, key: tuple[Any, ...], grid: Sequence[int], args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> None:
        """Launch through the JIT and keep the compiled kernel for the key; a kernel with pre-run
        hooks keeps going through the JIT, which runs them."""
        try:
            compiled = compile_through_jit(self.fn, grid, args, kwargs)
        except NotBindable as e:  # the JIT launched it, but its compiled kernel is not the one bound to
            self.unbindable = str(e)
            _say_once(self.unbindable)
            return
        if compiled is not None and not getattr(self.fn, "pre_run_hooks", None):
            plan.compiled[key] = compiled

    def _run(self, compiled: Compiled, grid: Sequence[int], device: int, bound: tuple[Any, ...]) -> None:
        stream = self._stream(device)
        enter, leave = _hook(self._knobs.launch_enter_hook), _hook(self._knobs.launch_exit_hook)
        metadata = None if enter is None and leave is None else compiled.kernel.launch_metadata(grid, stream, *bound)
        n = len(grid)
        compiled.run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, stream, compiled.function,
                     compiled.metadata, metadata, enter, leave, *bound)

    def _use_triton_driver(self) -> None:
        """The current device and stream as Triton's JIT reads them (torch's, on CUDA): the stream is
        read at every launch, since a `torch.cuda.stream` context or a CUDA graph capture changes it."""
        from triton.runtime import driver

        active = driver.active
        self._device, self._stream = active.get_current_device, active.get_current_stream
