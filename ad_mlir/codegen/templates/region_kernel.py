"""One `ad.fused` region -> one Triton kernel and its launcher, as Python source text.

The kernel iterates over the region's domain D (its widest op shape) seen as rows x columns:
rows are D[:-1] flattened, columns the last dim. A program takes a tile of BLOCK_R rows x
BLOCK_C columns:

- pointwise regions tile both (grid: row blocks x column blocks);
- row regions (a last-dim reduction and its elementwise uses, e.g. RMSNorm, softmax) take
  whole rows: one tile when the row fits (BLOCK_C = next_power_of_2(row)), else a loop over
  column tiles with one pass per reduction depth and a last pass for the outputs.

Each input is addressed through its runtime strides on the dims it does not broadcast over
(its IR shape says which; a dim typed `?` that is 1 at run time gets stride 0, `launch.py`),
so broadcast, sliced, transposed and expanded inputs are read in place; a stride of 1 is
specialized by Triton, so contiguous rows vectorize. Outputs are
contiguous. Math is fp32 after every float load (integers stay integers), an `ad.cast` to a
narrower float rounds where the program asks for it, and every store casts to the output's
dtype. Padding lanes are replaced by the reduction's neutral value before every reduction.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    BFloat16Type,
    Float8E4M3FNType,
    Float16Type,
    Float32Type,
    FloatAttr,
    IntegerType,
    TensorType,
)
from xdsl.ir import Attribute, Operation, SSAValue

from ad_mlir.codegen.templates.blocks import row_fits_one_tile
from ad_mlir.codegen.templates.skeleton import module_source
from ad_mlir.codegen.templates.writer import IndentedWriter
from ad_mlir.dialects import ad
from ad_mlir.dialects.kernel_forms import (
    REDUCTIONS,
    CodegenError,
    Shape,
    compute_type,
    is_column_op,
    pow_exponent,
    shape_of,
    supports,
)

# ------------------------------------------------------------------------ types

_TL_FLOAT = {
    Float32Type(): "tl.float32",
    Float16Type(): "tl.float16",
    BFloat16Type(): "tl.bfloat16",
    Float8E4M3FNType(): "tl.float8e4nv",
}
_TORCH_DTYPE = {
    Float32Type(): "torch.float32",
    Float16Type(): "torch.float16",
    BFloat16Type(): "torch.bfloat16",
    Float8E4M3FNType(): "torch.float8_e4m3fn",
    IntegerType(64): "torch.int64",
    IntegerType(32): "torch.int32",
    IntegerType(1): "torch.bool",
}
_TL_COMPUTE = {"f32": "tl.float32", "i64": "tl.int64", "i32": "tl.int32", "i1": "tl.int1"}


def _promoted(ctypes: Sequence[str]) -> str:
    for c in ("f32", "i64", "i32"):
        if c in ctypes:
            return c
    return "i1"


# ------------------------------------------------------------- op expressions

UNARY: dict[type[Operation], str] = {
    ad.NegOp: "-{a}",
    ad.AbsOp: "tl.abs({a})",
    ad.ExpOp: "tl.exp({a})",
    ad.LogOp: "tl.log({a})",
    ad.SqrtOp: "tl.sqrt_rn({a})",
    ad.RsqrtOp: "tl.rsqrt({a})",
    ad.ReciprocalOp: "1.0 / {a}",
    ad.SinOp: "tl.sin({a})",
    ad.CosOp: "tl.cos({a})",
    ad.ErfOp: "tl.erf({a})",
    ad.SigmoidOp: "1.0 / (1.0 + tl.exp(-{a}))",
    ad.SiluOp: "{a} / (1.0 + tl.exp(-{a}))",
    ad.ReluOp: "tl.where({a} < 0, 0, {a})",
}
"""Unary ops computed in their result's kernel type, `{a}` the operand (`kernel_forms.UNARY_OPS`)."""

BINARY: dict[type[Operation], str] = {
    ad.MulOp: "{a} * {b}",
    ad.BitwiseAndOp: "{a} & {b}",
    ad.BitwiseOrOp: "{a} | {b}",
}
COMPARE: dict[type[Operation], str] = {
    ad.EqOp: "{a} == {b}",
    ad.NeOp: "{a} != {b}",
    ad.LtOp: "{a} < {b}",
    ad.LeOp: "{a} <= {b}",
    ad.GtOp: "{a} > {b}",
    ad.GeOp: "{a} >= {b}",
}
"""Compared in the operands' promoted kernel type."""

_POW_BY_EXPONENT: dict[float, str] = {
    1.0: "{a}",
    2.0: "{a} * {a}",
    3.0: "{a} * {a} * {a}",
    0.5: "tl.sqrt_rn({a})",
    -0.5: "tl.rsqrt({a})",
    -1.0: "1.0 / {a}",
    -2.0: "1.0 / ({a} * {a})",
}
"""`pow` with a constant exponent, in the exact forms torch uses for these exponents."""

_NEUTRAL = {
    (ad.SumOp, "f32"): "0.0", (ad.MeanOp, "f32"): "0.0",
    (ad.AmaxOp, "f32"): 'float("-inf")', (ad.AminOp, "f32"): 'float("inf")',
    (ad.SumOp, "i64"): "0", (ad.SumOp, "i32"): "0",
    (ad.AmaxOp, "i64"): str(-(2**63)), (ad.AminOp, "i64"): str(2**63 - 1),
    (ad.AmaxOp, "i32"): str(-(2**31)), (ad.AminOp, "i32"): str(2**31 - 1),
}
"""Padding lanes take these before a reduction (a masked load's 0 is wrong for exp(x), x+eps...)."""


# ------------------------------------------------------------------- the plan


def region_domain(op: ad.FusedOp) -> Shape:
    """The iteration shape: the broadcast of the outputs and the row reductions' inputs (the
    kernel computes every other value per tile, at the columns it feeds). With column ops,
    the widest of those shapes; narrower outputs store their first columns."""
    body = op.body.block.ops
    shapes = [shape_of(r.type) for r in op.outputs]
    shapes += [shape_of(inner.input.type) for inner in body if isinstance(inner, REDUCTIONS)]
    if not shapes:
        raise CodegenError("ad.fused has no outputs")
    if any(is_column_op(inner) for inner in body):
        return max(shapes, key=lambda s: s[-1])
    domain = ad.broadcast_shapes(shapes)
    if domain is None:
        raise CodegenError(f"output shapes {shapes} do not broadcast")
    return domain


@dataclass(frozen=True)
class KernelInput:
    """A region input: `name` in the kernel (`in3` for a tensor, `sc3` for a scalar), the D
    dims it has a stride on, and the input dim each of those is."""

    index: int
    type: Attribute
    stride_dims: tuple[int, ...] = ()
    input_dims: tuple[int, ...] = ()

    @property
    def is_tensor(self) -> bool:
        return isinstance(self.type, TensorType)

    @property
    def name(self) -> str:
        return f"in{self.index}" if self.is_tensor else f"sc{self.index}"

    def stride_arg(self, d: int) -> str:
        return f"{self.name}_st{d}"


def _kernel_input(index: int, value: SSAValue, domain: Shape) -> KernelInput:
    if not isinstance(value.type, TensorType):
        return KernelInput(index, value.type)
    shape = shape_of(value.type)
    offset = len(domain) - len(shape)
    dims = [
        (d, d - offset)
        for d in range(len(domain))
        if d >= offset and domain[d] != 1 and shape[d - offset] != 1
    ]
    return KernelInput(index, value.type, tuple(d for d, _ in dims), tuple(j for _, j in dims))


@dataclass(frozen=True)
class KernelPlan:
    domain: Shape
    inputs: tuple[KernelInput, ...]
    output_types: tuple[TensorType, ...]
    has_reductions: bool
    looped: bool
    output_sources: tuple[frozenset[int], ...]
    """Per output, the inputs (indices) it is computed from."""

    @property
    def rank(self) -> int:
        return len(self.domain)

    @property
    def leading_dims(self) -> tuple[int, ...]:
        """Dims of the row index that are not always 0."""
        return tuple(d for d in range(self.rank - 1) if self.domain[d] != 1)

    def size(self, d: int) -> str:
        return f"size{d}" if self.domain[d] == DYNAMIC_INDEX else str(self.domain[d])

    @property
    def n_cols(self) -> str:
        return self.size(self.rank - 1)

    def is_row_level_output(self, t: TensorType) -> bool:
        """An output that does not vary along the row (its last dim is broadcast)."""
        shape = shape_of(t)
        return self.domain[-1] != 1 and (not shape or shape[-1] == 1)

    def aligned(self, t: TensorType) -> list[tuple[int, int]]:
        """(domain dim, its size in `t` or 1 where `t` broadcasts) for every domain dim."""
        shape = shape_of(t)
        offset = self.rank - len(shape)
        return [(d, shape[d - offset] if d >= offset else 1) for d in range(self.rank)]

    def dim_size(self, d: int, size: int) -> str:
        return self.size(d) if size == DYNAMIC_INDEX else str(size)


def plan_kernel(op: ad.FusedOp) -> KernelPlan:
    domain = region_domain(op) or (1,)
    for inner in op.body.block.ops:
        if not isinstance(inner, ad.YieldOp) and not supports(inner):
            raise CodegenError(f"'{inner.name}' is not supported in a Triton region")
    inputs = tuple(_kernel_input(i, a, domain) for i, a in enumerate(op.body.block.args))
    outputs = tuple(r.type for r in op.outputs)
    has_reductions = any(isinstance(inner, REDUCTIONS) for inner in op.body.block.ops)
    looped = has_reductions and (domain[-1] == DYNAMIC_INDEX or not row_fits_one_tile(domain[-1]))
    return KernelPlan(domain, inputs, outputs, has_reductions, looped, _output_sources(op))


def _output_sources(op: ad.FusedOp) -> tuple[frozenset[int], ...]:
    block = op.body.block
    sources: dict[SSAValue, frozenset[int]] = {a: frozenset([i]) for i, a in enumerate(block.args)}
    for inner in block.ops:
        used = frozenset().union(*(sources.get(v, frozenset()) for v in inner.operands))
        for r in inner.results:
            sources[r] = used
    return tuple(sources.get(v, frozenset()) for v in block.last_op.operands)


# ---------------------------------------------------------------- the emitter


@dataclass(frozen=True)
class Value:
    """An emitted value: a name or literal, and its kernel type."""

    expr: str
    ctype: str
    literal: bool = False


def _literal(op: ad.ConstantOp) -> Value:
    attr = op.value
    ctype = compute_type(attr.type)
    if isinstance(attr, FloatAttr):
        v = attr.value.data
        text = repr(v) if math.isfinite(v) else f'float("{v}")'
        return Value(text, ctype, literal=True)
    v = attr.value.data
    return Value(str(bool(v)) if ctype == "i1" else str(v), ctype, literal=True)


@dataclass(frozen=True)
class Columns:
    """Where in its row a value is being computed: `cols` the column expression, `mask` the
    lanes where that column exists. Column ops (last-dim slice, cat) compute their operands
    at other columns; every other op keeps its consumer's columns."""

    cols: str = "cols"
    mask: str = "col_mask"


BASE_COLUMNS = Columns()
_Key = tuple[SSAValue, Columns | None]


@dataclass
class _Scope:
    values: dict[_Key, Value] = field(default_factory=dict)
    parent: _Scope | None = None

    def get(self, v: _Key) -> Value | None:
        s: _Scope | None = self
        while s is not None:
            if v in s.values:
                return s.values[v]
            s = s.parent
        return None


class KernelEmitter:
    """Writes the `@triton.jit` function for one region."""

    def __init__(self, op: ad.FusedOp, plan: KernelPlan, name: str):
        self.plan = plan
        self.name = name
        self.w = IndentedWriter()
        self.scope = _Scope()
        self.columns = BASE_COLUMNS
        self._tmp = 0
        self.block = op.body.block
        self.arg_input = {a: plan.inputs[i] for i, a in enumerate(self.block.args)}

    # -- names -----------------------------------------------------------------

    def tmp(self, expr: str, ctype: str) -> Value:
        """`expr` as a named value (a name is not copied into another)."""
        if expr.isidentifier():
            return Value(expr, ctype)
        name = f"t{self._tmp}"
        self._tmp += 1
        self.w.line(f"{name} = {expr}")
        return Value(name, ctype)

    def params(self) -> list[str]:
        p = self.plan
        names = [i.name for i in p.inputs]
        names += [f"out{j}" for j in range(len(p.output_types))]
        names += [f"size{d}" for d in range(p.rank) if p.domain[d] == DYNAMIC_INDEX]
        names.append("n_rows")
        names += [i.stride_arg(d) for i in p.inputs for d in i.stride_dims]
        return [*names, "BLOCK_R: tl.constexpr", "BLOCK_C: tl.constexpr"]

    # -- values ----------------------------------------------------------------

    def convert(self, v: Value, ctype: str) -> str:
        if v.ctype == ctype:
            return v.expr
        if v.literal and ctype == "f32":
            return repr(float(v.expr)) if v.expr not in ("True", "False") else repr(float(v.expr == "True"))
        if v.literal and ctype in ("i64", "i32") and v.ctype != "f32":
            return str(int(v.expr == "True")) if v.expr in ("True", "False") else v.expr
        if ctype == "i1":
            return f"({v.expr} != 0)"
        return f"{v.expr}.to({_TL_COMPUTE[ctype]})"

    def key(self, v: SSAValue) -> _Key:
        """Values that vary along the row are kept per column expression."""
        shape = shape_of(v.type)
        varies = bool(shape) and shape[-1] != 1 and self.plan.domain[-1] != 1
        return (v, self.columns if varies else None)

    def value(self, v: SSAValue) -> Value:
        key = self.key(v)
        known = self.scope.get(key)
        if known is not None:
            return known
        if v in self.arg_input:
            result = self.load(self.arg_input[v])
        else:
            owner = v.owner
            assert isinstance(owner, Operation)
            result = self.emit_op(owner)
        self.scope.values[key] = result
        return result

    def value_at(self, v: SSAValue, columns: Columns) -> Value:
        outer, self.columns = self.columns, columns
        try:
            return self.value(v)
        finally:
            self.columns = outer

    def column_mask(self, width: int) -> str:
        """The lanes of the current columns that exist in a value `width` wide."""
        if self.columns == BASE_COLUMNS and str(width) == self.plan.n_cols:
            return self.columns.mask
        return f"{self.columns.mask} & ({self.columns.cols} < {width})"

    def load(self, inp: KernelInput) -> Value:
        ctype = compute_type(inp.type)
        if not inp.is_tensor:
            return Value(inp.name, ctype)
        last = self.plan.rank - 1
        terms = [f"i{d} * {inp.stride_arg(d)}" for d in inp.stride_dims if d != last]
        masks = ["row_mask"] if terms else []
        if last in inp.stride_dims:
            width = shape_of(inp.type)[-1]
            terms.append(f"{self.columns.cols} * {inp.stride_arg(last)}")
            masks.append(self.column_mask(self.plan.n_cols if width == DYNAMIC_INDEX else width))
        if not terms:
            # A [1, 1] block, not a scalar: the interpreter's scalar bools break `&` with blocks.
            loaded = f"tl.load({inp.name} + tl.zeros([1, 1], tl.int32))"
        else:
            loaded = f"tl.load({inp.name} + {' + '.join(terms)}, mask={' & '.join(masks)}, other=0)"
        if ctype == "f32" and inp.type.element_type != Float32Type():
            loaded += ".to(tl.float32)"
        return self.tmp(loaded, ctype)

    # -- ops -------------------------------------------------------------------

    def emit_op(self, op: Operation) -> Value:
        if isinstance(op, ad.ConstantOp):
            return _literal(op)
        if isinstance(op, REDUCTIONS):
            return self.reduce_tile(op)
        ctype = compute_type(op.results[0].type)
        emit = _EMITTERS.get(type(op))
        if emit is not None:
            return emit(self, op, ctype)
        if type(op) in UNARY:
            return self.tmp(UNARY[type(op)].format(a=self.operand(op.input, ctype)), ctype)
        if type(op) in BINARY:
            a, b = (self.operand(x, ctype) for x in op.operands)
            return self.tmp(BINARY[type(op)].format(a=a, b=b), ctype)
        if type(op) in COMPARE:
            common = _promoted([self.value(x).ctype for x in op.operands])
            a, b = (self.operand(x, common) for x in op.operands)
            return self.tmp(COMPARE[type(op)].format(a=a, b=b), "i1")
        raise CodegenError(f"no Triton form for '{op.name}'")

    def operand(self, v: SSAValue, ctype: str) -> str:
        return self.convert(self.value(v), ctype)

    # -- reductions ------------------------------------------------------------

    def reduction_terms(self, op: Operation) -> tuple[str, str]:
        """(masked tile, its partial reduction) for `op` over the current column tile."""
        ctype = compute_type(op.result.type)
        x = self.convert(self.value_at(op.input, BASE_COLUMNS), ctype)
        masked = self.tmp(f"tl.where(col_mask, {x}, {_NEUTRAL[(type(op), ctype)]})", ctype).expr
        if isinstance(op, ad.SumOp | ad.MeanOp):
            return masked, f"tl.sum({masked}, axis=1, keep_dims=True)"
        fn = "tl.max" if isinstance(op, ad.AmaxOp) else "tl.min"
        extreme = f"{fn}({masked}, axis=1, keep_dims=True)"
        if ctype != "f32":
            return masked, extreme
        # tl.max/tl.min skip NaN; torch's amax/amin return it.
        has_nan = f"tl.max(({masked} != {masked}).to(tl.int32), axis=1, keep_dims=True) > 0"
        return masked, f'tl.where({has_nan}, float("nan"), {extreme})'

    def reduce_tile(self, op: Operation) -> Value:
        """A reduction whose whole row is in this tile (single-tile row kernels)."""
        if self.plan.looped:
            raise CodegenError("looped row kernels compute reductions before the loop")
        ctype = compute_type(op.result.type)
        _, partial = self.reduction_terms(op)
        result = self.tmp(partial, ctype)
        return self.finish_reduction(op, result)

    def finish_reduction(self, op: Operation, total: Value) -> Value:
        if isinstance(op, ad.MeanOp):
            n = self.plan.n_cols
            return self.tmp(f"{total.expr} / {n if n.startswith('size') else float(n)}", total.ctype)
        return total

    # -- the kernel ------------------------------------------------------------

    def emit(self) -> str:
        w = self.w
        w.line("@triton.jit")
        w.line(f"def {self.name}({', '.join(self.params())}):")
        with w.indent():
            self.emit_rows()
            if not self.plan.has_reductions:
                self.emit_pointwise_body()
            elif self.plan.looped:
                self.emit_looped_body()
            else:
                self.emit_columns("tl.arange(0, BLOCK_C)[None, :]")
                self.emit_stores(self.all_outputs())
        return w.text()

    def emit_rows(self) -> None:
        w, p = self.w, self.plan
        w.line("rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]")
        w.line("row_mask = rows < n_rows")
        lead = p.leading_dims
        if not lead:
            return
        if len(lead) == 1:
            w.line(f"i{lead[0]} = rows")
            return
        w.line("rem = rows")
        for d in reversed(lead[1:]):
            w.line(f"i{d} = rem % {p.size(d)}")
            w.line(f"rem = rem // {p.size(d)}")
        w.line(f"i{lead[0]} = rem")

    def emit_columns(self, cols: str) -> None:
        self.w.line(f"cols = {cols}")
        self.w.line(f"col_mask = cols < {self.plan.n_cols}")
        self.w.line("mask = row_mask & col_mask")

    def emit_pointwise_body(self) -> None:
        self.emit_columns("tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]")
        self.emit_stores(self.all_outputs(), column_blocks=True)

    def all_outputs(self) -> list[int]:
        return list(range(len(self.plan.output_types)))

    def emit_stores(self, outputs: Sequence[int], column_blocks: bool = False) -> None:
        """Store `outputs`; with `column_blocks` (pointwise tiles), an output that does not vary
        along the row is written by column 0 only."""
        yielded = self.block.last_op.operands
        for j in outputs:
            t = self.plan.output_types[j]
            v = self.convert(self.value(yielded[j]), compute_type(t))
            offset, masks = self.store_address(t)
            if self.plan.is_row_level_output(t) and column_blocks:
                offset, masks = f"{offset} + cols * 0", [*masks, "(cols == 0)"]
            self.w.line(f"tl.store(out{j} + {offset}, {self.stored(v, t)}, mask={' & '.join(masks)})")

    def store_address(self, t: TensorType) -> tuple[str, list[str]]:
        """(offset, masks) of the tile in a contiguous output of type `t`. An output that
        broadcasts over a dim is written by the lanes whose index there is 0 only."""
        p = self.plan
        dims = p.aligned(t)
        if all(size == p.domain[d] for d, size in dims):
            return f"rows * {p.n_cols} + cols", ["mask"]
        terms, masks, stride = [], ["row_mask"], "1"
        for d, size in reversed(dims):
            if size == 1:
                if p.domain[d] != 1 and d != p.rank - 1:
                    masks.append(f"(i{d} == 0)")
                continue
            index = "cols" if d == p.rank - 1 else f"i{d}"
            terms.append(index if stride == "1" else f"{index} * {stride}")
            extent = p.dim_size(d, size)
            stride = extent if stride == "1" else f"{stride} * {extent}"
            if d == p.rank - 1:
                masks.append("col_mask" if extent == p.n_cols else f"(cols < {extent})")
        if not any(t.startswith("i") for t in terms):
            # The pointer must span the tile's rows (a value or mask of the tile never
            # broadcasts to a smaller pointer); the row masks keep one writer per element.
            terms.append("rows * 0")
        return " + ".join(reversed(terms)), masks

    def stored(self, v: str, t: TensorType) -> str:
        element = t.element_type
        return f"({v}).to({_TL_FLOAT[element]})" if element in _TL_FLOAT and element != Float32Type() else v

    def emit_looped_body(self) -> None:
        """One pass over the row per reduction depth, then one that writes the outputs."""
        w = self.w
        by_depth = _reductions_by_depth(self.block)
        loop = f"for c0 in range(0, {self.plan.n_cols}, BLOCK_C):"
        for reductions in by_depth:
            accs = []
            for red in reductions:
                ctype = compute_type(red.result.type)
                acc = self.tmp(f"tl.full([BLOCK_R, 1], {_NEUTRAL[(type(red), ctype)]}, {_TL_COMPUTE[ctype]})", ctype)
                accs.append(acc)
            w.line(loop)
            with w.indent():
                self.scope = _Scope(parent=self.scope)
                self.emit_columns("c0 + tl.arange(0, BLOCK_C)[None, :]")
                for red, acc in zip(reductions, accs, strict=True):
                    _, partial = self.reduction_terms(red)
                    w.line(f"{acc.expr} = {_combine(red, acc.expr, partial)}")
                self.scope = self.scope.parent
            for red, acc in zip(reductions, accs, strict=True):
                self.scope.values[self.key(red.result)] = self.finish_reduction(red, acc)
        row_outputs = [j for j, t in enumerate(self.plan.output_types) if self.plan.is_row_level_output(t)]
        elem_outputs = [j for j in self.all_outputs() if j not in row_outputs]
        if row_outputs:
            self.emit_stores(row_outputs)
        if elem_outputs:
            w.line(loop)
            with w.indent():
                self.scope = _Scope(parent=self.scope)
                self.emit_columns("c0 + tl.arange(0, BLOCK_C)[None, :]")
                self.emit_stores(elem_outputs)
                self.scope = self.scope.parent


def _combine(op: Operation, acc: str, partial: str) -> str:
    if isinstance(op, ad.SumOp | ad.MeanOp):
        return f"{acc} + {partial}"
    fn = "tl.maximum" if isinstance(op, ad.AmaxOp) else "tl.minimum"
    nan = ", propagate_nan=tl.PropagateNan.ALL" if compute_type(op.result.type) == "f32" else ""
    return f"{fn}({acc}, {partial}{nan})"


def _reductions_by_depth(block) -> list[list[Operation]]:
    """Reductions grouped by how many reductions feed them (a pass computes one group)."""
    depth: dict[SSAValue, int] = {}
    groups: dict[int, list[Operation]] = {}
    for op in block.ops:
        d = max((depth.get(v, 0) for v in op.operands), default=0)
        if isinstance(op, REDUCTIONS):
            groups.setdefault(d, []).append(op)
            d += 1
        for r in op.results:
            depth[r] = d
    return [groups[d] for d in sorted(groups)]


# ------------------------------------------------------- ops with their own form


def _narrow_float(t: Attribute) -> str | None:
    element = t.element_type if isinstance(t, TensorType) else t
    return _TL_FLOAT[element] if element in _TL_FLOAT and element != Float32Type() else None


def _emit_cast(e: KernelEmitter, op: ad.CastOp, ctype: str) -> Value:
    """Casts are where the program states a precision: a value computed in a narrow float type
    (held in fp32 until here) is rounded to it before it is cast, and a cast to a narrow float
    rounds. A loaded value already has its type's precision."""
    x = e.value(op.input)
    source = _narrow_float(op.input.type)
    if source is not None and op.input not in e.arg_input:
        x = e.tmp(f"{x.expr}.to({source}).to(tl.float32)", x.ctype)
    target = op.result.type.element_type
    if ctype == "f32" and _narrow_float(target) is not None:
        return e.tmp(f"{e.convert(x, 'f32')}.to({_TL_FLOAT[target]}).to(tl.float32)", ctype)
    if x.ctype == "f32" and ctype in ("i64", "i32"):
        return e.tmp(f"{x.expr}.to({_TL_COMPUTE[ctype]})", ctype)  # truncates, like torch
    return e.tmp(e.convert(x, ctype), ctype) if not x.literal else Value(e.convert(x, ctype), ctype, True)


def _alpha(op: ad.AlphaBinaryOp) -> str:
    return "" if op.alpha is None else f"{op.alpha.value.data!r} * "


def _emit_add_sub(e: KernelEmitter, op: ad.AlphaBinaryOp, ctype: str) -> Value:
    a, b = e.operand(op.input, ctype), e.operand(op.other, ctype)
    sign = "+" if isinstance(op, ad.AddOp) else "-"
    return e.tmp(f"{a} {sign} {_alpha(op)}{b}", ctype)


def _emit_div(e: KernelEmitter, op: ad.DivOp, ctype: str) -> Value:
    a, b = e.operand(op.input, ctype), e.operand(op.other, ctype)
    q = e.tmp(f"{a} / {b}", ctype)
    if op.rounding_mode is None:
        return q
    if op.rounding_mode.data == "floor":
        return e.tmp(f"tl.floor({q.expr})", ctype)
    return e.tmp(f"tl.where({q.expr} < 0, tl.ceil({q.expr}), tl.floor({q.expr}))", ctype)


def _emit_pow(e: KernelEmitter, op: ad.PowOp, ctype: str) -> Value:
    a = e.tmp(e.operand(op.input, ctype), ctype).expr
    return e.tmp(_POW_BY_EXPONENT[pow_exponent(op)].format(a=a), ctype)


def _emit_min_max(e: KernelEmitter, op: Operation, ctype: str) -> Value:
    a, b = (e.operand(x, ctype) for x in op.operands)
    fn = "tl.maximum" if isinstance(op, ad.MaximumOp) else "tl.minimum"
    nan = ", propagate_nan=tl.PropagateNan.ALL" if ctype == "f32" else ""
    return e.tmp(f"{fn}({a}, {b}{nan})", ctype)


def _emit_logical(e: KernelEmitter, op: Operation, ctype: str) -> Value:
    a, b = (e.operand(x, "i1") for x in op.operands)
    return e.tmp(f"{a} {'&' if isinstance(op, ad.LogicalAndOp) else '|'} {b}", "i1")


def _emit_not(e: KernelEmitter, op: Operation, ctype: str) -> Value:
    x = e.value(op.input)
    if isinstance(op, ad.LogicalNotOp) or x.ctype == "i1":
        return e.tmp(f"{x.expr} == 0", "i1")
    return e.tmp(f"~{x.expr}", ctype)


def _emit_where(e: KernelEmitter, op: ad.WhereOp, ctype: str) -> Value:
    c = e.operand(op.condition, "i1")
    a, b = e.operand(op.input, ctype), e.operand(op.other, ctype)
    return e.tmp(f"tl.where({c}, {a}, {b})", ctype)


def _emit_tanh(e: KernelEmitter, a: str) -> str:
    """tanh(a) = sign(a) (1 - t) / (1 + t), t = exp(-2|a|): no overflow for large |a|."""
    t = e.tmp(f"tl.exp(-2.0 * tl.abs({a}))", "f32").expr
    r = e.tmp(f"(1.0 - {t}) / (1.0 + {t})", "f32").expr
    return f"tl.where({a} < 0, -{r}, {r})"


def _emit_tanh_op(e: KernelEmitter, op: ad.TanhOp, ctype: str) -> Value:
    a = e.tmp(e.operand(op.input, "f32"), "f32").expr
    return e.tmp(_emit_tanh(e, a), "f32")


def _emit_gelu(e: KernelEmitter, op: ad.GeluOp, ctype: str) -> Value:
    a = e.tmp(e.operand(op.input, "f32"), "f32").expr
    if op.approximate is not None and op.approximate.data == "tanh":
        inner = e.tmp(f"0.7978845608028654 * ({a} + 0.044715 * {a} * {a} * {a})", "f32").expr
        return e.tmp(f"0.5 * {a} * (1.0 + {_emit_tanh(e, inner)})", "f32")
    return e.tmp(f"0.5 * {a} * (1.0 + tl.erf({a} * 0.7071067811865476))", "f32")


def _emit_slice(e: KernelEmitter, op: ad.SliceOp, ctype: str) -> Value:
    start, step = op.static_start(), op.static_bounds.get_values()[2]
    cols = e.columns.cols
    shifted = cols if step == 1 else f"{cols} * {step}"
    shifted = shifted if start == 0 else f"{start} + {shifted}"
    return e.value_at(op.input, Columns(f"({shifted})" if shifted != cols else cols, e.columns.mask))


def _emit_cat(e: KernelEmitter, op: ad.CatOp, ctype: str) -> Value:
    """Each operand is computed at the columns it covers, the others' lanes masked off."""
    cols, pieces, offset = e.columns.cols, [], 0
    for t in op.tensors:
        width = shape_of(t.type)[-1]
        inside = f"({cols} >= {offset}) & ({cols} < {offset + width})"
        columns = Columns(f"({cols} - {offset})" if offset else cols, f"{e.columns.mask} & {inside}")
        pieces.append((offset, e.convert(e.value_at(t, columns), ctype)))
        offset += width
    expr = pieces[-1][1]
    for (_, piece), (next_offset, _) in zip(reversed(pieces[:-1]), reversed(pieces[1:]), strict=True):
        expr = f"tl.where({cols} < {next_offset}, {piece}, {expr})"
    return e.tmp(expr, ctype)


_EMITTERS: dict[type[Operation], Callable[[KernelEmitter, Operation, str], Value]] = {
    ad.SliceOp: _emit_slice,
    ad.CatOp: _emit_cat,
    ad.CastOp: _emit_cast,
    ad.AddOp: _emit_add_sub,
    ad.SubOp: _emit_add_sub,
    ad.DivOp: _emit_div,
    ad.PowOp: _emit_pow,
    ad.MaximumOp: _emit_min_max,
    ad.MinimumOp: _emit_min_max,
    ad.LogicalAndOp: _emit_logical,
    ad.LogicalOrOp: _emit_logical,
    ad.LogicalNotOp: _emit_not,
    ad.BitwiseNotOp: _emit_not,
    ad.WhereOp: _emit_where,
    ad.TanhOp: _emit_tanh_op,
    ad.GeluOp: _emit_gelu,
}


# --------------------------------------------------------------- the launcher


class LauncherEmitter:
    """Writes the host side: output shapes, and `launch(kernel, tensors, scalars)`, which
    allocates the outputs and starts the kernel (skipped when there is nothing to compute).

    A dynamic size is the broadcast of the inputs' sizes there, read at run time (an input
    typed `?` may be 1 and broadcast: `codegen/launch.py`), and inputs are read with stride 0
    where they have size 1. An output computed from only some of the inputs that set a size
    may be 1 there while the domain is not: it is written over the domain and cut to its shape."""

    def __init__(self, plan: KernelPlan):
        self.plan = plan
        self.w = IndentedWriter()

    def size_expr(self, d: int, inputs: Sequence[KernelInput]) -> str:
        """The run-time size of domain dim `d` set by `inputs` (1 where none has it)."""
        sizes = [f"{i.name}.shape[{j}]" for i in inputs for dd, j in zip(i.stride_dims, i.input_dims, strict=True)
                 if dd == d]
        if len(sizes) == 1:
            return sizes[0]
        return f"broadcast_size({', '.join(sizes)})" if sizes else "1"

    def size_lines(self) -> None:
        p, w = self.plan, self.w
        tensors = [i for i in p.inputs if i.is_tensor]
        w.line(f"{''.join(i.name + ', ' for i in tensors)}= tensors")
        for d in range(p.rank):
            if p.domain[d] == DYNAMIC_INDEX:
                w.line(f"size{d} = {self.size_expr(d, tensors)}")

    def output_dims(self, j: int) -> list[str]:
        """Output `j`'s shape: the domain's, except where its own inputs set a dynamic size."""
        p, t = self.plan, self.plan.output_types[j]
        own = [i for i in p.inputs if i.is_tensor and i.index in p.output_sources[j]]
        offset = p.rank - len(shape_of(t))
        dims = []
        for k, n in enumerate(shape_of(t)):
            d = k + offset
            narrower = n == DYNAMIC_INDEX and self.size_expr(d, own) != self.size_expr(d, p.inputs)
            dims.append(self.size_expr(d, own) if narrower else p.dim_size(d, n))
        return dims

    def outputshape_of(self, t: TensorType) -> str:
        p = self.plan
        offset = p.rank - len(shape_of(t))
        return "(" + "".join(f"{p.dim_size(j + offset, n)}, " for j, n in enumerate(shape_of(t))) + ")"

    def emit(self) -> str:
        p, w = self.plan, self.w
        w.line(f"OUTPUT_DTYPES = ({''.join(_TORCH_DTYPE[t.element_type] + ', ' for t in p.output_types)})")
        shapes = ["(" + "".join(f"{d}, " for d in self.output_dims(j)) + ")" for j in range(len(p.output_types))]
        domain_shapes = [self.outputshape_of(t) for t in p.output_types]
        w.line()
        w.line()
        w.line("def output_shapes(tensors):")
        with w.indent():
            self.size_lines()
            w.line(f"return [{', '.join(shapes)}]")
        w.line()
        w.line()
        w.line("def launch(kernel, tensors, scalars):")
        with w.indent():
            self.size_lines()
            scalars = [i for i in p.inputs if not i.is_tensor]
            if scalars:
                w.line(f"{''.join(i.name + ', ' for i in scalars)}= scalars")
            device = next(i.name for i in p.inputs if i.is_tensor)
            w.line(f"outs = [torch.empty(s, dtype=d, device={device}.device) "
                   f"for s, d in zip([{', '.join(domain_shapes)}], OUTPUT_DTYPES)]")
            lead = " * ".join(p.size(d) for d in p.leading_dims) or "1"
            w.line(f"n_rows = {lead}")
            result = "outs"
            if shapes != domain_shapes:
                w.line("final_shapes = output_shapes(tensors)")
                result = "[narrowed(o, s) for o, s in zip(outs, final_shapes)]"
            w.line(f"if n_rows == 0 or {p.n_cols} == 0:")
            with w.indent():
                w.line(f"return {result}")
            blocks = "row_blocks" if p.has_reductions else "pointwise_blocks"
            w.line(f"block_r, block_c, num_warps = {blocks}(n_rows, {p.n_cols})")
            grid = "cdiv(n_rows, block_r)"
            if not p.has_reductions:
                grid += f", cdiv({p.n_cols}, block_c)"
            args = [i.name for i in p.inputs] + [f"outs[{j}]" for j in range(len(p.output_types))]
            args += [f"size{d}" for d in range(p.rank) if p.domain[d] == DYNAMIC_INDEX]
            args.append("n_rows")
            args += [f"broadcast_stride({i.name}, {j})" for i in p.inputs for j in i.input_dims]
            w.line(f"kernel[({grid},)](")
            with w.indent():
                w.line(", ".join(args) + ",")
                # FMA contraction on, as Triton 3.9 defaults (3.10 turns it off unless asked).
                w.line("BLOCK_R=block_r, BLOCK_C=block_c, num_warps=num_warps, enable_fp_fusion=True,")
            w.line(")")
            w.line(f"return {result}")
        return w.text()


def emit_kernel_module(op: ad.FusedOp, name: str, header: str) -> str:
    """The whole kernel file: imports, the `@triton.jit` kernel and its launcher."""
    plan = plan_kernel(op)
    helpers = {"ad_mlir.codegen.templates.blocks": ["pointwise_blocks", "row_blocks"],
               "ad_mlir.codegen.launch": ["broadcast_size", "broadcast_stride", "narrowed"]}
    return module_source(header, helpers, [], [KernelEmitter(op, plan, name).emit(), LauncherEmitter(plan).emit()])
