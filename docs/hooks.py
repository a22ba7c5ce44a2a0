"""mkdocs hooks: the reference parts of the docs are generated from the code at build time.

- `<!-- ad:ops -->` becomes the list of every op of the `ad` dialect (`ad_mlir.dialects.ad.Ad`):
  its docstring, operands, results, properties and assembly format, read from the IRDL definitions.
- `<!-- ad:pass NAME -->` becomes a pass's reference: the docstring of its module (what it
  matches and makes) and its options (the ModulePass dataclass fields), through the registry.
- `<!-- ad:mixers -->` becomes the cached mixers of `insert-cached-attention`: each line of its
  table (`ad_mlir.passes.cache.table.MIXERS`) with its module's docstring, in the table's order,
  then the docstrings of the modules they share.
- `<!-- ad:include PATH -->` becomes the markdown file PATH of the repository (committed benchmark
  results), its title dropped and its headings kept below the page's.
- `<!-- ad:example FILE SPLIT ARGS -->` becomes an IR example: split SPLIT of the FileCheck input
  tests/filecheck/FILE without its RUN/CHECK lines, then what `ad-opt ARGS` prints for it, run now.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- ad:(ops|pass|mixers|example|include)\s*(.*?)\s*-->$", re.MULTILINE)
"""A marker is a line of its own (a mention inside a sentence or code stays as written)."""


def on_page_markdown(markdown: str, **_: Any) -> str:
    return MARKER.sub(_expand, markdown)


def _expand(match: re.Match[str]) -> str:
    kind, args = match.group(1), match.group(2)
    if kind == "ops":
        return _ops_reference()
    if kind == "pass":
        return _pass_reference(args)
    if kind == "mixers":
        return _cached_mixers()
    if kind == "include":
        return _included(args)
    file, split, *opt_args = shlex.split(args)
    return _ir_example(file, int(split), opt_args)


# --- the dialect ---------------------------------------------------------------------------------


def _ops_reference() -> str:
    from xdsl.irdl import IRDLOperation

    from ad_mlir.dialects import ad

    sections = []
    for op in sorted(ad.Ad.operations, key=lambda o: o.name):
        definition = op.get_irdl_definition()
        rows = [f"| operand | `{n}` | {_constraint(d)} |" for n, d in definition.operands]
        rows += [f"| result | `{n}` | {_constraint(d)} |" for n, d in definition.results]
        rows += [f"| property | `{n}` | {_constraint(d)} |" for n, d in definition.properties.items()
                 if n != "operandSegmentSizes"]  # how optional operands are counted, not a user's property
        rows += [f"| attribute | `{n}` | {_constraint(d)} |" for n, d in definition.attributes.items()]
        rows += [f"| region | `{n}` | |" for n, _ in definition.regions]
        table = "| | name | constraint |\n|---|---|---|\n" + "\n".join(rows) if rows else ""
        group = next((b.__name__ for b in op.__mro__[1:] if b.__module__ == ad.__name__ and b is not IRDLOperation),
                     "")
        fmt = f"\n\nAssembly format:\n\n```text\n{definition.assembly_format}\n```" if definition.assembly_format else ""
        sections.append(
            f"### `{op.name}`\n\n`ad.{op.__name__}`{f' ({group})' if group else ''}. {_doc(op, IRDLOperation)}"
            f"{fmt}\n\n{table}\n"
        )
    return f"{len(sections)} ops.\n\n" + "\n".join(sections)


def _doc(cls: type, stop: type) -> str:
    """The op's docstring, else the nearest base class's (shared op signatures live in bases)."""
    for base in cls.__mro__:
        if base is stop:
            break
        if base.__doc__:
            return inspect.cleandoc(base.__doc__)
    return ""


def _constraint(definition: Any) -> str:
    kind = type(definition).__name__
    prefix = "optional " if kind.startswith("Opt") else "variadic " if kind.startswith("Var") else ""
    return f"{prefix}{_constraint_text(getattr(definition, 'constr', definition))}".replace("|", "\\|")


def _constraint_text(constr: Any) -> str:
    """An IRDL constraint in words: `tensor`, `tensor or one of f64, index, i1, i64`, ..."""
    name = type(constr).__name__
    if name == "BaseAttr":
        return {"TensorType": "tensor"}.get(constr.attr.__name__, f"`{constr.attr.__name__}`")
    if name == "AnyOf":
        return " or ".join(_constraint_text(c) for c in constr.attr_constrs)
    if name == "AttrSetConstraint":
        return "one of " + ", ".join(sorted(f"`{a}`" for a in constr.values))
    if name == "EqAttrConstraint":
        return f"`{constr.attr}`"
    if name == "AnyAttr":
        return "any attribute"
    if name == "ParamAttrConstraint":  # IntegerAttr/FloatAttr/DenseArrayBase of one element type
        element = constr.param_constrs[-1]
        kind = element.attr if type(element).__name__ == "EqAttrConstraint" else getattr(element, "attr", None)
        of = f" of `{kind() if isinstance(kind, type) else kind}`" if kind is not None else ""
        return f"`{constr.base_attr.__name__}`{of}"
    inner = getattr(constr, "constraint", None) or getattr(constr, "constr", None)
    if inner is not None and name in ("RangeLengthConstraint", "RangeOf", "VarConstraint"):
        return _constraint_text(inner)
    text = re.sub(r"\s+", " ", str(constr))
    return f"`{text}`"


# --- passes --------------------------------------------------------------------------------------


def _pass_reference(name: str) -> str:
    from ad_mlir.passes import get_all_passes

    cls = get_all_passes()[name]()
    module = sys.modules[cls.__module__]
    doc = inspect.cleandoc(module.__doc__ or cls.__doc__ or "")
    fields = [f for f in dataclasses.fields(cls) if f.init]
    if fields:
        rows = "\n".join(
            f"| `{f.name.replace('_', '-')}` | `{_type_name(f.type)}` | `{_default(f)}` |" for f in fields
        )
        options = f"**Options** (`-p '{name}{{option=value ...}}'`):\n\n| option | type | default |\n|---|---|---|\n{rows}"
    else:
        options = "**Options**: none."
    return f"{doc}\n\n{options}\n\nDefined in `{cls.__module__}.{cls.__name__}`."


def _cached_mixers() -> str:
    import importlib
    import pkgutil

    from ad_mlir.passes import cache
    from ad_mlir.passes.cache.table import MIXERS

    lines = [(m.name, sys.modules[m.find.__module__]) for m in MIXERS]
    shown = {module for _, module in lines}
    shared = [importlib.import_module(f"{cache.__name__}.{m.name}") for m in pkgutil.iter_modules(cache.__path__)]
    sections = [f"### {name}\n\n`{module.__name__}`\n\n{inspect.cleandoc(module.__doc__ or '')}\n"
                for name, module in lines]
    sections += [f"### `{module.__name__}`\n\n{inspect.cleandoc(module.__doc__ or '')}\n"
                 for module in shared if module not in shown]
    return "\n".join(sections)


def _type_name(annotation: Any) -> str:
    return (annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))).replace(
        "|", "or")


def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        return repr(field.default)
    if field.default_factory is not dataclasses.MISSING:
        return repr(field.default_factory())
    return "required"


def _included(path: str) -> str:
    text = (ROOT / path).read_text()
    return re.sub(r"^# .*\n", "", text, count=1, flags=re.MULTILINE)


# --- IR examples ---------------------------------------------------------------------------------


def _ir_example(file: str, split: int, opt_args: list[str]) -> str:
    source = (ROOT / "tests" / "filecheck" / file).read_text().split("// -----")[split]
    before = "\n".join(line for line in source.splitlines() if line.strip() and not line.lstrip().startswith("//"))
    with tempfile.NamedTemporaryFile("w", suffix=".mlir") as f:
        f.write(before + "\n")
        f.flush()
        command = [str(Path(sys.executable).parent / "ad-opt"), f.name, *opt_args]
        run = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if run.returncode != 0:
        raise RuntimeError(f"docs example {file} #{split}: ad-opt {' '.join(opt_args)} failed:\n{run.stderr}")
    shown = " ".join(shlex.quote(a) for a in opt_args)
    return (
        f"Before (`tests/filecheck/{file}`, case {split}):\n\n```mlir\n{before}\n```\n\n"
        f"After `ad-opt {shown}`:\n\n```mlir\n{run.stdout.strip()}\n```"
    )
