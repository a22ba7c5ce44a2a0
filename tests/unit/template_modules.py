"""Kernel template modules for the template tests, loaded as the kernel cache loads them: each
emitted source written to a real file (`@triton.jit` reads it with `inspect.getsource`) and
imported under a name unique to its spec, once per spec."""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Callable, Hashable
from pathlib import Path
from types import ModuleType


def template_builder(directory: Path, prefix: str,
                     emit: Callable[[Hashable, str, str], str]) -> Callable[[Hashable], ModuleType]:
    """`build(spec) -> module` for `emit(spec, name, header) -> source`; the module's
    `kernel_name` is its kernel's name."""
    modules: dict[Hashable, ModuleType] = {}

    def build(spec: Hashable) -> ModuleType:
        if spec not in modules:
            name = f"{prefix}_" + hashlib.sha256(repr(spec).encode()).hexdigest()[:12]
            path = directory / f"{name}.py"
            path.write_text(emit(spec, name, f"# test kernel for {spec}\n"))
            module_spec = importlib.util.spec_from_file_location(f"test_template_kernels.{name}", path)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
            module.kernel_name = name
            modules[spec] = module
        return modules[spec]

    return build
