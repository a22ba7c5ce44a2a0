"""The on-disk compiled-program cache: the `ad` module the pass pipeline made, kept beside the
kernel cache (in `programs/` under its directory, `codegen/cache.py`), so that compiling the same
program again, in any process, parses the pipeline's result instead of running the passes (and
code generation finds every kernel in the kernel cache).

An entry's key is the sha256 of everything the pipeline's result depends on:
- the imported module's text: its ops, types (every weight's shape and dtype), locations and
  the weights' names;
- the values of the weights that are not parameters (buffers and tensor constants: RoPE's
  inverse frequencies, ALiBi's slopes, a mask held as a buffer; small). The passes read the IR
  alone today (a mask or bias computation they evaluate may read the token positions only), but
  a value a pass could read must not be served from another model's compile;
- the pipeline (its pass string and whether a failing pass is skipped), the world size and rank;
- the versions of ad-mlir, torch, Triton and xDSL and the source of the passes, dialects and op
  semantics (a development checkout changes without its version).
Where the decoder layers repeat (`passes/repeated_layers.py`), the module keyed and stored is the
shortened program (which keeps every weight argument) with the count of layers it stands for and
their period: those determine the whole program, and a program read is lengthened again.
What the weights are made into is not cached: the exporter computes the concatenated weights of
`fuse-gemms`, FP8-quantized weights and shards from the weights of each compile.

What the passes warned of while compiling it (a pass skipped on error, a fusion refused) is
stored with the entry and logged again at each read, so a reused program says what it lacks.

An entry is written atomically (temp file + `os.replace`, `codegen/cache.write_atomically`), so
concurrent writers of one key each leave a whole file, and ends in a checksum line; an entry that
is truncated, corrupt or does not parse is logged, compiled again and rewritten.
AD_MLIR_PROGRAM_CACHE=0 turns the cache off (the test suite does, so that every test runs the
passes it checks).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import logging
import os
import platform
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import torch
from xdsl.dialects.builtin import ModuleOp
from xdsl.parser import Parser
from xdsl.printer import Printer

from ad_mlir.codegen.cache import KernelCache, write_atomically
from ad_mlir.dialects import ad
from ad_mlir.frontends.fx_import import ImportedProgram
from ad_mlir.passes.pipeline import PipelineConfig, make_context
from ad_mlir.semantics.weights import Rank

log = logging.getLogger(__name__)

PROGRAM_CACHE_VARIABLE = "AD_MLIR_PROGRAM_CACHE"
"""`0` turns the program cache off."""
_KEY = "// key: "
_WARNING = "// warning: "
_CHECKSUM = "// checksum: "
PASS_LOGGER = "ad_mlir.passes"
"""The logger the pipeline and every pass log under: its warnings are kept with the program."""


def program_cache_enabled() -> bool:
    return os.environ.get(PROGRAM_CACHE_VARIABLE, "1") != "0"


def module_text(module: ModuleOp) -> str:
    """The module in the generic format, with locations (the compiled graph's `ad_source`)."""
    out = io.StringIO()
    Printer(stream=out, print_generic_format=True, print_debuginfo=True).print_op(module)
    return out.getvalue() + "\n"


@functools.cache
def _compiler_fingerprint() -> str:
    """The versions and the source of the code that makes the pipeline's result."""
    from ad_mlir import dialects, passes, semantics

    h = hashlib.sha256()
    for package in ("ad-mlir", "torch", "triton", "xdsl"):
        h.update(f"{package}={version(package)}\n".encode())
    h.update(platform.python_version().encode())
    for package in (passes, dialects, semantics):
        root = Path(package.__file__).parent
        for path in sorted(root.rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def _weight_digest(kind: str, tensor: torch.Tensor) -> str:
    """A parameter's dtype and shape; a buffer's or constant's value as well (off the meta
    device, where there is none)."""
    described = f"{kind} {tensor.dtype} {tuple(tensor.shape)} {tensor.device.type}"
    if kind == ad.PARAM_ATTR or tensor.device.type == "meta":
        return described
    data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return f"{described} {hashlib.sha256(data).hexdigest()}"


def program_key(program: ImportedProgram, pipeline: PipelineConfig, rank: Rank, repeated: str = "") -> str:
    """The key of the pipeline's result on `program` (see the module's docstring); `repeated`
    says how many layers a shortened program stands for (`passes/repeated_layers.py`)."""
    h = hashlib.sha256(_compiler_fingerprint().encode())
    h.update(f"pipeline={pipeline.spec}\nskip_on_error={pipeline.skips_on_error()}\n".encode())
    h.update(f"rank={rank.rank}/{rank.world_size}\nrepeated={repeated}\n".encode())
    h.update(module_text(program.module).encode())
    kinds = _weight_kinds(program.module)
    for fqn in sorted(program.weights):
        h.update(f"{fqn}: {_weight_digest(kinds.get(fqn, ad.CONSTANT_TENSOR_ATTR), program.weights[fqn])}\n".encode())
    return h.hexdigest()


def _weight_kinds(module: ModuleOp) -> dict[str, str]:
    """FQN -> `ad.param` / `ad.buffer` / `ad.constant_tensor`, from the function's arguments."""
    from ad_mlir.dialects.weights import weight_of

    kinds = {}
    for fn in module.ops:
        for attrs in getattr(fn, "arg_attrs", None) or []:
            if (weight := weight_of(attrs)) is not None:
                kinds[weight[1]] = weight[0]
    return kinds


def checksum(text: str) -> str:
    """The sha256 an entry's last line gives of the text before it."""
    return hashlib.sha256(text.encode()).hexdigest()


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(" ".join(record.getMessage().split()))


@contextlib.contextmanager
def pass_warnings() -> Iterator[list[str]]:
    """The warnings the passes log within (one line each), to store with their program."""
    handler = _Collect()
    logger = logging.getLogger(PASS_LOGGER)
    logger.addHandler(handler)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)


@dataclass(frozen=True)
class StoredProgram:
    module: ModuleOp
    warnings: tuple[str, ...]
    """What the passes warned of when it was compiled."""


@dataclass
class ProgramCache:
    directory: Path
    hits: int = 0
    """Programs read from a valid entry."""
    stored: int = 0
    """Programs written now."""

    @classmethod
    def beside(cls, kernels: KernelCache) -> ProgramCache:
        """The program cache in `programs/` of the kernel cache's directory."""
        return cls(kernels.directory / "programs")

    def path(self, key: str) -> Path:
        return self.directory / f"{key[:32]}.mlir"

    def load(self, key: str) -> StoredProgram | None:
        """The program stored under `key` (its warnings logged again), None when there is none
        or it cannot be used (then logged: the caller compiles and stores it again)."""
        path = self.path(key)
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as e:
            log.warning("program cache entry %s cannot be read (%s): compiling again", path, e)
            return None
        body, _, last = text.rstrip("\n").rpartition("\n")
        if last != _CHECKSUM + checksum(body + "\n") or not body.startswith(_KEY + key + "\n"):
            log.warning("program cache entry %s is corrupt or stale: compiling again", path)
            return None
        lines = body.split("\n")[1:]
        warnings = tuple(line.removeprefix(_WARNING) for line in lines if line.startswith(_WARNING))
        try:
            module = Parser(make_context(), "\n".join(lines[len(warnings):])).parse_module()
            module.verify()
        except Exception as e:  # noqa: BLE001 (any failure to rebuild the module means: compile again)
            log.warning("program cache entry %s does not parse (%s): compiling again", path, " ".join(str(e).split()))
            return None
        self.hits += 1
        log.info("program cache: %s read, the pass pipeline skipped", path)
        for warning in warnings:
            log.warning("%s (logged when the stored program %s was compiled)", warning, path.name)
        return StoredProgram(module, warnings)

    def store(self, key: str, module: ModuleOp, warnings: Sequence[str] = ()) -> None:
        """Write `module` (and the warnings its passes logged) under `key`."""
        said = "".join(f"{_WARNING}{' '.join(w.split())}\n" for w in warnings)
        body = f"{_KEY}{key}\n{said}{module_text(module)}"
        self.directory.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path(key), body + _CHECKSUM + checksum(body) + "\n")
        self.stored += 1
