"""Kernels (of `ad.fused` regions and LLM-level ops) as `torch.ops.ad_mlir.<name>` ops.

Every op has one schema, `(Tensor[] tensors, SymInt[] ints, float[] floats) -> Tensor[]`
(the region's tensor inputs, then its int and float scalar inputs, each in block-argument
order), so a region of any size fits one schema. A kernel that writes some of its inputs in
place (`ad.cached_attention`'s K/V caches) takes those apart, as `Tensor(a!)[] written` after
`tensors`, so torch knows what it mutates. With CUDA the op is a
`torch.library.triton_op` (graphs stay `torch.export`-able and `torch.compile` traces into
the kernel); without CUDA it is an opaque `torch.library.custom_op`, because Inductor cannot
trace a Triton kernel on a machine without a GPU driver. On CUDA tensors the Triton kernel
runs, each specialization compiled once through Triton's JIT and then launched through its
compiled kernel (`bound_launch.py`), or handed to `torch.library.wrap_triton` where torch traces
the call; on CPU tensors the kernel runs in the Triton interpreter when it was loaded with
`TRITON_INTERPRET=1`, else the region's reference semantics run (its ops' torch calls).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import is_in_torch_dispatch_mode
from xdsl.dialects.builtin import Float64Type, ModuleOp, TensorType
from xdsl.ir import Attribute, Operation

from ad_mlir.codegen.cache import CachedKernel, KernelCache
from ad_mlir.codegen.lowering import kernel_ops, kernel_region, written_inputs
from ad_mlir.dialects.decompositions import NoKernelForm
from ad_mlir.runtime.bound_launch import BoundKernel
from ad_mlir.semantics.torch_ops import DIRECT

log = logging.getLogger(__name__)

NAMESPACE = "ad_mlir"

NO_KERNEL: collections.Counter[str] = collections.Counter()
"""Ops `build_kernels` left as torch calls (no kernel form), by op name, since the process
started: where every op must run as a kernel, a test checks that none was added."""


@dataclass(frozen=True)
class RegionKernel:
    """A region's kernel and the torch op that calls it."""

    cached: CachedKernel
    reference: torch.fx.GraphModule
    """The region's body as torch calls (its reference semantics, the CPU path)."""
    arg_types: tuple[Attribute, ...]
    """The region's block argument types, in order."""
    written: frozenset[int] = frozenset()
    """Block arguments the kernel writes in place."""

    @functools.cached_property
    def arg_kinds(self) -> tuple[str, ...]:
        """Per block argument: "tensor", "written" (a tensor written in place), "int" or "float"."""
        return tuple("written" if i in self.written else _arg_kind(t) for i, t in enumerate(self.arg_types))

    @functools.cached_property
    def groups(self) -> tuple[str, ...]:
        """The op's arguments: lists of the block arguments of these kinds."""
        return ("tensor", "written", "int", "float") if self.written else ("tensor", "int", "float")

    @property
    def name(self) -> str:
        return self.cached.name

    @property
    def op(self) -> torch._ops.OpOverload:
        return getattr(getattr(torch.ops, NAMESPACE), self.name).default

    def split_inputs(self, values: Sequence[Any]) -> tuple[list[Any], ...]:
        """Region inputs in block order -> the op's arguments, one list per kind of `groups`."""
        groups: dict[str, list[Any]] = {kind: [] for kind in self.groups}
        for kind, v in zip(self.arg_kinds, values, strict=True):
            groups[kind].append(v)
        return tuple(groups.values())

    @functools.cached_property
    def places(self) -> tuple[tuple[int, int], ...]:
        """Per block argument: which of the op's argument lists holds it, and where."""
        seen = dict.fromkeys(self.groups, 0)
        places = []
        for kind in self.arg_kinds:
            places.append((self.groups.index(kind), seen[kind]))
            seen[kind] += 1
        return tuple(places)

    def join_inputs(self, *groups: Sequence[Any]) -> list[Any]:
        """The op's arguments -> region inputs in block order."""
        return [groups[group][i] for group, i in self.places]

    def _launch_inputs(self, values: Sequence[Any]) -> tuple[list[torch.Tensor], list[Any]]:
        """The launcher's `tensors` and `scalars`, each in block order."""
        tensors = [v for kind, v in zip(self.arg_kinds, values, strict=True) if kind in ("tensor", "written")]
        scalars = [v for kind, v in zip(self.arg_kinds, values, strict=True) if kind in ("int", "float")]
        return tensors, scalars

    @functools.cached_property
    def first_tensor(self) -> int:
        """The block argument whose device decides where the kernel runs."""
        return next(i for i, kind in enumerate(self.arg_kinds) if kind in ("tensor", "written"))

    @functools.cached_property
    def fresh_outputs(self) -> bool:
        """The reference's outputs are new tensors, each once (made by ops whose schema returns
        no alias, or by a custom op, which may not): `unaliased` would copy nothing, so its check
        of every input's storage, a few microseconds a call, is skipped."""
        outputs = next(n for n in reversed(self.reference.graph.nodes) if n.op == "output").args[0]
        nodes = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
        return len(set(nodes)) == len(nodes) and all(_makes_new_tensor(n) for n in nodes)

    def run(self, *groups: list[Any]) -> list[torch.Tensor]:
        values = self.join_inputs(*groups)
        if _STUBBED:
            return self.cached.module.launch(_NO_KERNEL, *self._launch_inputs(values))
        fn = self.cached.jit_function
        interpreted = type(fn).__name__ == "InterpretedFunction" and not _FORCE_REFERENCE
        if not (values[self.first_tensor].is_cuda or interpreted):
            outputs = run_reference(self.reference, values)
            outputs = list(outputs) if self.fresh_outputs else unaliased(outputs, self._launch_inputs(values)[0])
            # contiguous, as the kernel's and the fake's outputs are: Inductor checks an op's
            # output strides against its fake (a reference attention returns transposed rows)
            return [t if t.is_contiguous() else t.contiguous() for t in outputs]
        tensors, scalars = self._launch_inputs(values)
        if not interpreted:
            fn = torch.library.wrap_triton(fn) if traced(values[self.first_tensor]) else self.bound
        return self.cached.module.launch(fn, tensors, scalars)

    @functools.cached_property
    def bound(self) -> BoundKernel:
        """The kernel as a CUDA call launches it: each specialization compiled once through the JIT,
        then launched through its compiled kernel (`runtime/bound_launch.py`)."""
        return BoundKernel(self.cached.jit_function)

    def fake(self, *groups: list[Any]) -> list[torch.Tensor]:
        tensors, _ = self._launch_inputs(self.join_inputs(*groups))
        module = self.cached.module
        device = tensors[0].device
        return [
            tensors[0].new_empty(shape, dtype=dtype, device=device)
            for shape, dtype in zip(module.output_shapes(tensors), module.OUTPUT_DTYPES, strict=True)
        ]


def traced(t: torch.Tensor) -> bool:
    """Whether a kernel call on `t` is being traced (fake or functional tensors, a dispatch mode:
    `torch.compile` decomposing the op into its Triton kernel), so that the kernel must go through
    `torch.library.wrap_triton` for the tracer to see it, not be launched."""
    return type(t) not in _PLAIN_TENSORS or is_in_torch_dispatch_mode()


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def unaliased(outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """`outputs`, each copied where it is or views an input or an earlier output (a region
    that slices an input, or yields one value twice): a torch.library op may return no alias."""
    seen = {t.untyped_storage().data_ptr() for t in inputs}
    result = []
    for t in outputs:
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:
            t = t.clone()
            ptr = t.untyped_storage().data_ptr()
        seen.add(ptr)
        result.append(t)
    return result


_USE_TRITON_OP = torch.cuda.is_available()
_REGISTERED: dict[str, RegionKernel] = {}
_FORCE_REFERENCE = False
_STUBBED = False


class _NoKernel:
    """Stands for a Triton kernel in a launcher: `kernel[grid](*args, **kwargs)` runs nothing."""

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        return _launch_nothing


def _launch_nothing(*args: Any, **kwargs: Any) -> None:
    return None


_NO_KERNEL = _NoKernel()


@contextlib.contextmanager
def stubbed_launches() -> Iterator[None]:
    """Within it, every kernel call takes the path of a launch on CUDA (its inputs bound to the
    generated launcher, its outputs allocated, the grid computed) on any device, with the
    Triton kernel replaced by one that runs nothing: what a call costs the host
    (`ad-bench --parts launch`). Outputs hold whatever memory they were given."""
    global _STUBBED
    outer, _STUBBED = _STUBBED, True
    try:
        yield
    finally:
        _STUBBED = outer


@contextlib.contextmanager
def reference_kernels() -> Iterator[None]:
    """Within it, kernels on CPU tensors run their reference semantics even when they were
    loaded for the Triton interpreter (one process can check a graph both ways)."""
    global _FORCE_REFERENCE
    outer, _FORCE_REFERENCE = _FORCE_REFERENCE, True
    try:
        yield
    finally:
        _FORCE_REFERENCE = outer


def run_reference(graph: torch.fx.GraphModule, values: Sequence[Any]) -> Sequence[torch.Tensor]:
    """A region's reference semantics on `values` (tests replace it to prove a kernel ran); its
    generated `forward`, without `nn.Module.__call__`'s hook handling, a few microseconds of the
    hundred calls of a CPU decode step."""
    return graph.forward(*values)


def registered_kernel(target: Any) -> RegionKernel | None:
    """The kernel an FX node's target calls (its op, or its entry `call_kernels_directly` put
    there), if it is one of ours."""
    if isinstance(getattr(target, "kernel", None), RegionKernel):
        return target.kernel
    schema = getattr(target, "_schema", None)
    namespace, _, name = (schema.name if schema is not None else "").partition("::")
    return _REGISTERED.get(name) if namespace == NAMESPACE else None


def call_kernels_directly(graph: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of `graph` (sharing its weights) whose calls of kernel ops call the kernels' Python
    entry (what the op runs), for running eagerly (and capturing into CUDA graphs), never traced:
    torch's dispatch of a custom op costs tens of microseconds a call in Python, which on a
    decode step (a hundred kernel calls around small GEMMs) is more than the fused ops save."""
    copy = torch.fx.GraphModule(graph, _copy_graph(graph.graph))
    for node in copy.graph.nodes:
        kernel = registered_kernel(node.target) if node.op == "call_function" else None
        if kernel is not None:
            node.target = _direct_call(kernel)
    copy.recompile()
    return copy


def _copy_graph(graph: torch.fx.Graph) -> torch.fx.Graph:
    new = torch.fx.Graph()
    output = new.graph_copy(graph, {})
    new.output(output)
    return new


def _direct_call(kernel: RegionKernel) -> Any:
    """A function named after the kernel that runs it (looked up at each call, so that a test can
    wrap `RegionKernel.run`)."""
    def call(*groups: list[Any]) -> list[torch.Tensor]:
        return kernel.run(*groups)

    call.__name__ = call.__qualname__ = f"run_{kernel.name}"
    call.kernel = kernel  # type: ignore[attr-defined]
    return call


def _makes_new_tensor(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    if node.target in DIRECT.values():  # a cache-writing custom op's function: custom ops return no alias
        return True
    schema = getattr(node.target, "_schema", None)
    return schema is not None and len(schema.returns) == 1 and schema.returns[0].alias_info is None


def _arg_kind(t: Any) -> str:
    if isinstance(t, TensorType):
        return "tensor"
    return "float" if isinstance(t, Float64Type) else "int"


def _define_op(kernel: RegionKernel) -> None:
    if kernel.written:
        def op(tensors: list[torch.Tensor], written: list[torch.Tensor], ints: list[int],
               floats: list[float]) -> list[torch.Tensor]:
            return kernel.run(tensors, written, ints, floats)
    else:
        def op(tensors: list[torch.Tensor], ints: list[int], floats: list[float]) -> list[torch.Tensor]:
            return kernel.run(tensors, ints, floats)

    qualname = f"{NAMESPACE}::{kernel.name}"
    define = torch.library.triton_op if _USE_TRITON_OP else torch.library.custom_op
    library_op = define(qualname, op, mutates_args=("written",) if kernel.written else ())
    library_op.register_fake(kernel.fake)


def region_kernel(op: Operation, cache: KernelCache) -> RegionKernel:
    """The kernel of `op` (from the cache), registered as a torch op once per process. A kernel
    registered before, from another cache, comes back with this cache's file (the same source:
    names hash it), so its file is one that still exists."""
    lowered = kernel_region(op)
    cached = cache.get(lowered.region, lowered.label)
    if cached.name in _REGISTERED:
        return dataclasses.replace(_REGISTERED[cached.name], cached=cached)
    from ad_mlir.runtime.fx_export import block_graph

    block = lowered.region.body.block
    kernel = RegionKernel(cached, block_graph(block), tuple(a.type for a in block.args), written_inputs(op))
    _define_op(kernel)
    _REGISTERED[cached.name] = kernel
    return kernel


def build_kernels(module: ModuleOp, cache: KernelCache | None = None) -> dict[Operation, RegionKernel]:
    """A kernel for every `ad.fused` region and LLM-level op of `module` (generated, or loaded
    from the cache)."""
    cache = cache or KernelCache()
    start = time.perf_counter()
    hits, generated = cache.hits, cache.generated
    kernels: dict[Operation, RegionKernel] = {}
    for op in kernel_ops(module):
        try:
            kernels[op] = region_kernel(op, cache)
        except NoKernelForm as e:
            NO_KERNEL[op.name] += 1
            log.warning("codegen: %s at %s has no kernel, runs as torch calls: %s", op.name, op.location, e)
    log.info(
        "codegen: %d regions -> %d kernels (%d generated, %d read from the cache %s) in %.3f s",
        len(kernels), len({k.name for k in kernels.values()}), cache.generated - generated,
        cache.hits - hits, cache.directory, time.perf_counter() - start,
    )
    return kernels
