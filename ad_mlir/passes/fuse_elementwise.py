"""`fuse-elementwise`: wrap maximal fusible subgraphs in `ad.fused` regions.

A region iterates over one domain D. Ops in it are pointwise ops (and casts) whose shapes
broadcast into D: D itself, the per-row shape R = D[:-1] + [1], a per-column weight, a scalar
(the kernel recomputes the small ones per tile, e.g. Gemma's `1 + w`); with
`allow-reductions`, last-dim `keepdim` reductions ("row regions": RMSNorm, softmax); and
last-dim slices and cats of static widths ("column ops": RoPE's rotate_half), which the kernel
turns into column index math. Column ops and reductions never share a region (a reduction
runs over the region's columns). Only ops the Triton codegen can emit join
(`dialects/kernel_forms.supports`), and a group of slices alone stays views. Inputs may
broadcast to D; a value used both inside and outside becomes an extra output. Two groups
never merge when a path between them leaves the group (that would make the fused op depend
on itself).

Groups are formed greedily in block order: each fusible op merges with the groups of its
operands' producers when the shapes, `max-ops` and the cycle rule allow it. Ops on weights
alone (a concatenation of weights, a cast of one) stay out: the exporter computes them once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    BFloat16Type,
    Float8E4M3FNType,
    Float16Type,
    Float32Type,
    IntegerType,
    ModuleOp,
    TensorType,
)
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass

from ad_mlir.dialects import ad, kernel_forms
from ad_mlir.dialects.weights import weight_only_values
from ad_mlir.passes.patterns.regions import outline, sort_topologically

log = logging.getLogger(__name__)

Shape = tuple[int, ...]

FUSIBLE_ELEMENT_TYPES = frozenset(
    {Float32Type(), Float16Type(), BFloat16Type(), Float8E4M3FNType(), IntegerType(64), IntegerType(32), IntegerType(1)}
)
"""Element types the Triton codegen computes with (f64 and i8 math stays unfused)."""

POINTWISE_OPS = (ad.ElementwiseOp, ad.CastOp)
ROW_REDUCTION_OPS = (ad.SumOp, ad.MeanOp, ad.AmaxOp, ad.AminOp)


# ------------------------------------------------------------------ what may fuse


def _shape(value: SSAValue) -> Shape:
    assert isinstance(value.type, TensorType)
    return tuple(value.type.get_shape())


def _types_fusible(op: Operation) -> bool:
    tensors = [v.type for v in (*op.operands, *op.results) if isinstance(v.type, TensorType)]
    return all(t.element_type in FUSIBLE_ELEMENT_TYPES for t in tensors)


def is_row_reduction(op: Operation) -> bool:
    """A reduction of the last dim only, keeping it (the result broadcasts back over rows)."""
    if not isinstance(op, ROW_REDUCTION_OPS) or op.keepdim is None:
        return False
    shape = _shape(op.input)
    return len(shape) >= 1 and shape[-1] != 1 and op.reduced_dims() == (len(shape) - 1,)


def level_shapes(op: Operation) -> frozenset[Shape]:
    """The iteration shapes an op occupies: its result's, and for a reduction its input's."""
    if is_row_reduction(op):
        return frozenset({_shape(op.input), _shape(op.results[0])})
    return frozenset({_shape(op.results[0])})


def is_fusible(op: Operation, allow_reductions: bool) -> bool:
    """Pointwise ops, last-dim slices and cats (and row reductions when allowed) of fusible
    types that the Triton codegen can emit."""
    kinds_ok = isinstance(op, POINTWISE_OPS) or kernel_forms.is_column_op(op)
    if not (kinds_ok or (allow_reductions and is_row_reduction(op))):
        return False
    return _types_fusible(op) and kernel_forms.supports(op)


def computes(op: Operation) -> bool:
    """Whether `op` costs a kernel when left alone (a slice is a view: a region of slices only
    would turn free views into copies)."""
    return not isinstance(op, ad.SliceOp)


def broadcasts_to(shape: Shape, domain: Shape) -> bool:
    return len(shape) <= len(domain) and all(
        a == b or a == 1 for a, b in zip(reversed(shape), reversed(domain), strict=False)
    )


def shapes_form_a_region(shapes: Iterable[Shape], column_ops: bool = False) -> bool:
    """One domain D that every other shape broadcasts to (D's rows D[:-1] + [1], a weight
    [D[-1]], a scalar: the kernel computes those per tile); with column ops (last-dim slices
    and cats, never beside a row reduction), shapes of one rank that share D's rows and have
    static row lengths."""
    distinct = set(shapes)
    if column_ops:
        return len({s[:-1] for s in distinct}) == 1 and all(s and s[-1] != DYNAMIC_INDEX for s in distinct)
    return any(all(broadcasts_to(s, d) for s in distinct) for d in distinct)


# ------------------------------------------------------------------------ groups


@dataclass(eq=False)
class _Group:
    ops: list[Operation]
    shapes: frozenset[Shape]
    parent: _Group | None = field(default=None, repr=False)

    @property
    def column_ops(self) -> bool:
        return any(kernel_forms.is_column_op(op) for op in self.ops)

    @property
    def reductions(self) -> bool:
        return any(is_row_reduction(op) for op in self.ops)

    def root(self) -> _Group:
        g = self
        while g.parent is not None:
            g = g.parent
        return g


@dataclass
class _Fuser:
    max_ops: int
    allow_reductions: bool
    group_of: dict[Operation, _Group] = field(default_factory=dict)
    ancestors: dict[Operation, frozenset[_Group]] = field(default_factory=dict)
    """Groups (as created; map through root()) of every op an op depends on."""

    weight_only: set[SSAValue] = field(default_factory=set)
    """Weights and values computed from weights alone (the exporter computes those once)."""

    def visit(self, op: Operation) -> None:
        if any(r in self.weight_only for r in op.results):
            return
        producers = [v.owner for v in op.operands if isinstance(v.owner, Operation)]
        ancestors: set[_Group] = set()
        for p in producers:
            ancestors |= self.ancestors.get(p, frozenset())
            if p in self.group_of:
                ancestors.add(self.group_of[p])
        self.ancestors[op] = frozenset(ancestors)
        if not is_fusible(op, self.allow_reductions):
            return
        group = _Group([op], level_shapes(op))
        for p in producers:
            candidate = self.group_of[p].root() if p in self.group_of else None
            if candidate is not None and candidate is not group and self._can_merge(group, candidate):
                group = self._merge(group, candidate)
        self.group_of[op] = group

    def _can_merge(self, a: _Group, b: _Group) -> bool:
        column_ops = a.column_ops or b.column_ops
        if column_ops and (a.reductions or b.reductions):
            return False
        if len(a.ops) + len(b.ops) > self.max_ops or not shapes_form_a_region(a.shapes | b.shapes, column_ops):
            return False
        members = set(a.ops) | set(b.ops)
        for m in members:
            for v in m.operands:
                p = v.owner
                if isinstance(p, Operation) and p not in members:
                    # A path a/b -> ... -> p -> m would make the fused op its own ancestor.
                    if any(g.root() in (a, b) for g in self.ancestors.get(p, ())):
                        return False
        return True

    def _merge(self, a: _Group, b: _Group) -> _Group:
        b.ops.extend(a.ops)
        b.shapes = b.shapes | a.shapes
        a.parent = b
        for op in a.ops:
            self.group_of[op] = b
        return b

    def groups(self) -> list[list[Operation]]:
        roots = {id(g.root()): g.root() for g in self.group_of.values()}
        return [g.ops for g in roots.values() if any(computes(op) for op in g.ops)]


# ----------------------------------------------------------------------- outlining


# --------------------------------------------------------------------------- pass


@dataclass(frozen=True)
class FuseElementwisePass(ModulePass):
    """Wrap maximal elementwise (and, with allow-reductions, last-dim row) subgraphs in
    `ad.fused` regions; `max-ops` bounds a region's size."""

    name = "fuse-elementwise"

    max_ops: int = 64
    allow_reductions: bool = True

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for fn in op.walk():
            if isinstance(fn, func.FuncOp) and fn.body.blocks:
                self.fuse_block(fn.body.block, weight_only_values(fn))

    def fuse_block(self, block: Block, weight_only: set[SSAValue]) -> None:
        fuser = _Fuser(self.max_ops, self.allow_reductions, weight_only=weight_only)
        ops = list(block.ops)
        for op in ops:
            fuser.visit(op)
        order = {op: i for i, op in enumerate(ops)}
        groups = fuser.groups()
        for members in groups:
            outline(members, order)
        if groups:
            sort_topologically(block)
        log.info("fuse-elementwise: %d regions from %d ops", len(groups), sum(map(len, groups)))
