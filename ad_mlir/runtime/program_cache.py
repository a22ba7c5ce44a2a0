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

Module entries (`*.export` beside the programs): where ad-mlir exports an `nn.Module` itself
(`compile(model, example_inputs)`, `LLM`), a compile found by the fingerprint of that export
(`module_key`, `frontends/export_key.py`) before torch.export runs: the key of the program the
compile used (with the layers and period a shortened one is lengthened to), the user inputs'
specs and each weight's binding (the module's parameter or buffer of that name, or a lifted
constant's value). A second compile of the same module reads the entry and the program and
binds the module's weights: no export, no import, no passes. Written atomically, its first
line the sha256 of the pickled entry after it (pickled as the kernels are imported: this is the
user's own cache directory); a damaged one, or one whose program is missing or damaged, is a
miss (exported, compiled and rewritten).

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
import pickle
import platform
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

import torch
from xdsl.dialects.builtin import ModuleOp
from xdsl.parser import Parser
from xdsl.printer import Printer

from ad_mlir.codegen.cache import KernelCache, write_atomically
from ad_mlir.dialects import ad
from ad_mlir.frontends.fx_import import ImportedProgram
from ad_mlir.frontends.input_checks import InputSpec
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


def _versions() -> str:
    return "".join(f"{package}={version(package)}\n" for package in ("ad-mlir", "torch", "triton", "xdsl")) + \
        platform.python_version()


@functools.cache
def _compiler_fingerprint() -> str:
    """The versions and the source of the code that makes the pipeline's result."""
    from ad_mlir import dialects, passes, semantics

    h = hashlib.sha256(_versions().encode())
    for package in (passes, dialects, semantics):
        _hash_sources(h, Path(package.__file__).parent)
    return h.hexdigest()


def _hash_sources(h: hashlib._Hash, root: Path) -> None:
    """Every Python file below `root`, by its path relative to `root` and its bytes, into `h`."""
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())


def _weight_digest(kind: str, tensor: torch.Tensor) -> str:
    """A parameter's dtype and shape; a buffer's or constant's value as well (off the meta
    device, where there is none)."""
    described = f"{kind} {tensor.dtype} {tuple(tensor.shape)} {tensor.device.type}"
    if kind == ad.PARAM_ATTR or tensor.device.type == "meta":
        return described
    data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return f"{described} {hashlib.sha256(data).hexdigest()}"


def program_key(program: ImportedProgram, pipeline: PipelineConfig, rank: Rank,
                repeated: tuple[int, int] | None = None) -> str:
    """The key of the pipeline's result on `program` (see the module's docstring); `repeated`:
    the layers and period a shortened program stands for (`passes/repeated_layers.py`)."""
    h = hashlib.sha256(_compiler_fingerprint().encode())
    h.update(f"pipeline={pipeline.spec}\nskip_on_error={pipeline.skips_on_error()}\n".encode())
    h.update(f"rank={rank.rank}/{rank.world_size}\nrepeated={repeated}\n".encode())
    h.update(module_text(program.module).encode())
    kinds = _weight_kinds(program.module)
    for fqn in sorted(program.weights):
        h.update(f"{fqn}: {_weight_digest(kinds.get(fqn, ad.CONSTANT_TENSOR_ATTR), program.weights[fqn])}\n".encode())
    key = h.hexdigest()
    if (served := _SERVING.get()) is not None:
        served.repeated[key] = repeated
    return key


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
        _served(key)
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
        _served(key)

    # -- module entries ------------------------------------------------------------------

    def module_path(self, key: str) -> Path:
        return self.directory / f"{key[:32]}.export"

    def load_module(self, key: str) -> ModuleEntry | None:
        """The module entry stored under `key`, None when there is none or it cannot be used
        (then logged: the caller exports, compiles and stores it again)."""
        path = self.module_path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            log.warning("program cache module entry %s cannot be read (%s): exporting again", path, e)
            return None
        digest, _, payload = data.partition(b"\n")
        try:
            if digest.decode() != hashlib.sha256(payload).hexdigest():
                raise ValueError("checksum")
            stored_key, entry = pickle.loads(payload)  # noqa: S301 (our own cache directory, as the kernels it imports)
            if stored_key != key or not isinstance(entry, ModuleEntry):
                raise ValueError("another key")
        except Exception:  # noqa: BLE001 (whatever is wrong with an entry means: export and compile again)
            log.warning("program cache module entry %s is corrupt or stale: exporting again", path)
            return None
        return entry

    def store_module(self, key: str, entry: ModuleEntry) -> None:
        payload = pickle.dumps((key, entry), protocol=pickle.HIGHEST_PROTOCOL)
        self.directory.mkdir(parents=True, exist_ok=True)
        write_atomically(self.module_path(key), hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)


Binding = tuple[str, str] | torch.Tensor
"""How a module entry gets a weight: ("parameter" or "buffer", its name in the module), or the
value of a constant the export lifted."""


@dataclass(frozen=True)
class ModuleEntry:
    """A compile found by the fingerprint of its export (`module_key`): the program cache's
    entry the pass pipeline's result is in (with the layers and period it is lengthened to
    where it is a shortened program), and what the export gave beside the IR: the user inputs'
    specs (the compiled graph's input checks) and each weight's binding."""

    program: str
    repeated: tuple[int, int] | None
    input_specs: dict[str, InputSpec]
    weights: dict[str, Binding]


def module_key(fingerprint: str, pipeline: PipelineConfig, rank: Rank, layers_once: bool) -> str:
    """The key of a module entry: the export's fingerprint (`frontends/export_key.py`), the
    versions `program_key` hashes, transformers' version and every ad-mlir source (those of
    the passes, dialects and semantics that `program_key` hashes among them: the export, its
    patches and the import are ours too), the pipeline, the rank and whether repeated layers
    are compiled once."""
    h = hashlib.sha256(_export_fingerprint_sources().encode())
    h.update(f"pipeline={pipeline.spec}\nskip_on_error={pipeline.skips_on_error()}\n".encode())
    h.update(f"rank={rank.rank}/{rank.world_size}\nlayers_once={layers_once}\n{fingerprint}".encode())
    return h.hexdigest()


@functools.cache
def _export_fingerprint_sources() -> str:
    h = hashlib.sha256(f"{_versions()}\ntransformers={_version('transformers')}\n".encode())
    _hash_sources(h, Path(__file__).parents[1])  # the ad_mlir package
    return h.hexdigest()


def _version(package: str) -> str:
    try:
        return version(package)
    except Exception:  # noqa: BLE001 (not installed: its absence is what is keyed)
        return "none"


def module_bindings(module: torch.nn.Module, weights: dict[str, torch.Tensor]) -> dict[str, Binding]:
    """Each weight of an import as the module's parameter or buffer it is (the tensor itself,
    under the export's name where that names it), else by value (a lifted constant)."""
    named: dict[int, tuple[str, str]] = {}
    for kind, items in (("parameter", module.named_parameters(remove_duplicate=False)),
                        ("buffer", module.named_buffers(remove_duplicate=False))):
        for name, t in items:
            named.setdefault(id(t), (kind, name))
            if name in weights and weights[name] is t:
                named[id(t)] = (kind, name)
    return {fqn: named.get(id(t), t) for fqn, t in weights.items()}


def bound_weights(module: torch.nn.Module, bindings: dict[str, Binding]) -> dict[str, torch.Tensor]:
    """`module_bindings` undone on `module` (AttributeError where it lacks a name)."""
    return {fqn: b if isinstance(b, torch.Tensor) else
            (module.get_parameter(b[1]) if b[0] == "parameter" else module.get_buffer(b[1]))
            for fqn, b in bindings.items()}


@dataclass
class Served:
    """What the program cache served within `serving()`: the `repeated` of each key computed
    (`program_key`), and the key of the last program read or written (the one the compile used)."""

    repeated: dict[str, tuple[int, int] | None] = field(default_factory=dict)
    last: str | None = None


_SERVING: ContextVar[Served | None] = ContextVar("program_cache_serving", default=None)


@contextlib.contextmanager
def serving() -> Iterator[Served]:
    """Within: which program the program cache served (a module entry points to it)."""
    served = Served()
    token = _SERVING.set(served)
    try:
        yield served
    finally:
        _SERVING.reset(token)


def _served(key: str) -> None:
    if (served := _SERVING.get()) is not None:
        served.last = key
