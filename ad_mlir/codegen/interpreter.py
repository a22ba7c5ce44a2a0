"""The Triton interpreter switch: whether kernels on CPU tensors run in Triton's interpreter.

Triton reads `TRITON_INTERPRET` in every `@triton.jit`: for its own library functions
(`tl.sum`, `tl.max`, ...) once, when `triton` is first imported, and for a generated kernel when
its module is loaded. A process that sets the variable after triton was imported (and
`torch.export` imports triton) loads interpreted kernels that call compiled library functions,
which fails inside the first reduction with "Cannot call @triton.jit'd outside of the scope of a
kernel". So the switch is decided once per process, before triton's first import
(`use_interpreter`), and kernels are always loaded in the mode triton's library was built in
(`kernel_loading`), so the two can never disagree; a request that came too late is an error
that says so, never a crash inside a kernel.

This module imports triton only when triton is already imported: calling it decides nothing.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

VARIABLE = "TRITON_INTERPRET"


class InterpreterSwitchError(RuntimeError):
    """The interpreter was asked for after triton's library was built without it (or the reverse)."""


def requested() -> bool:
    """Whether this process's environment asks for the Triton interpreter."""
    return os.environ.get(VARIABLE, "0").strip().lower() in ("1", "true", "on", "yes")


def library_interpreted() -> bool | None:
    """Whether triton's own jit functions were built for the interpreter; None before triton is
    imported (then the environment still decides)."""
    if "triton" not in sys.modules:
        return None
    from triton.language import standard
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(standard.sum, InterpretedFunction)


def use_interpreter(on: bool = True) -> None:
    """Run kernels on CPU tensors in the Triton interpreter (`on`) or not, for the rest of this
    process. Call it before anything imports triton (torch.export does); once triton is imported
    in the other mode, only a new process can switch, and this raises saying so."""
    built = library_interpreted()
    if built is not None and built != on:
        raise InterpreterSwitchError(
            f"the Triton interpreter was {'requested' if on else 'turned off'} after triton was imported "
            f"{'without' if on else 'with'} it: set {VARIABLE}={'1' if on else '0'} in the environment, or call "
            "ad_mlir.codegen.interpreter.use_interpreter() before importing torch.export, triton or ad_mlir's compiler"
        )
    os.environ[VARIABLE] = "1" if on else "0"


def default_to_interpreter() -> None:
    """`use_interpreter()` unless the environment already chose (`TRITON_INTERPRET` set by hand)."""
    if VARIABLE not in os.environ:
        use_interpreter()


@contextlib.contextmanager
def kernel_loading() -> Iterator[None]:
    """Load generated kernel modules within it: their `@triton.jit` builds the kind of function
    triton's library was built as (the environment's choice at triton's import), whatever the
    variable says now; a variable set later to the other mode is reported, not half-obeyed."""
    import triton

    built = bool(library_interpreted())
    if requested() != built:
        raise InterpreterSwitchError(
            f"{VARIABLE}={os.environ.get(VARIABLE)!r} was set after triton was imported "
            f"{'with' if built else 'without'} the interpreter, so its library functions (tl.sum, ...) cannot run "
            f"{'compiled' if built else 'in the interpreter'}: set {VARIABLE} in the environment before the process "
            "starts, or call ad_mlir.codegen.interpreter.use_interpreter() before importing torch.export or triton"
        )
    with triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = built
        yield


@contextlib.contextmanager
def nearest_bf16_rounding() -> Iterator[None]:
    """Within it, the Triton interpreter rounds fp32 -> bf16 conversions (casts and stores) to
    nearest even, as compiled kernels do (`.to(tl.bfloat16)` is LLVM's fptrunc there, and
    torch's conversion rounds the same way). Triton 3.9's interpreter truncates them (DESIGN.md):
    up to one bf16 ulp toward zero at each kernel store, a bias that adds up over a model's
    layers (2-3 times eager bf16's error on the logits of Pegasus-like models, against eager's
    at most half an ulp per op). Whoever judges the kernels' bf16 precision in the interpreter
    runs them within it, to measure the kernels and not the interpreter. Where triton runs
    compiled (or is not imported yet) there is nothing to change."""
    if not library_interpreted():
        yield
        return
    import numpy as np
    import torch
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    truncating = InterpreterBuilder.cast_impl

    def cast_impl(self: InterpreterBuilder, src: TensorHandle, dst_type: Any) -> TensorHandle:
        if src.dtype.scalar != tl.float32 or dst_type.scalar != tl.bfloat16:
            return truncating(self, src, dst_type)
        rounded = torch.from_numpy(np.array(src.data, dtype=np.float32)).to(torch.bfloat16)
        return TensorHandle(rounded.view(torch.int16).numpy().view(np.uint16), dst_type.scalar)

    InterpreterBuilder.cast_impl = cast_impl  # create_fp_trunc (casts, stores) calls it
    try:
        yield
    finally:
        InterpreterBuilder.cast_impl = truncating


@contextlib.contextmanager
def nearest_e4m3_rounding() -> Iterator[None]:
    """Within it, the Triton interpreter converts fp32 to float8_e4m3fn (`.to(tl.float8e4nv)`) as
    torch does: to nearest even, saturating at +-448, as compiled kernels do on sm_90
    (`cvt.rn.satfinite.e4m3x2.f32`). Triton 3.9's interpreter sends a tie to the odd neighbour and
    loses the carry into the next binade (127.99 -> 64; DESIGN.md): 1-3% of the values of a
    dynamically quantized activation one e4m3 step (2^-3) off, which a model's logits carry on,
    enough to change a greedy token of a random-weight model. Whoever compares an fp8 kernel with
    its torch reference in the interpreter runs it within this, to measure the kernel and not the
    interpreter. Where triton runs compiled (or is not imported yet) there is nothing to change."""
    if not library_interpreted():
        yield
        return
    import numpy as np
    import torch
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    converting = InterpreterBuilder.create_fp_to_fp

    def create_fp_to_fp(self: InterpreterBuilder, src: TensorHandle, dst_type: Any, rounding_mode: Any) -> TensorHandle:
        if src.dtype.scalar != tl.float32 or dst_type.scalar != tl.float8e4nv:
            return converting(self, src, dst_type, rounding_mode)
        rounded = torch.from_numpy(np.array(src.data, dtype=np.float32)).to(torch.float8_e4m3fn)
        return TensorHandle(rounded.view(torch.uint8).numpy(), dst_type.scalar)

    InterpreterBuilder.create_fp_to_fp = create_fp_to_fp
    try:
        yield
    finally:
        InterpreterBuilder.create_fp_to_fp = converting
