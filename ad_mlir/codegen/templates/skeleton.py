"""The skeleton every generated kernel module shares, emitted from one place: the header (the
cache's key and provenance comment), the imports (torch, triton and the launch helpers the
launcher calls), the module's constants, then the template's own body. Templates differ only
in their helpers' names, their constants and their bodies."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

TL_DTYPE = {torch.float32: "tl.float32", torch.bfloat16: "tl.bfloat16", torch.float16: "tl.float16"}
"""The Triton element type of each tensor dtype a template takes."""


def dot_dtype_line(dtype: torch.dtype) -> str:
    """The `DOT_DTYPE` constant of a template: the tiles' dtype for `tl.dot`."""
    if dtype != torch.bfloat16:
        return f"DOT_DTYPE = tl.constexpr({TL_DTYPE[dtype]})"
    # The interpreter multiplies bf16 tiles as their raw uint16 bits: there the tiles,
    # already rounded to bf16, are multiplied in fp32 (the same products, accumulated in
    # fp32 as the tensor cores do). The jit decorator picks the interpreter the same way.
    return "DOT_DTYPE = tl.constexpr(tl.float32 if triton.knobs.runtime.interpret else tl.bfloat16)"


def module_source(header: str, launch_helpers: Mapping[str, Sequence[str]], constants: Sequence[str],
                  body: Sequence[str]) -> str:
    """A kernel module's text: `header`, the imports (the grid arithmetic of `codegen/launch.py`,
    and `launch_helpers`: module -> the names its launcher calls), `constants` (one assignment a
    line) and the `body` parts (helpers, the `@triton.jit` kernel, `OUTPUT_DTYPES`/
    `output_shapes`/`launch`), a blank line apart."""
    imports = {"ad_mlir.codegen.launch": ["cdiv", "next_power_of_2"]}
    for module, names in launch_helpers.items():
        imports[module] = [*imports.get(module, []), *names]
    lines = [header, "import torch", "import triton", "import triton.language as tl", ""]
    lines += [f"from {module} import {', '.join(names)}" for module, names in imports.items()]
    lines += ["", *constants, "", ""] if constants else ["", ""]
    for i, part in enumerate(body):
        lines += [part] if i == 0 else ["", part]
    return "\n".join(lines)
