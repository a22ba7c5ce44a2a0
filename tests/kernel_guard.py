"""One guard for "the kernels really ran", shared by every test that says a generated kernel ran.

A compiled graph calls two kinds of `torch.ops.ad_mlir.*` op: generated Triton kernels (registered
by `runtime/kernels.py`) and the reference ops of `frontends/torch_ops.py` (an LLM-level op left
unfused or without a kernel), in one namespace, so counting targets by their `ad_mlir.` prefix
counts both. Three ways a test meant for the kernels can run something else, each closed here:
- a graph calls a reference op (`graph_kernels` fails on one);
- a kernel runs its region's reference semantics instead of the Triton kernel (`kernels_ran`
  refuses `run_reference` and counts the kernel launches);
- `build_kernels` found no kernel form for an op and left it as plain torch calls, which no
  refusal sees (`kernels_ran` and `no_dropped_ops` fail when `kernels.NO_KERNEL` grew).
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator

import pytest
import torch

from ad_mlir.runtime import kernels


def _calls(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function"]


def kernel_calls(gm: torch.fx.GraphModule) -> list[str]:
    """The generated kernels `gm` calls (one name per call), reference ops not counted."""
    return [kernel.name for n in _calls(gm) if (kernel := kernels.registered_kernel(n.target)) is not None]


def reference_calls(gm: torch.fx.GraphModule) -> list[str]:
    """The `ad_mlir` ops `gm` calls that are not generated kernels (reference ops)."""
    return [str(n.target) for n in _calls(gm)
            if str(n.target).startswith(f"{kernels.NAMESPACE}.") and kernels.registered_kernel(n.target) is None]


def graph_kernels(gm: torch.fx.GraphModule, at_least: int = 1) -> list[str]:
    """Asserts that `gm` calls at least `at_least` generated kernels, no reference op, and that
    each kernel runs as Triton code here (the interpreter on CPU); returns the kernels' names."""
    references = reference_calls(gm)
    assert not references, f"the graph calls reference ops, not kernels: {references}"
    found = [k for n in _calls(gm) if (k := kernels.registered_kernel(n.target)) is not None]
    assert len(found) >= at_least, f"{len(found)} kernel calls, expected at least {at_least}"
    if not torch.cuda.is_available():
        jit = {type(k.cached.jit_function).__name__ for k in found}
        assert jit <= {"InterpretedFunction"}, f"kernels not loaded for the Triton interpreter: {jit}"
    return [k.name for k in found]


@contextlib.contextmanager
def no_dropped_ops() -> Iterator[None]:
    """Fails if `build_kernels`, within it, left an op without a kernel (as torch calls)."""
    before = collections.Counter(kernels.NO_KERNEL)
    yield
    dropped = kernels.NO_KERNEL - before
    assert not dropped, f"ops compiled to torch calls, not kernels: {dict(dropped)}"


@contextlib.contextmanager
def kernels_ran(monkeypatch: pytest.MonkeyPatch, at_least: int = 1) -> Iterator[collections.Counter[str]]:
    """Within it, a kernel that would run its reference semantics raises, and no op may be left
    without a kernel; at the end, at least `at_least` kernel launches happened. Yields the
    launches counted by kernel name."""
    launches: collections.Counter[str] = collections.Counter()
    run = kernels.RegionKernel.run

    def counted(self: kernels.RegionKernel, *groups: list) -> list[torch.Tensor]:
        launches[self.name] += 1
        return run(self, *groups)

    def refuse(*_: object) -> None:
        raise AssertionError("a kernel ran its region's reference semantics, not the Triton kernel")

    with monkeypatch.context() as patch, no_dropped_ops():
        patch.setattr(kernels, "run_reference", refuse)
        patch.setattr(kernels.RegionKernel, "run", counted)
        yield launches
    total = sum(launches.values())
    assert total >= at_least, f"{total} kernel launches, expected at least {at_least}"
