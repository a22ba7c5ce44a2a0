"""What a kernel can hold: the legality checks that passes ask before they make an op that
becomes a kernel, as a property of the dialect. The code generator implements exactly these
forms (`codegen/templates/region_kernel.py` has an expression for each op admitted here, the attention
templates hold every head `check_rope_dims` accepts); passes ask here, never the generator."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    BFloat16Type,
    Float8E4M3FNType,
    Float16Type,
    Float32Type,
    Float64Type,
    IndexType,
    IntegerType,
    TensorType,
)
from xdsl.ir import Attribute, Operation

from ad_mlir.dialects import ad

Shape = tuple[int, ...]


def next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


# ------------------------------------------------------------- region kernels

KERNEL_FLOATS = (Float32Type(), Float16Type(), BFloat16Type(), Float8E4M3FNType())
"""Float element types a region kernel loads and stores (computed in fp32)."""

UNARY_OPS: tuple[type[Operation], ...] = (
    ad.NegOp, ad.AbsOp, ad.ExpOp, ad.LogOp, ad.SqrtOp, ad.RsqrtOp, ad.ReciprocalOp, ad.SinOp, ad.CosOp,
    ad.ErfOp, ad.SigmoidOp, ad.SiluOp, ad.ReluOp,
)
BINARY_OPS: tuple[type[Operation], ...] = (ad.MulOp, ad.BitwiseAndOp, ad.BitwiseOrOp)
COMPARE_OPS: tuple[type[Operation], ...] = (ad.EqOp, ad.NeOp, ad.LtOp, ad.LeOp, ad.GtOp, ad.GeOp)
POW_EXPONENTS = (1.0, 2.0, 3.0, 0.5, -0.5, -1.0, -2.0)
"""Constant exponents of `pow` a kernel computes in the exact forms torch uses for them."""
REDUCTIONS = (ad.SumOp, ad.MeanOp, ad.AmaxOp, ad.AminOp)
REDUCTION_TYPES = frozenset({
    (ad.SumOp, "f32"), (ad.MeanOp, "f32"), (ad.AmaxOp, "f32"), (ad.AminOp, "f32"),
    (ad.SumOp, "i64"), (ad.SumOp, "i32"), (ad.AmaxOp, "i64"), (ad.AminOp, "i64"), (ad.AmaxOp, "i32"),
    (ad.AminOp, "i32"),
})
"""(reduction, kernel type) pairs a kernel has a neutral padding value for."""


class CodegenError(Exception):
    """A region the Triton codegen cannot emit (the fuser asks `supports` first)."""


def compute_type(t: Attribute) -> str:
    """How the kernel holds a value of IR type `t`: fp32 for every float, integers as they are."""
    element = t.element_type if isinstance(t, TensorType) else t
    if element in KERNEL_FLOATS or isinstance(element, Float64Type):
        return "f32"
    if element in (IntegerType(64), IndexType()):
        return "i64"
    if element == IntegerType(32):
        return "i32"
    if element == IntegerType(1):
        return "i1"
    raise CodegenError(f"no kernel type for {element}")


def shape_of(t: Attribute) -> Shape:
    return tuple(t.get_shape()) if isinstance(t, TensorType) else ()


def pow_exponent(op: ad.PowOp) -> float | None:
    owner = op.other.owner
    if isinstance(owner, ad.ConstantOp) and isinstance(op.input.type, TensorType):
        return float(owner.value.value.data)
    return None


def static_width(t: Attribute) -> int | None:
    """The last dim of a tensor type when it is static and more than 1 (a column op's width)."""
    shape = shape_of(t)
    return shape[-1] if shape and shape[-1] not in (DYNAMIC_INDEX, 0, 1) else None


def is_last_dim(op: ad.SliceOp | ad.CatOp) -> bool:
    rank = len(shape_of(op.results[0].type))
    dim = 0 if op.dim is None else op.dim.value.data  # a cat without `dim` is torch.cat's default, 0
    return ad.normalize_dim(dim, rank) == rank - 1


def is_column_op(op: Operation) -> bool:
    """A slice or concatenation of the last dim with static widths above 1: columns map to
    columns of its operands, so it is index math inside a row (RoPE's rotate_half)."""
    if isinstance(op, ad.SliceOp):
        return (
            is_last_dim(op)
            and not op.bounds
            and op.static_start() is not None
            and static_width(op.input.type) is not None
            and static_width(op.result.type) is not None
        )
    if isinstance(op, ad.CatOp):
        ranks = {len(shape_of(t.type)) for t in op.tensors}
        return (
            is_last_dim(op)
            and ranks == {len(shape_of(op.result.type))}
            and all(static_width(t.type) is not None for t in (*op.tensors, op.result))
        )
    return False


def supports(op: Operation) -> bool:
    """Whether the codegen can emit `op` inside a region (the fuser leaves other ops out)."""
    if isinstance(op, ad.SliceOp | ad.CatOp):
        return is_column_op(op)
    if isinstance(op, ad.PowOp):
        return pow_exponent(op) in POW_EXPONENTS
    if isinstance(op, ad.DivOp) and op.rounding_mode is not None:
        return compute_type(op.result.type) == "f32"
    if isinstance(op, REDUCTIONS):
        return (type(op), compute_type(op.result.type)) in REDUCTION_TYPES
    if isinstance(op, ad.BitwiseNotOp | ad.BitwiseAndOp | ad.BitwiseOrOp):
        return compute_type(op.results[0].type) != "f32"
    return isinstance(op, UNARY_OPS + BINARY_OPS + COMPARE_OPS + (
        ad.TanhOp, ad.GeluOp, ad.LogicalNotOp, ad.BitwiseNotOp, ad.CastOp, ad.AddOp, ad.SubOp,
        ad.DivOp, ad.MaximumOp, ad.MinimumOp, ad.LogicalAndOp, ad.LogicalOrOp, ad.WhereOp,
        ad.ConstantOp,
    ))


# ------------------------------------------------------------- attention templates

MAX_HEAD_DIM = 256
"""The widest head (padded pieces) the block table has tiles for."""
MIN_PIECE = 16
"""A piece of the head dim feeds a tl.dot, whose depth is at least 16."""


def padded_width(width: int) -> int:
    """A piece's width in registers: a power of two >= MIN_PIECE (0 for no piece)."""
    return max(MIN_PIECE, next_power_of_2(width)) if width else 0


@dataclass(frozen=True)
class HeadPieces:
    """How a head of `head_dim` dims is held in registers: the rotated pairs as two pieces `a`,
    `b` of `half` dims each, then the dims RoPE passes through (partial rotary) as a piece `p` of
    `rest` dims and a piece `t` of the `tail` dims after it (none when 0); each piece padded to
    a power of two >= MIN_PIECE (`padded_width`). Passed dims are split in two where that pads less
    (96 as 64 + 32, not 128). Without RoPE the head is split the same way, unrotated: half =
    head_dim // 2."""

    head_dim: int
    half: int
    rest: int
    tail: int

    @property
    def head_p(self) -> int:
        """The head dim padded to a power of two: the V and output tiles' width."""
        return padded_width(self.head_dim)

    @property
    def width(self) -> int:
        """The padded width of the pieces together, rounded to a power of two: what sizes the
        tiles (the block tables' key)."""
        return max(self.head_p, next_power_of_2(2 * padded_width(self.half) + padded_width(self.rest) + padded_width(self.tail)))

    @property
    def constexprs(self) -> dict[str, int]:
        """The `_load_pieces` constexprs: each piece's width and padded width."""
        return {"HALF": self.half, "HALF_P": padded_width(self.half), "REST": self.rest, "REST_P": padded_width(self.rest),
                "TAIL": self.tail, "TAIL_P": padded_width(self.tail)}

    @property
    def names(self) -> tuple[str, ...]:
        """The pieces there are, of a, b, p, t."""
        return ("a", "b") + (("p",) if self.rest else ()) + (("t",) if self.tail else ())


def head_pieces(head_dim: int, rotary_dim: int | None) -> HeadPieces:
    """The pieces of a head rotated on its first `rotary_dim` dims (None: no RoPE)."""
    half = (rotary_dim if rotary_dim is not None else head_dim) // 2
    passed = head_dim - 2 * half
    low = 1 << max(passed.bit_length() - 1, 0)  # the largest power of two <= passed
    if passed > MIN_PIECE and low < passed and low + padded_width(passed - low) < padded_width(passed):
        return HeadPieces(head_dim, half, low, passed - low)
    return HeadPieces(head_dim, half, passed, 0)


def check_rope_dims(what: str, head_dim: int, rotary_dim: int | None, interleaved: bool) -> HeadPieces:
    """The pieces of a head, or ValueError naming `what` when a template cannot hold it."""
    if head_dim < 1:
        raise ValueError(f"{what}: head_dim {head_dim} must be positive")
    if rotary_dim is not None and (rotary_dim < 2 or rotary_dim % 2 or rotary_dim > head_dim):
        raise ValueError(f"{what}: rotary_dim {rotary_dim} must be even and in 2..head_dim {head_dim}")
    if interleaved and rotary_dim is None:
        raise ValueError(f"{what}: interleaved pairs need RoPE (a rotary_dim)")
    pieces = head_pieces(head_dim, rotary_dim)
    if pieces.width > MAX_HEAD_DIM:
        raise ValueError(f"{what}: head_dim {head_dim} (rotary_dim {rotary_dim}) needs tiles {pieces.width} wide, "
                         f"over the {MAX_HEAD_DIM} the kernel has registers for; use the unfused attention for it")
    return pieces
