"""Region kernels compiled to PTX and cubin for sm_90 without a GPU, and what they show:
registers, spills, shared memory, and whether global loads and stores are vectorized.

A kernel is specialized as the runtime would specialize it: its own launcher runs on meta
tensors of the region's input types (dynamic dims bound to an example token count) with a
recorder in place of the kernel, and the recorded arguments get Triton's runtime types:
tensors are 16-byte-aligned pointers, an int equal to 1 is a constexpr, other ints are i32/i64
marked divisible by 16 when they are, floats are fp32. Without the divisibility marks the PTX
shows scalar loads where the real kernel loads vectors.

Triton's library functions (`tl.sum`, `tl.max`...) are themselves `@triton.jit` functions, and
under TRITON_INTERPRET=1 they were built as interpreter functions when triton was imported:
no kernel with a reduction can be compiled in that process. There the compilation runs in a
child process (`python -m ad_mlir.codegen.ptx`) that imports triton without the interpreter.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction, mangle_type
from xdsl.dialects.builtin import DYNAMIC_INDEX
from xdsl.ir import Attribute

from ad_mlir.codegen.cache import CachedKernel
from ad_mlir.semantics.op_table import torch_dtype

TARGET = GPUTarget("cuda", 90, 32)
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
DIVISIBILITY = 16

_VECTOR_LOAD = re.compile(r"\bld\.global(?:\.[\w:]+)*\.v[248]\b")
_VECTOR_STORE = re.compile(r"\bst\.global(?:\.[\w:]+)*\.v[248]\b")
_MMA = re.compile(r"\b(?:wgmma\.mma_async|mma)\.sync\.aligned\.[\w.]+|\bwgmma\.mma_async\.[\w.]+")


class RegionKernel(Protocol):
    """What a PTX report reads of a region's kernel (the runtime's `RegionKernel` is one)."""

    cached: CachedKernel
    arg_types: tuple[Attribute, ...]

    @property
    def name(self) -> str: ...

    @property
    def arg_kinds(self) -> tuple[str, ...]:
        """Per block argument: "tensor", "written", "int" or "float"."""
        ...


class PtxCompileError(Exception):
    """A kernel that Triton cannot compile for sm_90 (usually a codegen bug: the kernel text is wrong)."""

    def __init__(self, kernel: str, message: str):
        super().__init__(f"kernel {kernel} does not compile to PTX for sm_90: {message}")
        self.kernel = kernel
        self.message = message


@dataclass(frozen=True)
class PtxReport:
    name: str
    registers: int
    spills: int
    """Bytes of local memory per thread: ptxas puts spilled registers in the stack frame."""
    shared_memory: int
    """Bytes per program: the cubin's static shared memory and the dynamic shared memory Triton
    asks for at launch (pipelined loads and layout conversions live there)."""
    vectorized_loads: bool
    """Some global load is a vector load (`ld.global.v2`/`.v4`)."""
    vectorized_stores: bool
    num_warps: int
    block_r: int
    """Rows of a program's tile: BLOCK_R of a region kernel, BLOCK_M (queries) of attention."""
    block_c: int
    """Columns of a program's tile: BLOCK_C of a region kernel, BLOCK_N (keys) of attention."""
    grid: tuple[int, ...]
    seconds: float
    """Wall time of the compilation (a hit in Triton's own cache is fast)."""
    mma: tuple[str, ...] = ()
    """The tensor-core instructions of the PTX, each once (`wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3`:
    Hopper's fp8 MMA; `mma.sync...f16.f16`: the older MMA, on fp16 operands)."""


@dataclass(frozen=True)
class Specialization:
    """What Triton compiles for one launch: the kernel's types, constexprs and options."""

    name: str
    path: str
    signature: dict[str, str]
    constexprs: dict[str, Any]
    divisible: tuple[str, ...]
    """Parameters Triton marks `tt.divisibility` 16."""
    options: dict[str, Any]
    grid: tuple[int, ...]


# ------------------------------------------------------------ the specialization


@dataclass(frozen=True)
class Launch:
    """One `kernel[grid](*args, **kwargs)` call of a launcher."""

    grid: tuple[int, ...]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class _Recorder:
    """Stands for the kernel in `launch(kernel, tensors, scalars)`: records, launches nothing."""

    def __init__(self) -> None:
        self.launches: list[Launch] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
        return lambda *args, **kwargs: self.launches.append(Launch(tuple(grid), args, kwargs))


def example_inputs(kernel: RegionKernel, tokens: int) -> tuple[list[torch.Tensor], list[Any]]:
    """Contiguous meta tensors of the region's input types, every dynamic dim `tokens` long; int
    scalars are `tokens` too (the scalars a region takes are symbolic sizes), floats 1.0 (Triton
    types every float fp32, whatever its value)."""
    tensors, scalars = [], []
    for arg_type, kind in zip(kernel.arg_types, kernel.arg_kinds, strict=True):
        if kind in ("tensor", "written"):
            shape = [tokens if d == DYNAMIC_INDEX else d for d in arg_type.get_shape()]
            tensors.append(torch.empty(shape, dtype=torch_dtype(arg_type), device="meta"))
        else:
            scalars.append(tokens if kind == "int" else 1.0)
    return tensors, scalars


def record_launches(module: ModuleType, tensors: Sequence[torch.Tensor], scalars: Sequence[Any]) -> list[Launch]:
    """Every launch that a kernel module's `launch` makes for `tensors` and `scalars` (meta tensors
    do: a launcher allocates its outputs on its inputs' device), in order."""
    recorder = _Recorder()
    module.launch(recorder, list(tensors), list(scalars))
    return recorder.launches


def record_launch(module: ModuleType, name: str, tensors: Sequence[torch.Tensor], scalars: Sequence[Any],
                  inputs: str = "these inputs") -> Launch:
    """The one launch that a kernel module's `launch` makes (`record_launches`); `inputs` names
    them in errors."""
    launches = record_launches(module, tensors, scalars)
    if len(launches) != 1:
        raise PtxCompileError(name, f"its launcher makes {len(launches)} launches for {inputs}, not one")
    return launches[0]


def capture_launch(kernel: RegionKernel, tokens: int = 256) -> Launch:
    """The launch the kernel's own launcher makes for inputs of `tokens` tokens."""
    return record_launch(kernel.cached.module, kernel.name, *example_inputs(kernel, tokens), inputs=f"{tokens} tokens")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def specialize(kernel: RegionKernel, tokens: int = 256) -> Specialization:
    """The region kernel as the runtime compiles it for inputs of `tokens` tokens."""
    return specialize_launch(kernel.name, kernel.cached.path, kernel.cached.jit_function, capture_launch(kernel, tokens))


def specialize_module(module: ModuleType, name: str, tensors: Sequence[torch.Tensor],
                      scalars: Sequence[Any] = ()) -> Specialization:
    """Any kernel module (a region kernel, a kernel template such as attention) as the runtime
    compiles it for `tensors` (meta tensors will do) and `scalars`."""
    launch = record_launch(module, name, tensors, scalars)
    return specialize_launch(name, Path(module.__file__), getattr(module, name), launch)


def _not_specialized(fn: JITFunction) -> set[str]:
    """The parameters `@triton.jit(do_not_specialize=...)` names (by name or index), read from a
    jitted function or from the interpreter's, which keeps the decorator's keywords."""
    names = getattr(fn, "do_not_specialize", None) or getattr(fn, "kwargs", {}).get("do_not_specialize") or []
    params = list(inspect.signature(fn.fn).parameters)
    return {params[n] if isinstance(n, int) else n for n in names}


def specialize_launch(name: str, path: Path, fn: JITFunction, launch: Launch) -> Specialization:
    """`launch` of the kernel `fn` (defined in the file `path`) by Triton's rules. Torch
    allocates at 256-byte boundaries, so every tensor counts as 16-byte aligned (a view at an
    odd offset would not be)."""
    kernel_signature = inspect.signature(fn.fn)
    params = kernel_signature.parameters
    keywords = {k: v for k, v in launch.kwargs.items() if k in params}
    bound = kernel_signature.bind(*launch.args, **keywords).arguments
    signature, constexprs, divisible = {}, {}, []
    unspecialized = _not_specialized(fn)
    for param, value in bound.items():
        if "constexpr" in str(params[param].annotation) or (_is_int(value) and value == 1 and param not in unspecialized):
            signature[param], constexprs[param] = "constexpr", value
            continue
        signature[param] = mangle_type(value)
        if isinstance(value, torch.Tensor) or (_is_int(value) and value % DIVISIBILITY == 0 and param not in unspecialized):
            divisible.append(param)
    options = {k: v for k, v in launch.kwargs.items() if k not in params}
    return Specialization(name, str(path), signature, constexprs, tuple(divisible), options, launch.grid)


# ------------------------------------------------------------------ compilation


def _resource_usage(cubin: bytes, name: str) -> dict[str, int]:
    """cuobjdump's `REG:31 STACK:0 SHARED:0 LOCAL:0 ...` line for `name` (no driver needed)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        dump = subprocess.run([CUOBJDUMP, "--dump-resource-usage", f.name], capture_output=True, text=True,
                              check=True).stdout
    match = re.search(rf"Function {re.escape(name)}:\s*\n(.*)", dump)
    if match is None:
        raise PtxCompileError(name, f"cuobjdump shows no resource usage for it:\n{dump}")
    return {k: int(v) for k, v in re.findall(r"(\w+(?:\[\d+\])?):(\d+)", match.group(1))}


def _block(spec: Specialization, *names: str) -> int:
    """The first of the block constexprs `names` the kernel has (region kernels tile rows x
    columns with BLOCK_R x BLOCK_C, attention tiles queries x keys with BLOCK_M x BLOCK_N); 1 for a
    kernel that tiles one dim only (the RG-LRU's channels, BLOCK_C)."""
    return next((spec.constexprs[n] for n in names if n in spec.constexprs), 1)


def compile_specialization(spec: Specialization, fn: JITFunction) -> PtxReport:
    """Compile in this process (triton must not be interpreting) and read the PTX and cubin."""
    start = time.perf_counter()
    index = {name: i for i, name in enumerate(fn.arg_names)}
    attrs = {(index[name],): [["tt.divisibility", DIVISIBILITY]] for name in spec.divisible}
    source = ASTSource(fn=fn, signature=spec.signature, constexprs=spec.constexprs, attrs=attrs)
    try:
        compiled = triton.compile(source, target=TARGET, options=spec.options)
    except Exception as e:  # any failure of Triton's pipeline (frontend, MLIR passes, ptxas)
        raise PtxCompileError(spec.name, f"{type(e).__name__}: {e}") from e
    ptx = compiled.asm["ptx"]
    usage = _resource_usage(compiled.asm["cubin"], compiled.metadata.name)
    return PtxReport(
        name=spec.name,
        registers=usage["REG"],
        spills=usage["STACK"] + usage["LOCAL"],
        shared_memory=usage["SHARED"] + compiled.metadata.shared,
        vectorized_loads=bool(_VECTOR_LOAD.search(ptx)),
        vectorized_stores=bool(_VECTOR_STORE.search(ptx)),
        num_warps=compiled.metadata.num_warps,
        block_r=_block(spec, "BLOCK_R", "BLOCK_M"),
        block_c=_block(spec, "BLOCK_C", "BLOCK_N"),
        grid=spec.grid,
        seconds=time.perf_counter() - start,
        mma=tuple(sorted(set(_MMA.findall(ptx)))),
    )


def _load_jit_function(spec: Specialization) -> JITFunction:
    module_spec = importlib.util.spec_from_file_location(f"ad_mlir_ptx_kernels.{spec.name}", spec.path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return getattr(module, spec.name)


def _compile_in_child(specs: Sequence[Specialization]) -> list[PtxReport]:
    """One child process for all `specs`; it answers one JSON line per kernel, in order, so a
    child that dies is blamed on the first kernel it did not answer for."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    request = json.dumps([dataclasses.asdict(s) for s in specs])
    child = subprocess.run([sys.executable, "-m", __name__], input=request, capture_output=True, text=True,
                           env=env)
    reports = []
    for spec, line in zip(specs, child.stdout.splitlines(), strict=False):
        answer = json.loads(line)
        if "error" in answer:
            raise PtxCompileError(spec.name, answer["error"])
        reports.append(PtxReport(**answer | {"grid": tuple(answer["grid"]), "mma": tuple(answer["mma"])}))
    if len(reports) < len(specs):
        raise PtxCompileError(specs[len(reports)].name,
                              f"the compiler process died (exit {child.returncode}):\n{child.stderr[-4000:]}")
    return reports


def _child_main() -> None:
    # Triton prints a failing kernel's PTX to stdout: keep stdout for the answers alone.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    for fields in json.load(sys.stdin):
        spec = Specialization(**fields | {"divisible": tuple(fields["divisible"]), "grid": tuple(fields["grid"])})
        try:
            answer = dataclasses.asdict(compile_specialization(spec, _load_jit_function(spec)))
        except PtxCompileError as e:
            answer = {"error": e.message}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


# ---------------------------------------------------------------------- reports


def ptx_reports(kernels: Iterable[RegionKernel], tokens: int = 256) -> list[PtxReport]:
    """One report per distinct kernel (by name, in first-seen order), e.g. for
    `build_kernels(module).values()`; a kernel whose launcher launches it in several phases (the
    MoE template) has one report per distinct phase, named `<kernel> phase <PHASE>`."""
    distinct = {k.name: k for k in kernels}
    named = [named_spec for k in distinct.values() for named_spec in _phase_specializations(k, tokens)]
    reports = compile_all([spec for _, spec in named])
    return [dataclasses.replace(report, name=name) for (name, _), report in zip(named, reports, strict=True)]


def _phase_specializations(kernel: RegionKernel, tokens: int) -> list[tuple[str, Specialization]]:
    """(report name, specialization) of each distinct launch the kernel's launcher makes."""
    specs: dict[tuple, Specialization] = {}
    for launch in record_launches(kernel.cached.module, *example_inputs(kernel, tokens)):
        spec = specialize_launch(kernel.name, kernel.cached.path, kernel.cached.jit_function, launch)
        specs.setdefault(tuple(sorted(spec.constexprs.items())), spec)
    if len(specs) == 1:
        return [(kernel.name, *specs.values())]
    return [(f"{kernel.name} phase {spec.constexprs.get('PHASE')}", spec) for spec in specs.values()]


def compile_all(specs: Sequence[Specialization]) -> list[PtxReport]:
    """A report per specialization, in order (compiled in a child process where this one
    runs the Triton interpreter)."""
    if not specs:
        return []
    if triton.knobs.runtime.interpret:
        return _compile_in_child(specs)
    return [compile_specialization(s, _load_jit_function(s)) for s in specs]


def format_table(reports: Iterable[PtxReport]) -> str:
    """A markdown table, one row per kernel."""
    header = ["kernel", "regs", "spill B", "smem B", "ld.v", "st.v", "warps", "block", "grid", "s"]
    rows = [
        [r.name, str(r.registers), str(r.spills), str(r.shared_memory), _yes(r.vectorized_loads),
         _yes(r.vectorized_stores), str(r.num_warps), f"{r.block_r}x{r.block_c}",
         "x".join(map(str, r.grid)), f"{r.seconds:.2f}"]
        for r in reports
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [header, ["-" * w for w in widths], *rows]
    return "\n".join("| " + " | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) + " |"
                     for line in lines)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


if __name__ == "__main__":
    _child_main()
