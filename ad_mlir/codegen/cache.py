"""The on-disk kernel cache: one `.py` file per region kernel, imported from there.

A kernel's key is the sha256 of its region's canonical text (no value names: equal regions
give equal text), the Triton version and the codegen's own source. The file is written
atomically (temp file + `os.replace`) and ends in a checksum line; a file whose checksum or
key does not match (truncated, corrupt, written by another version) is regenerated.
Triton's `@triton.jit` reads kernel source with `inspect.getsource`, so kernels are imported
from real files, never `exec`'d from strings.

The directory is `$AD_MLIR_CACHE_DIR`, else `$XDG_CACHE_HOME/ad_mlir/kernels`, else
`~/.cache/ad_mlir/kernels`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import io
import logging
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from xdsl.printer import Printer

from ad_mlir.codegen.interpreter import kernel_loading
from ad_mlir.codegen.lowering import emit_kernel_source
from ad_mlir.dialects import ad, kernel_forms

log = logging.getLogger(__name__)

_CHECKSUM = "# checksum: "


def default_cache_dir() -> Path:
    if "AD_MLIR_CACHE_DIR" in os.environ:
        return Path(os.environ["AD_MLIR_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "ad_mlir" / "kernels"


def region_text(op: ad.FusedOp) -> str:
    """The body as text with value names stripped: the part of the key that is the region."""
    body = op.body.clone()
    for block in body.blocks:
        for arg in block.args:
            arg.name_hint = None
        for inner in block.ops:
            for r in inner.results:
                r.name_hint = None
    out = io.StringIO()
    Printer(stream=out).print_region(body)
    return out.getvalue()


@functools.cache
def _codegen_fingerprint() -> str:
    """Changes whenever the code that writes kernels changes (so old entries are not reused)."""
    import triton

    from ad_mlir.codegen import emitters, launch, lowering, templates
    from ad_mlir.dialects import decompositions

    h = hashlib.sha256(triton.__version__.encode())
    machinery = [Path(m.__file__) for m in (lowering, emitters, launch, decompositions, kernel_forms)]
    # Every template by its folder, so a new template is in the key without being listed here.
    for path in [*machinery, *sorted(Path(templates.__file__).parent.rglob("*.py"))]:
        h.update(path.read_bytes())
    return h.hexdigest()


def kernel_key(op: ad.FusedOp) -> str:
    return hashlib.sha256((region_text(op) + _codegen_fingerprint()).encode()).hexdigest()


_ROLE_OPS = 3


def kernel_name(op: ad.FusedOp, key: str, label: str | None = None) -> str:
    """`label` or else the role (`poi` pointwise, `red` row reduction) and the first distinct
    compute ops; then a short hash."""
    if label is not None:
        return f"{label}_{key[:10]}"
    inner = [o for o in op.body.block.ops if not isinstance(o, ad.ConstantOp | ad.YieldOp)]
    role = "red" if any(isinstance(o, kernel_forms.REDUCTIONS) for o in inner) else "poi"
    names = list(dict.fromkeys(o.name.removeprefix("ad.") for o in inner))[:_ROLE_OPS]
    return "_".join([role, *names, key[:10]])


def _checksum(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _valid(text: str, key: str) -> bool:
    body, _, last = text.rstrip("\n").rpartition("\n")
    return last == _CHECKSUM + _checksum(body + "\n") and f"# key: {key}\n" in body


def write_atomically(path: Path, text: str | bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


@dataclass(frozen=True)
class CachedKernel:
    name: str
    key: str
    path: Path
    module: ModuleType

    @property
    def jit_function(self):  # noqa: ANN201 (a triton JITFunction or InterpretedFunction)
        return getattr(self.module, self.name)


@dataclass
class KernelCache:
    directory: Path = field(default_factory=default_cache_dir)
    generated: int = 0
    """Kernels written now."""
    hits: int = 0
    """Kernels read from a valid file in the directory."""
    shared: int = 0
    """Regions whose kernel this cache had already loaded (equal regions share a kernel)."""
    _loaded: dict[str, CachedKernel] = field(default_factory=dict)

    def get(self, op: ad.FusedOp, label: str | None = None) -> CachedKernel:
        """The region's kernel: from memory, from disk, or generated now and written. `label`
        names it in place of its role and first ops (a kernel op's name)."""
        key = kernel_key(op)
        if key in self._loaded:
            self.shared += 1
            return self._loaded[key]
        name = kernel_name(op, key, label)
        path = self.directory / f"{name}.py"
        if path.exists() and _valid(path.read_text(), key):
            self.hits += 1
        else:
            if path.exists():
                log.warning("kernel cache entry %s is corrupt or stale: regenerating it", path)
            self.directory.mkdir(parents=True, exist_ok=True)
            write_atomically(path, self.source(op, name, key))
            self.generated += 1
        kernel = CachedKernel(name, key, path, _import(path, name))
        self._loaded[key] = kernel
        return kernel

    @staticmethod
    def source(op: ad.FusedOp, name: str, key: str) -> str:
        header = f"# ad-mlir kernel {name}\n# key: {key}\n"
        body = emit_kernel_source(op, name, header)
        return body + _CHECKSUM + _checksum(body) + "\n"


def _import(path: Path, name: str) -> ModuleType:
    module_name = f"ad_mlir_kernels.{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        with kernel_loading():
            spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]  # a half-made module must not stand in for a later, good file
        raise
    return module
