"""Compile a stack of decoder layers once per distinct layer.

Every decoder layer of a model is the same program on other weights: the pipeline need not
match, rewrite and check each of them again. The layers are found by their locations (an op's
HF module path names its layer: the first numbered part of the path, `model.layers.7.mlp`, in
one layer stack); each layer's ops are hashed structurally (op names, types, properties,
locations and weight names relative to the layer, and the operands as "this layer's value n",
"the previous layer's value n" (counted from its end, and only where no later layer reads it),
a constant, or one and the same value from before), which gives the smallest period P of the
stack (1 for a Llama, 2 for Gemma2's sliding/global alternation or a hybrid alternating two
mixers). A model whose layers do not repeat often enough is compiled whole.

A stack of N layers with period P is cut to K = 5P + N mod P layers (`shorten`): the prefix, the
first K layers and the suffix, which reads the last layers' values where it read those of the
layers they stand for. The pipeline runs on that. Its layers fall into 5 groups of P (and the
rest): group 0 differs (layer 0 has no residual add before its first norm), group 1 reads it,
the last group is next to the suffix (whose norm fuses the last residual add); groups 2 and 3
are in the steady state. `lengthen` checks that they are the same program up to their weights,
layer names and layer arguments, instantiates group 3 for the missing layers (each copy reads
the copy before it and its own layers' weights) and renames the last group and the suffix to
the layers they stand for. This relies on the passes being local (what they make of a layer
depends on that layer and its neighbours, not on how many layers follow); a pass that numbers
layers makes groups 2 and 3 differ, which the check catches.

A pass may add arguments of one layer (`layer_arguments`: no weight, their attributes name
the layer: the K/V caches and states of `insert-cached-attention`, `k_cache_3` marked `ad.cache =
"model.layers.3.self_attn key"`). The hash sees them as "this layer's argument" of a type,
attributes relative to the layer and the stem of their name (`k_cache`); their names' counts
number them in program order, kind by kind (the pass's attention count, not the layer). So
lengthening checks that each stem's counts advance by the same step from each group to the next
and that the arguments come in sections (one per kind: all K/V caches, then all convolution
states, ...), each in layer order; each copy of group 3 gets its own arguments, placed in each
section after the layers before it, named and marked as the pass would have named and marked
them for those layers, and the last group's are renamed. The shared arguments (the slots,
starts, block tables, `logits_indices`) stay one. Where a check fails (`NotRepeating`: the
message says which), the caller compiles the whole program.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence

from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, FunctionType, ModuleOp, NameLoc, StringAttr
from xdsl.ir import Attribute, Block, BlockArgument, Operation, Region, SSAValue

from ad_mlir.dialects import ad
from ad_mlir.dialects.weights import weight_of

KEPT_GROUPS = 5
"""Groups of P layers the shortened program keeps: group 0 (the first layer differs), group 1
(it reads group 0), groups 2 and 3 (which must be one program; 3 is instantiated for the
missing layers) and the last, next to the suffix."""
LAST = KEPT_GROUPS - 1
"""The last group: it stands for the model's last layers."""
_NUMBERED = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")
_COUNTED = re.compile(r"^(.*)_(\d+)$")


class NotRepeating(Exception):  # noqa: N818 (a reason to compile the whole program, not an error)
    """The layers are not the same program up to their weights (the message says where)."""


def layer_of(name: str) -> tuple[str, int] | None:
    """("model.layers", 7) for a module path or weight name inside `model.layers.7`."""
    match = _NUMBERED.search(name)
    return (name[:match.start(1)].rstrip("."), int(match.group(1))) if match else None


def renamed(name: str, stack: str, shift: Callable[[int], int]) -> str:
    """`name` with its layer index i (in `stack`) made `shift(i)`; other names as they are."""
    where = layer_of(name)
    if where is None or where[0] != stack:
        return name
    index = len(stack) + 1 if stack else 0
    digits = str(where[1])
    return f"{name[:index]}{shift(where[1])}{name[index + len(digits):]}"


@dataclasses.dataclass
class Layout:
    """A function's top-level ops cut into the prefix, one op list per layer and the suffix."""

    stack: str
    prefix: list[Operation]
    layers: list[list[Operation]]
    suffix: list[Operation]


def layout(fn: func.FuncOp) -> Layout:
    """The layers of `fn` by its ops' locations: one stack of them, each layer's ops contiguous
    and in order. An op without a layer in its location belongs to the layer it stands in (a
    constant; a region `fuse-elementwise` made of a layer's ops and the model's mask ops, named
    by its first op)."""
    where: list[tuple[str, int] | None | str] = []
    for op in fn.body.block.ops:
        name = op.location.desc.data if isinstance(op.location, NameLoc) else None
        where.append(None if name is None else (layer_of(name) or name))
    ops = list(fn.body.block.ops)
    stacks = {w[0] for w in where if isinstance(w, tuple)}
    if len(stacks) != 1:
        raise NotRepeating(f"the ops name {len(stacks)} layer stacks")
    (stack,) = stacks
    first = next(i for i, w in enumerate(where) if isinstance(w, tuple))
    last = max(i for i, w in enumerate(where) if isinstance(w, tuple))
    layers: list[list[Operation]] = []
    for op, w in zip(ops[first:last + 1], where[first:last + 1], strict=True):
        if isinstance(w, tuple) and w[1] != len(layers) - 1:
            if w[1] != len(layers):
                raise NotRepeating(f"{op.name} of layer {w[1]} follows layer {len(layers) - 1}")
            layers.append([])
        layers[-1].append(op)
    return Layout(stack, ops[:first], layers, ops[last + 1:])


def _defined(ops: Iterable[Operation]) -> dict[SSAValue, int]:
    """Every value the ops define (results and block arguments, nested ones included), numbered in order."""
    numbers: dict[SSAValue, int] = {}
    for top in ops:
        for op in top.walk():
            for value in [*(a for r in op.regions for b in r.blocks for a in b.args), *op.results]:
                numbers[value] = len(numbers)
    return numbers


def _read_only_by(v: SSAValue, ops: set[Operation]) -> bool:
    """Whether only `ops` read `v` (a layer and the one before it; a value every layer reads,
    such as a size the first layer computed, is no value of the layer before)."""
    return all(use.operation in ops for use in v.uses)


@dataclasses.dataclass(frozen=True)
class LayerArgument:
    """A function argument of one layer that is no weight: a cache `insert-cached-attention`
    added (`k_cache_3`, marked `ad.cache = "model.layers.3.self_attn key"`). Its attributes name
    its layer; its name is a stem and a count (`k_cache`, 3), which numbers the stem's arguments
    in program order (the pass's attention or cache count, not the layer's index)."""

    layer: int
    stem: str
    count: int | None
    attrs: Mapping[str, Attribute]


def layer_arguments(fn: func.FuncOp, stack: str) -> dict[BlockArgument, LayerArgument]:
    """The arguments of `fn` that are no weight and whose string attributes name one layer of `stack`."""
    found = {}
    for arg, attrs in zip(fn.body.block.args, fn.arg_attrs or [], strict=True):
        if weight_of(attrs) is not None:
            continue
        layers = {where[1] for a in attrs.data.values()
                  if isinstance(a, StringAttr) and (where := layer_of(a.data)) is not None and where[0] == stack}
        if len(layers) != 1:
            continue
        name = attrs.data.get(ad.INPUT_ATTR)
        counted = _COUNTED.match(name.data) if isinstance(name, StringAttr) else None
        stem = counted.group(1) if counted else name.data if isinstance(name, StringAttr) else ""
        found[arg] = LayerArgument(layers.pop(), stem, int(counted.group(2)) if counted else None, attrs.data)
    return found


class _Keys:
    """Structural keys of op lists (layers or groups of layers), relative to their first layer."""

    def __init__(self, fn: func.FuncOp, stack: str) -> None:
        self.stack = stack
        self.weights = {a: attrs for a, attrs in zip(fn.body.block.args, fn.arg_attrs or [], strict=True)
                        if weight_of(attrs) is not None}
        self.arguments = layer_arguments(fn, stack)

    def relative(self, attr: Attribute, layer: int) -> Hashable:
        if isinstance(attr, StringAttr):
            return renamed(attr.data, self.stack, lambda i: f"{{{i - layer}}}")
        if isinstance(attr, NameLoc):
            return ("loc", renamed(attr.desc.data, self.stack, lambda i: f"{{{i - layer}}}"))
        return attr

    def operand(self, v: SSAValue, own: Mapping[SSAValue, int], previous: Mapping[SSAValue, int],
                here: set[Operation], layer: int) -> Hashable:
        if v in own:
            return ("own", own[v])
        if v in previous and _read_only_by(v, here):  # counted from its end: the first layer differs
            return ("previous", len(previous) - previous[v])
        if isinstance(v.owner, ad.ConstantOp):
            return ("constant", v.owner.value, v.type)
        if v in self.weights:
            return ("weight", v.type, tuple(sorted((k, self.relative(a, layer)) for k, a in self.weights[v].data.items())))
        if v in self.arguments:  # "this layer's key cache": its name's count is checked by `_LayerArguments`
            argument = self.arguments[v]
            return ("argument", v.type, argument.stem,
                    tuple(sorted((k, self.relative(a, layer)) for k, a in argument.attrs.items() if k != ad.INPUT_ATTR)))
        return ("same", id(v))

    def key(self, ops: Sequence[Operation], previous: Sequence[Operation], layer: int) -> tuple[Hashable, ...]:
        own, before = _defined(ops), _defined(previous)
        here = {op for top in [*previous, *ops] for op in top.walk()}
        return tuple(
            (op.name, tuple(op.result_types), tuple(sorted(op.properties.items())),
             tuple(sorted(op.attributes.items())), self.relative(op.location, layer),
             tuple(tuple((tuple(a.type for a in b.args), len(b.ops)) for b in r.blocks) for r in op.regions),
             tuple(self.operand(v, own, before, here, layer) for v in op.operands))
            for top in ops for op in top.walk()
        )


def period(fn: func.FuncOp) -> tuple[Layout, int]:
    """The function's layers and their smallest period P (layer i is layer i + P's program for
    every i > 0); NotRepeating where there is none that repeats more often than the shortened
    program keeps it (`kept_layers`)."""
    lay = layout(fn)
    keys = _Keys(fn, lay.stack)
    n = len(lay.layers)
    layer_keys = [keys.key(lay.layers[i], lay.layers[i - 1] if i else [], i) for i in range(n)]
    for p in range(1, n):
        if kept_layers(n, p) + p > n:
            break
        if all(layer_keys[i] == layer_keys[i + p] for i in range(1, n - p)):
            return lay, p
    raise NotRepeating(f"the {n} layers do not repeat {KEPT_GROUPS + 1} times or more")


def kept_layers(n: int, p: int) -> int:
    return KEPT_GROUPS * p + n % p


def shorten(fn: func.FuncOp, lay: Layout, p: int) -> ModuleOp:
    """A new module of `fn`'s prefix, first K = `kept_layers` layers and suffix, with all of
    `fn`'s arguments (`fn` is left as it is). Where the suffix read layer i of the last K - LAST * P
    layers, it reads layer i - (N - K), the same value of the layer standing for it; a read of
    an earlier layer from LAST * P on (one that will be a copy) raises NotRepeating."""
    n, k = len(lay.layers), kept_layers(len(lay.layers), p)
    block = Block(arg_types=[a.type for a in fn.body.block.args])
    mapper: dict[SSAValue, SSAValue] = {}
    for old, new in zip(fn.body.block.args, block.args, strict=True):
        new.name_hint = old.name_hint
        mapper[old] = new
    for op in [*lay.prefix, *(op for layer in lay.layers[:k] for op in layer)]:
        block.add_op(op.clone(mapper))
    last = n - (k - LAST * p)  # the first of the layers the last group stands for
    layer_of_value = {v: i for i in range(LAST * p, n) for v in _defined(lay.layers[i])}
    standing = {v: mapper[kept] for i in range(last, n)  # all read before any is set: a kept layer
                for v, kept in zip(_defined(lay.layers[i]), _defined(lay.layers[i - (n - k)]), strict=True)}
    mapper |= standing  # may itself stand for a later one (N - K < K - LAST * P)
    for op in lay.suffix:
        for inner in op.walk():
            for v in inner.operands:
                if layer_of_value.get(v, last) < last:
                    raise NotRepeating(f"{inner.name} after the layers reads layer {layer_of_value[v]}, not one of the last")
        block.add_op(op.clone(mapper))
    return ModuleOp([func.FuncOp("forward", fn.function_type, Region(block), arg_attrs=fn.arg_attrs)])


def _shifted_location(op: Operation, stack: str, shift: Callable[[int], int]) -> None:
    if isinstance(op.location, NameLoc):
        name = renamed(op.location.desc.data, stack, shift)
        if name != op.location.desc.data:
            op.location = NameLoc(StringAttr(name), op.location.location)


class _Renamer:
    """The weight arguments by name: where a copied op reads another layer's weight."""

    def __init__(self, fn: func.FuncOp, stack: str) -> None:
        self.stack = stack
        self.attrs = {a: attrs for a, attrs in zip(fn.body.block.args, fn.arg_attrs or [], strict=True)
                      if weight_of(attrs) is not None}
        self.named = {weight_of(attrs)[1]: a for a, attrs in self.attrs.items()}

    def weight(self, v: SSAValue, shift: Callable[[int], int]) -> SSAValue:
        """The argument of the weight `v` names, in the layer `shift` gives (`v` where it is no
        layer's weight). The two must have one type and the same attributes but the name."""
        if v not in self.attrs:
            return v
        _, name = weight_of(self.attrs[v])
        other = renamed(name, self.stack, shift)
        if other == name:
            return v
        if other not in self.named:
            raise NotRepeating(f"weight {other} (for {name}) is not an argument")
        arg = self.named[other]
        expected = {k: StringAttr(renamed(a.data, self.stack, shift)) if isinstance(a, StringAttr) else a
                    for k, a in self.attrs[v].data.items()}
        if arg.type != v.type or expected != dict(self.attrs[arg].data):
            raise NotRepeating(f"weight {other} is not typed and described as {name}")
        return arg


def lengthen(module: ModuleOp, layers: int, p: int, on_copy: Callable[[Operation, Operation], None]) -> None:
    """Make the compiled shortened program (`shorten`'s, after the pipeline) the one of
    `layers` layers: check that groups 2 and 3 are one program, insert copies of group 3 after
    it, rename the last group and the suffix to their layers. `on_copy(original, copy)` is
    called for every op copied (nested ones too). NotRepeating, the module unchanged, where
    the groups differ."""
    fn = next(op for op in module.ops if isinstance(op, func.FuncOp))
    lay = layout(fn)
    k = kept_layers(layers, p)
    if len(lay.layers) != k:
        raise NotRepeating(f"the pipeline left {len(lay.layers)} of the {k} layers it was given")
    groups = [[op for layer in lay.layers[g * p:(g + 1) * p] for op in layer] for g in range(LAST)]
    keys = _Keys(fn, lay.stack)
    if keys.key(groups[2], groups[1], 2 * p) != keys.key(groups[3], groups[2], 3 * p):
        raise NotRepeating(f"layers {_span(2 * p, p)} and {_span(3 * p, p)} compiled to different programs")
    rest = [*(op for layer in lay.layers[LAST * p:] for op in layer), *lay.suffix]
    middle = {v for g in groups[1:3] for v in _defined(g)}
    for op in rest:
        for inner in op.walk():
            if any(v in middle for v in inner.operands):
                raise NotRepeating(f"{inner.name} after the repeated layers reads a layer before the last one")
    renamer = _Renamer(fn, lay.stack)
    template = groups[3]
    reads = [v for op in template for inner in op.walk() for v in inner.operands]
    shift = layers - k
    arguments = _Arguments(fn, lay.stack, p, shift // p)
    arguments.check_reads(reads)
    weights = [_renames(reads, renamer, lambda i, s=c * p: i + s)  # NotRepeating before any change
               for c in range(1, shift // p + 1)]
    tail_shift: Callable[[int], int] = lambda i: i + shift if i >= LAST * p else i  # noqa: E731
    for op in rest:
        for inner in op.walk():
            for v in inner.operands:
                renamer.weight(v, tail_shift)
    here = {op for top in [*groups[2], *template] for op in top.walk()}
    before = [v if _read_only_by(v, here) else None for v in _defined(groups[2])]
    previous = template
    for c, (renames, own) in enumerate(zip(weights, arguments.lengthen(), strict=True), start=1):
        mapper = {v: new for v, new in zip(before, _defined(previous), strict=True) if v is not None}
        previous = _insert_copy(template, mapper | renames | own, rest[0], lambda i, s=c * p: i + s, lay.stack, on_copy)
    last = dict(zip(_defined(template), _defined(previous), strict=True))
    for op in rest:
        for inner in op.walk():
            inner.operands = tuple(renamer.weight(last.get(v, v), tail_shift) for v in inner.operands)
            _shifted_location(inner, lay.stack, tail_shift)


class _Arguments:
    """The layer arguments (`layer_arguments`) of a compiled shortened program, checked to be
    what lengthening can give the copies as the pipeline would have given them to those layers
    (NotRepeating otherwise, before any change): each stem's counts advance by one step per
    group of P layers (alike from group 1 to the last), and the arguments come in sections (the
    pass adds them kind by kind: all attentions' K/V caches, then the convolutions' states, ...),
    each in layer order, where a copy's go after the layers before it."""

    def __init__(self, fn: func.FuncOp, stack: str, p: int, copies: int) -> None:
        self.fn, self.stack, self.p, self.copies = fn, stack, p, copies
        self.of = layer_arguments(fn, stack)
        for argument in self.of.values():  # so `count or 0` below is the count
            if argument.count is None:
                raise NotRepeating(f"argument {argument.stem} of layer {argument.layer} has no count in its name to "
                                   "number its copies by")
        self.steps = self._steps()
        self.sections = self._sections()
        for arg, argument in self.of.items():
            if argument.layer >= LAST * p and argument.stem not in self.steps:
                raise NotRepeating(f"argument {self._name(arg)} of layer {argument.layer} has no counterpart in the "
                                   "layers before it")

    def _name(self, arg: BlockArgument) -> str:
        return f"{self.of[arg].stem}_{self.of[arg].count}"

    def _steps(self) -> dict[str, int]:
        """Each stem's step: what its counts advance by from one group to the next."""
        counts: dict[str, list[list[int]]] = {}
        for argument in self.of.values():
            group = argument.layer // self.p
            if 1 <= group <= LAST:
                counts.setdefault(argument.stem, [[] for _ in range(LAST)])[group - 1].append(argument.count or 0)
        steps = {}
        for stem, groups in counts.items():
            found = {b - a for g, h in zip(groups, groups[1:], strict=False) for a, b in zip(g, h, strict=False)}
            if len({len(g) for g in groups}) != 1 or len(found) != 1:
                raise NotRepeating(f"the arguments {stem}_<i> are not counted alike in every group of {self.p} layers")
            steps[stem] = found.pop()
        return steps

    def _sections(self) -> list[tuple[int, list[BlockArgument]]]:
        """Per section: where the copies' arguments go (before those of the last group's layers)
        and group 3's arguments, which they copy."""
        sections: list[list[BlockArgument]] = []
        previous: LayerArgument | None = None
        for arg in self.fn.body.block.args:
            argument = self.of.get(arg)
            if argument is not None and (previous is None or previous.layer > argument.layer):
                sections.append([])
            if argument is not None:
                sections[-1].append(arg)
            previous = argument
        placed = []
        for section in sections:
            layers = [self.of[arg].layer for arg in section]
            at = next((arg.index for arg, layer in zip(section, layers, strict=True) if layer >= LAST * self.p),
                      section[-1].index + 1)
            placed.append((at, [arg for arg, layer in zip(section, layers, strict=True)
                                if 3 * self.p <= layer < LAST * self.p]))
        return placed

    def check_reads(self, template: Iterable[SSAValue]) -> None:
        """Group 3 (the template) reads no other layer's arguments (its copies could not)."""
        for v in template:
            if v in self.of and not 3 * self.p <= self.of[v].layer < LAST * self.p:
                raise NotRepeating(f"layers {_span(3 * self.p, self.p)} read the argument {self._name(v)} of layer "
                                   f"{self.of[v].layer}")

    def _moved(self, argument: LayerArgument, groups: int) -> tuple[DictionaryAttr, str]:
        """The attributes and name of `argument` for the layer `groups` groups later."""
        name = f"{argument.stem}_{(argument.count or 0) + groups * self.steps[argument.stem]}"
        attrs = {k: StringAttr(renamed(a.data, self.stack, lambda i: i + groups * self.p)) if isinstance(a, StringAttr)
                 else a for k, a in argument.attrs.items()}
        return DictionaryAttr(attrs | {ad.INPUT_ATTR: StringAttr(name)}), name

    def lengthen(self) -> list[dict[SSAValue, SSAValue]]:
        """Insert the copies' arguments and rename those of the last group's layers (by the
        copies' layers); per copy, group 3's arguments -> the copy's."""
        block = self.fn.body.block
        attrs = list(self.fn.arg_attrs.data) if self.fn.arg_attrs else [DictionaryAttr({}) for _ in block.args]
        made: list[dict[SSAValue, SSAValue]] = [{} for _ in range(self.copies)]
        for at, template in reversed(self.sections):  # the later first: the earlier places stay
            for j, (c, arg) in enumerate((c, arg) for c in range(1, self.copies + 1) for arg in template):
                new_attrs, name = self._moved(self.of[arg], c)
                new = block.insert_arg(arg.type, at + j)
                new.name_hint = name
                attrs.insert(at + j, new_attrs)
                made[c - 1][arg] = new
        for arg, argument in self.of.items():
            if argument.layer >= LAST * self.p:
                attrs[arg.index], arg.name_hint = self._moved(argument, self.copies)
        self.fn.arg_attrs = ArrayAttr(attrs)
        self.fn.function_type = FunctionType.from_lists([a.type for a in block.args], self.fn.function_type.outputs.data)
        return made


def _span(first: int, count: int) -> str:
    return f"{first}" if count == 1 else f"{first}-{first + count - 1}"


def _renames(reads: Iterable[SSAValue], renamer: _Renamer, shift: Callable[[int], int]) -> dict[SSAValue, SSAValue]:
    """The weights among `reads` -> those of the layers `shift` gives."""
    return {v: other for v in reads if (other := renamer.weight(v, shift)) is not v}


def _insert_copy(template: Sequence[Operation], mapper: dict[SSAValue, SSAValue], anchor: Operation,
                 shift: Callable[[int], int], stack: str,
                 on_copy: Callable[[Operation, Operation], None]) -> list[Operation]:
    """A copy of `template` before `anchor` whose reads go through `mapper` (the group before
    it, the weights of its layers); its locations name its layers."""
    block = anchor.parent_block()
    assert block is not None
    copied = []
    for op in template:
        copy = op.clone(mapper)
        for old, new in zip(op.walk(), copy.walk(), strict=True):
            _shifted_location(new, stack, shift)
            on_copy(old, new)
        block.insert_op_before(copy, anchor)
        copied.append(copy)
    return copied
