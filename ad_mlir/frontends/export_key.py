"""The fingerprint of an export (`ModuleExport`): a sha256 of what decides the program
`torch.export` makes of an `nn.Module` called with given example inputs, so that the
compiled-program cache can serve a compile of the same export without running torch.export
(its module entries, `runtime/program_cache.py`; the versions, our sources and the pipeline are
added there). Where a part of the module cannot be described exactly, there is no fingerprint
(`Unkeyable`, saying what): the module is exported and compiled as without the cache.

Hashed (a change in any of these is another fingerprint):
- the module tree: each submodule's path (every path of a shared one), class and training flag,
  and its instance attributes (numbers, strings, dtypes, devices, enums and containers of them;
  tensors by value; HF configs; functions by their code, defaults and closures, so a `forward`
  set on an instance counts; classes by name; the tree's own modules by path). An attribute of
  any other kind, a forward hook or pre-hook on a module or global, or a state-dict hook makes
  the module `Unkeyable`;
- every class of the tree and its bases (below `nn.Module`): the source file, and the code of
  each function, property and static or class method in the class's dict (a method replaced at
  run time is other code);
- the Python modules defining those classes, and one step further the modules of the same
  package (not torch's: its version is keyed) that the functions they hold as globals come
  from (`masking_utils` for a modeling file's `create_causal_mask`): each one's source file, and its globals: the code of its functions,
  the names of its classes and Python modules, its numbers and flags, and the functions its registries
  hold (HF's `ALL_ATTENTION_FUNCTIONS`, whatever `_attn_implementation` names);
- HF configs (and generation configs): `to_json_string(use_diff=False)` and the private
  attributes it leaves out (`_attn_implementation_internal`, ...);
- parameters and buffers: every name (tied ones under each of theirs, with what they are tied
  to), shape, stride, dtype, device, whether a buffer is persistent, and buffers' values;
- the example inputs: their structure, each tensor's shape, stride, dtype, device and value
  (off the meta device), each scalar's value; the dynamic_shapes spec (each `Dim`'s name and
  range);
- grad mode, the autocast state of the CPU and CUDA, the default dtype and device; the
  export's own arguments (`generation`, what it runs within).
A tensor subclass (quantized, distributed) among the weights or inputs is Unkeyable.

Not seen (documented in docs/codegen.md): a function replaced at run time in a Python module
not listed above (torch's, another package's, or a transformers helper two imports away from
the modeling file), a string global, torch's own settings (`torch._dynamo.config`, ...),
and Python state outside the module tree that the forward reads (a global flag of another
module). Use `AD_MLIR_PROGRAM_CACHE=0` or `verify=True` where such things change between
compiles.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import os
import sys
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ad_mlir.frontends.export import ModuleExport


class Unkeyable(ValueError):
    """Part of the module or its inputs that the fingerprint cannot describe exactly."""


_HOOKS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
          "_forward_pre_hooks_with_kwargs", "_state_dict_hooks", "_state_dict_pre_hooks")
"""Module hooks that change what the export traces or the weights it names: none may be set."""
_NOT_TRACED = frozenset(("_parameters", "_buffers", "_modules", "_backward_hooks", "_backward_pre_hooks",
                         "_is_full_backward_hook", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks"))
"""`nn.Module` internals hashed apart (weights, submodules) or not read by an inference export."""
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_hooks_with_kwargs", "_global_forward_hooks_always_called",
                 "_global_forward_pre_hooks")
_SCALARS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size,
            torch.layout, torch.memory_format)
_CONFIG_IDENTITY = frozenset(("_original_object_hash",))
"""A config's private attributes that identify the object, not what it configures (a
generation config's hash of itself, another in each process)."""
_MAX_DEPTH = 8
"""Nesting of containers and closures a description follows before it gives up (`Unkeyable`)."""


def export_fingerprint(source: ModuleExport) -> str:
    """The fingerprint of `source`'s export (see the module's doc); Unkeyable where the module
    or its inputs hold something it cannot describe."""
    return _Fingerprint(source.module).of(source)


class _Fingerprint:
    def __init__(self, root: torch.nn.Module) -> None:
        self.hash = hashlib.sha256()
        self.paths = {id(m): name for name, m in reversed(list(root.named_modules(remove_duplicate=False)))}
        """Each module of the tree by its first path."""
        self.classes: dict[type, None] = {}
        self.modules: dict[str, None] = {}
        self.configs: dict[int, str] = {}

    def add(self, *parts: object) -> None:
        self.hash.update("\x1f".join(map(str, parts)).encode() + b"\x1e")

    def of(self, source: ModuleExport) -> str:
        module = source.module
        if isinstance(module, torch.fx.GraphModule):
            raise Unkeyable("a GraphModule's forward is generated code")
        for hooks in _GLOBAL_HOOKS:
            if getattr(torch.nn.modules.module, hooks, None):
                raise Unkeyable(f"a global module hook is set (torch.nn.modules.module.{hooks})")
        self._tree(module)
        self._weights(module)
        self._inputs(source)
        self.add("grad", torch.is_grad_enabled(), "default dtype", torch.get_default_dtype(),
                 "default device", torch.get_default_device())
        for device in ("cpu", "cuda"):
            self.add("autocast", device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        self.add("generation", source.generation, "around", self.value(source.around, "the export's context"))
        self._classes()
        return self.hash.hexdigest()

    # -- the module tree ------------------------------------------------------------------

    def _tree(self, root: torch.nn.Module) -> None:
        for path, module in root.named_modules(remove_duplicate=False):
            where = path or "the model"
            self.add("module", path, _qualname(type(module)), module.training)
            self._class(type(module))
            for hooks in _HOOKS:
                if getattr(module, hooks, None):
                    raise Unkeyable(f"{where} ({type(module).__name__}) has {hooks.strip('_').replace('_', ' ')}")
            for name, value in sorted(vars(module).items()):
                if name not in _NOT_TRACED and name not in _HOOKS:
                    self.add("attribute", name, self.value(value, f"{where}.{name}"))

    def _weights(self, root: torch.nn.Module) -> None:
        first: dict[int, str] = {}
        for name, p in root.named_parameters(remove_duplicate=False):
            tied = first.setdefault(id(p), name)
            self.add("parameter", name, tied, _tensor_meta(p), p.requires_grad)
        for path, module in root.named_modules(remove_duplicate=False):
            for name, b in module._buffers.items():
                if b is None:
                    continue
                full = f"{path}.{name}" if path else name
                tied = first.setdefault(id(b), full)
                persistent = name not in module._non_persistent_buffers_set
                self.add("buffer", full, tied, persistent, _tensor(b))

    def _inputs(self, source: ModuleExport) -> None:
        leaves, spec = pytree.tree_flatten((source.args, source.kwargs))
        self.add("inputs", spec)
        for i, leaf in enumerate(leaves):
            self.add("input", i, self.value(leaf, f"example input {i}"))
        shapes, shape_spec = pytree.tree_flatten(source.dynamic_shapes, is_leaf=lambda x: x is None or _is_dim(x))
        self.add("dynamic shapes", shape_spec)
        for dim in shapes:
            self.add("dim", _dim(dim))

    # -- values ---------------------------------------------------------------------------

    def value(self, value: Any, where: str, depth: int = 0) -> str:
        """A description of `value` that differs where the export could differ."""
        if depth > _MAX_DEPTH:
            raise Unkeyable(f"{where} nests too deeply to describe")
        if isinstance(value, _SCALARS) or isinstance(value, enum.Enum):
            return f"{type(value).__qualname__}:{value!r}"
        if isinstance(value, torch.Tensor):
            return _tensor(value)
        if isinstance(value, tuple | list):
            return f"{type(value).__qualname__}[{', '.join(self.value(v, where, depth + 1) for v in value)}]"
        if isinstance(value, set | frozenset):
            return f"{type(value).__qualname__}{{{', '.join(sorted(self.value(v, where, depth + 1) for v in value))}}}"
        if isinstance(value, dict):
            items = sorted(f"{self.value(k, where, depth + 1)}: {self.value(v, where, depth + 1)}"
                           for k, v in value.items())
            return f"{type(value).__qualname__}{{{', '.join(items)}}}"
        if isinstance(value, torch.nn.Module):
            if id(value) not in self.paths:
                raise Unkeyable(f"{where} is a module outside the model's tree ({type(value).__name__})")
            return f"module {self.paths[id(value)]}"
        if callable(getattr(value, "to_json_string", None)):  # an HF config or generation config
            return self._config(value, where, depth)
        return self._callable(value, where, depth)

    def _callable(self, value: Any, where: str, depth: int) -> str:
        if isinstance(value, types.FunctionType):
            closure = [self.value(c.cell_contents, where, depth + 1) for c in value.__closure__ or ()]
            return (f"function {value.__module__}.{value.__qualname__} {_code(value.__code__)} "
                    f"{self.value(value.__defaults__, where, depth + 1)} "
                    f"{self.value(value.__kwdefaults__, where, depth + 1)} {closure}")
        if isinstance(value, types.MethodType):
            return f"method {self._callable(value.__func__, where, depth + 1)} of {self.value(value.__self__, where, depth + 1)}"
        if isinstance(value, functools.partial):
            return (f"partial {self.value(value.func, where, depth + 1)} {self.value(value.args, where, depth + 1)} "
                    f"{self.value(value.keywords, where, depth + 1)}")
        if isinstance(value, type):
            self._class(value)
            return f"class {_qualname(value)}"
        if isinstance(value, types.ModuleType):
            return f"module {value.__name__}"
        if isinstance(value, types.BuiltinFunctionType | torch._ops.OpOverload | torch._ops.OpOverloadPacket):
            return f"builtin {getattr(value, '__module__', '')}.{getattr(value, '__qualname__', value)}"
        raise Unkeyable(f"{where} is a {type(value).__qualname__}, which the compiled-program cache cannot key")

    def _config(self, config: Any, where: str, depth: int) -> str:
        if id(config) not in self.configs:
            self.configs[id(config)] = self._describe_config(config, where, depth)
        return self.configs[id(config)]

    def _describe_config(self, config: Any, where: str, depth: int) -> str:
        private = {k: v for k, v in vars(config).items() if k.startswith("_") and k not in _CONFIG_IDENTITY}
        try:
            text = config.to_json_string(use_diff=False)
        except (TypeError, ValueError) as e:
            raise Unkeyable(f"{where}: {type(config).__name__}.to_json_string failed ({e})") from e
        return f"config {_qualname(type(config))} {text} {self.value(private, where, depth + 1)}"

    # -- classes and their Python modules --------------------------------------------------

    def _class(self, cls: type) -> None:
        for base in cls.__mro__:
            if base in (torch.nn.Module, object) or base in self.classes:
                continue
            self.classes[base] = None
            self.modules.setdefault(base.__module__)

    def _classes(self) -> None:
        for cls in list(self.classes):
            self.add("class", _qualname(cls), *(_member(name, v) for name, v in sorted(vars(cls).items())))
        further: dict[str, None] = {}
        for name in self.modules:
            self._python_module(name, further, required=True)
        for name in further:
            if name not in self.modules:
                self._python_module(name, {}, required=False)

    def _python_module(self, name: str, further: dict[str, None], required: bool) -> None:
        """A Python module's source file and globals; a module of the tree's classes without a
        source file is Unkeyable (one a function comes from is skipped: its code is hashed)."""
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if path is None or not os.path.exists(path):
            if required:
                raise Unkeyable(f"Python module {name} has no source file (a class defined interactively?)")
            return
        self.add("source", name, _file_digest(path))
        imported: dict[str, None] = {}
        for key, value in sorted(vars(module).items()):
            if not key.startswith("__"):
                self.add("global", key, _global(value, imported))
        package = name.partition(".")[0]
        further.update((m, None) for m in imported if m and m.partition(".")[0] == package != "torch")


def _global(value: Any, further: dict[str, None]) -> str:
    """A Python module's global: functions by code (the module they come from kept in `further`),
    classes and modules by name, scalars by value, registries by the functions they hold; other
    objects by type (their state is not hashed)."""
    if isinstance(value, types.FunctionType):
        further.setdefault(value.__module__)
        return f"function {value.__module__}.{value.__qualname__} {_function_code(value)}"
    if isinstance(value, type):
        return f"class {_qualname(value)}"
    if isinstance(value, types.ModuleType):
        return f"module {value.__name__}"
    if isinstance(value, bool | int | float | type(None)):  # strings are names, paths, session ids
        return f"{type(value).__qualname__}:{value!r}"
    if isinstance(value, Mapping):
        return f"registry {_registry(value, further)}"
    return f"a {type(value).__qualname__}"


def _registry(mapping: Mapping[Any, Any], further: dict[str, None]) -> str:
    """The functions a mapping holds by name (HF's attention and mask functions by
    `_attn_implementation`), by code."""
    try:
        items = list(mapping.items())
    except Exception:  # noqa: BLE001 (a mapping that cannot be listed holds no registry we could read)
        return "?"
    return ", ".join(sorted(f"{k!s}: {_global(v, further)}" for k, v in items if isinstance(v, types.FunctionType)))


def _member(name: str, value: Any) -> str:
    """A class dict's entry: code for functions, properties and static/class methods."""
    if isinstance(value, staticmethod | classmethod):
        value = value.__func__
    if isinstance(value, property):
        return f"{name}: property {[_function_code(f) for f in (value.fget, value.fset) if isinstance(f, types.FunctionType)]}"
    if isinstance(value, types.FunctionType):
        return f"{name}: {_function_code(value)}"
    if isinstance(value, _SCALARS):
        return f"{name}: {value!r}"
    return f"{name}: {type(value).__qualname__}"


# -- leaves -----------------------------------------------------------------------------


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


_CODE_DIGESTS: dict[int, tuple[types.CodeType, str]] = {}
"""Code objects are immutable: each one's digest is computed once (the entry holds it alive, so
its id is not reused)."""


def _function_code(fn: types.FunctionType, depth: int = 0) -> str:
    """A function's code with the code of the functions its closure holds (what a decorator
    wraps: `can_return_tuple(forward)` is the decorator's code around `forward`'s)."""
    inner = [_function_code(c.cell_contents, depth + 1) for c in fn.__closure__ or ()
             if depth < _MAX_DEPTH and isinstance(c.cell_contents, types.FunctionType)]
    return f"{_code(fn.__code__)}{inner or ''}"


def _code(code: types.CodeType) -> str:
    """A digest of what a code object does: its bytecode, names, constants (nested code by its
    digest) and signature. Not `marshal.dumps`, whose bytes depend on reference counts."""
    hit = _CODE_DIGESTS.get(id(code))
    if hit is None or hit[0] is not code:
        text = "\x1f".join((code.co_code.hex(), repr(code.co_names), repr(code.co_varnames), repr(code.co_freevars),
                            repr(code.co_cellvars), code.co_qualname, str(code.co_flags),
                            str((code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount)),
                            *(_constant(c) for c in code.co_consts)))
        hit = _CODE_DIGESTS[id(code)] = (code, hashlib.sha256(text.encode()).hexdigest()[:32])
    return hit[1]


def _constant(value: Any) -> str:
    if isinstance(value, types.CodeType):
        return f"code {_code(value)}"
    if isinstance(value, tuple):
        return f"({', '.join(map(_constant, value))})"
    if isinstance(value, frozenset):  # its order follows string hashing, another in each process
        return f"frozenset({sorted(map(_constant, value))})"
    return f"{type(value).__name__}:{value!r}"


_FILE_DIGESTS: dict[tuple[str, int, int], str] = {}


def _file_digest(path: str) -> str:
    """sha256 of a source file, read again when its size or modification time changes."""
    stat = os.stat(path)
    key = (path, stat.st_mtime_ns, stat.st_size)
    if key not in _FILE_DIGESTS:
        _FILE_DIGESTS[key] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return _FILE_DIGESTS[key]


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter, torch.nn.Buffer)


def _tensor_meta(t: torch.Tensor) -> str:
    if type(t) not in _PLAIN_TENSORS:  # a subclass (quantized, distributed) may hold what the trace reads
        raise Unkeyable(f"a {type(t).__qualname__} tensor is not keyed")
    return f"{type(t).__name__} {t.dtype} {tuple(t.shape)} {t.stride()} {t.device}"


def _tensor(t: torch.Tensor) -> str:
    """Shape, stride, dtype, device and, off the meta device, the value's sha256."""
    if t.device.type == "meta":
        return _tensor_meta(t)
    data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return f"{_tensor_meta(t)} {hashlib.sha256(data).hexdigest()}"


def _is_dim(x: Any) -> bool:
    from torch.export.dynamic_shapes import Dim, _DimHint

    return isinstance(x, int | Dim | _DimHint)


def _dim(dim: Any) -> str:
    """A dynamic_shapes leaf: None, a static size, a `Dim.AUTO`-style hint, or a named `Dim` with
    its range; any other (a derived dim, `2 * seq`, whose function is not compared) is
    Unkeyable."""
    from torch.export.dynamic_shapes import Dim, _DimHint

    if dim is None or isinstance(dim, int | _DimHint):
        return repr(dim)
    if type(dim) is Dim:
        return f"Dim {dim.__name__} [{dim.min}, {dim.max}]"
    raise Unkeyable(f"dynamic_shapes: {dim!r} ({type(dim).__name__}) is not keyed")
