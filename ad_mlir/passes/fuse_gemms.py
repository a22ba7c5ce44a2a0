"""`fuse-gemms`: linears that share their input -> one linear over concatenated weights.

Q/K/V projections read the same normalized activation, and so do an MLP's gate and up
projections: one GEMM over `cat([w_q, w_k, w_v])` reads the activation once and launches once.
Each old result becomes a last-dim `ad.slice` of the fused output (a zero-copy narrow: the
consumers read it through its strides, `fuse-silu-mul` and the fused regions included).

Only weights (and biases) that are function arguments are concatenated: their `ad.cat`
depends on weights alone, so the exporter computes it once, at compile time, and the compiled
graph holds the concatenated weight instead of the parts. Linears with a bias join only
linears with a bias, and all must share the weight dtype and input features.

Block-scaled FP8 linears (`ad.linear_fp8_block`, a fine-grained FP8 checkpoint's) fuse the same
way among themselves: the fp8 weights and their `weight_scale_inv` are concatenated along N, so
they must share the block size and each part but the last must fill whole N blocks (its rows a
multiple of bn: Qwen3-8B's q, k, v of 4096, 1024, 1024 rows in blocks of 128 do), else a block
of scales would straddle two weights. The activation's quantization (per token per K group) is
the same for every part, so the fused op computes exactly what the parts did.

FP8 linears with per-channel weight scales (`ad.linear_fp8` with `weight_scale` [N, 1], a
compressed-tensors FP8-dynamic checkpoint's) fuse among those that share the quantized input and
its scale: the fp8 weights and their scales are concatenated along N, and each output channel
keeps its own scale, so again the fused op computes what the parts did. Per-tensor weight scales
(one value a part) do not concatenate, and are left alone.

NVFP4 linears (`ad.linear_nvfp4`, a ModelOpt NVFP4 checkpoint's) fuse among themselves: the
packed codes and their e4m3 block scales (one a row per 16 elements) are concatenated along N.
Each part has its own global scale (`weight_scale_2`, one value computed from that weight's
amax), and the fused op takes them folded into one per output row: each part's value expanded
over its rows, then concatenated ([N] f32, at compile time). The fused op then computes exactly
what the parts did. (vLLM instead takes the largest of the parts' global scales, which is exact
only when they are equal.)

Int4 linears (`ad.linear_int4`, a GPTQ or AWQ checkpoint's) fuse among those with the same group
size, zero offset and scales dtype: the packed words (`qweight` [K / 8, N]), the zero points
(`qzeros` [G, N / 8], N a multiple of 8 in every part) and the scales ([G, N]) are concatenated
along N, each output column keeping its own codes, zero point and scale. With act-order each
input row's group is `g_idx`, which all the parts must share: the loader gives equal `g_idx` one
tensor (GPTQ's Q/K/V and gate/up have equal ones: one input, one Hessian), so they are the same
function argument here; parts with different `g_idx`, or some with and some without, are not
merged.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import DenseArrayBase, IntegerAttr, ModuleOp, TensorType, i64
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from ad_mlir.dialects import ad
from ad_mlir.dialects.weights import weight_arguments

log = logging.getLogger(__name__)


Gemm = ad.LINEAR_OPS


def _per_channel(op: ad.LinearFp8Op) -> bool:
    """Its weight scale is one per output channel ([N, 1]): scales that concatenate along N."""
    return tuple(op.weight_scale.type.get_shape()) == (op.weight.type.get_shape()[0], 1)


def _fills_blocks(group: list[Gemm]) -> bool:
    """Block-scaled parts but the last fill whole N blocks (their scales concatenate)."""
    if not isinstance(group[0], ad.LinearFp8BlockOp):
        return True
    bn = group[0].blocks()[0]
    return all(op.weight.type.get_shape()[0] % bn == 0 for op in group[:-1])


def fusible_groups(entry: Block, weights: set[SSAValue]) -> list[list[Gemm]]:
    """Linears of `entry` grouped by (kind, input, weight dtype, in-features, has bias, result
    dtype, block size or the FP8 input's scale), in program order, each with weights (and scales) from `weights`; groups of
    one, and block-scaled groups whose scales would not concatenate, are dropped."""
    groups: dict[tuple, list[Gemm]] = {}
    for op in entry.ops:
        if isinstance(op, ad.LinearInt4Op):
            key = _int4_key(op, weights)
            if key is not None:
                groups.setdefault(key, []).append(op)
            continue
        if not isinstance(op, Gemm) or op.weight not in weights:
            continue
        if op.bias is not None and op.bias not in weights:
            continue
        blocks = None
        if isinstance(op, ad.LinearFp8BlockOp):
            if op.weight_scale_inv not in weights:
                continue
            blocks = op.blocks()
        if isinstance(op, ad.LinearFp8Op):
            if op.weight_scale not in weights or not _per_channel(op):
                continue
            blocks = op.input_scale
        if isinstance(op, ad.LinearNvfp4Op) and (op.weight_scale not in weights or op.weight_scale_2 not in weights):
            continue
        w = op.weight.type
        key = (type(op), op.input, w.element_type, w.get_shape()[1], op.bias is not None,
               op.result.type.element_type, blocks)
        groups.setdefault(key, []).append(op)
    return [g for g in groups.values() if len(g) > 1 and _fills_blocks(g)]


def _int4_key(op: ad.LinearInt4Op, weights: set[SSAValue]) -> tuple | None:
    """What int4 linears must share to fuse (see the module docstring); None for one whose
    tensors are not all weights."""
    if any(v not in weights for v in (op.qweight, op.qzeros, op.scales, op.g_idx, op.bias) if v is not None):
        return None
    return (type(op), op.input, op.features()[1], op.scales.type.element_type, op.bias is not None,
            op.result.type.element_type, op.group_size.value.data, op.zero_offset.value.data, op.g_idx)


def _width(op: Gemm) -> int:
    """Its out-features."""
    return op.features()[0] if isinstance(op, ad.LinearInt4Op) else op.weight.type.get_shape()[0]


def _cat(values: Sequence[SSAValue], dim: int = 0) -> ad.CatOp:
    types = [v.type for v in values]
    shape = list(types[0].get_shape())
    shape[dim] = sum(t.get_shape()[dim] for t in types)
    return ad.CatOp.build(
        operands=[list(values)],
        properties={"dim": IntegerAttr(dim, i64)},
        result_types=[TensorType(types[0].element_type, shape)],
    )


def _narrow(value: SSAValue, start: int, end: int, result_type: TensorType) -> ad.SliceOp:
    rank = len(result_type.get_shape())
    return ad.SliceOp.build(
        operands=[value, []],
        properties={"dim": IntegerAttr(rank - 1, i64), "static_bounds": DenseArrayBase.from_list(i64, [start, end, 1])},
        result_types=[result_type],
    )


def _global_scale_rows(group: list[ad.LinearNvfp4Op]) -> list[Operation]:
    """Each part's global scale as one value per output row ([N_i] f32): its one value expanded."""
    rows: list[Operation] = []
    for op in group:
        n = op.weight.type.get_shape()[0]
        rows.append(ad.ExpandOp.build(operands=[op.weight_scale_2, []],
                                      properties={"static_sizes": DenseArrayBase.from_list(i64, [n])},
                                      result_types=[TensorType(op.weight_scale_2.type.element_type, [n])]))
    return rows


def fuse_group(group: list[Gemm]) -> None:
    """Rewrite the linears of `group` into one, placed where the first one was."""
    first = group[0]
    bias = _cat([op.bias for op in group]) if first.bias is not None else None
    out_shape = [*first.result.type.get_shape()[:-1], sum(_width(op) for op in group)]
    result_type = TensorType(first.result.type.element_type, out_shape)
    if isinstance(first, ad.LinearInt4Op):
        new_ops: list[Operation] = [_cat([getattr(op, name) for op in group], 1)
                                    for name in ("qweight", "qzeros", "scales")]
        new_ops += [bias] if bias else []
        fused: Operation = ad.LinearInt4Op(first.input, *(c.result for c in new_ops[:3]), first.g_idx,
                                           bias.result if bias else None, first.group_size.value.data,
                                           first.zero_offset.value.data, result_type)
        _insert_fused(group, new_ops, fused)
        return
    new_ops = [weight := _cat([op.weight for op in group])]
    new_ops += [bias] if bias else []
    if isinstance(first, ad.LinearFp8BlockOp):
        new_ops.insert(1, scales := _cat([op.weight_scale_inv for op in group]))
        fused: Operation = ad.LinearFp8BlockOp(first.input, weight.result, scales.result,
                                               bias.result if bias else None, first.blocks(), result_type)
    elif isinstance(first, ad.LinearNvfp4Op):
        rows = _global_scale_rows(group)
        new_ops[1:1] = [*rows, scales := _cat([op.weight_scale for op in group]),
                        global_scales := _cat([row.result for row in rows])]
        fused = ad.LinearNvfp4Op(first.input, weight.result, scales.result, global_scales.result,
                                 bias.result if bias else None, result_type)
    elif isinstance(first, ad.LinearFp8Op):
        new_ops.insert(1, scales := _cat([op.weight_scale for op in group]))
        fused = ad.LinearFp8Op.build(operands=[first.input, weight.result, first.input_scale, scales.result,
                                               [bias.result] if bias else []],
                                     result_types=[result_type])
    else:
        fused = ad.LinearOp.build(operands=[first.input, weight.result, [bias.result] if bias else []],
                                  result_types=[result_type])
    _insert_fused(group, new_ops, fused)


def _insert_fused(group: list[Gemm], new_ops: list[Operation], fused: Operation) -> None:
    """`new_ops` then `fused` placed where the group's first linear was, each old result replaced
    by a slice of the fused one."""
    first = group[0]
    new_ops = [*new_ops, fused]
    start = 0
    narrows = []
    for op in group:
        width = _width(op)
        narrows.append(_narrow(fused.results[0], start, start + width, op.result.type))
        start += width
    for new in (*new_ops, *narrows):
        new.location = first.location
    Rewriter.insert_op([*new_ops, *narrows], InsertPoint.before(first))
    for op, narrow in zip(group, narrows, strict=True):
        op.result.replace_all_uses_with(narrow.result)
        Rewriter.erase_op(op)


@dataclass(frozen=True)
class FuseGemmsPass(ModulePass):
    """Linears sharing an input -> one linear + slices (see the module docstring)."""

    name = "fuse-gemms"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        fused = 0
        for fn in op.walk():
            if isinstance(fn, func.FuncOp) and fn.body.blocks:
                weights = weight_arguments(fn)
                for group in fusible_groups(fn.body.block, weights):
                    fuse_group(group)
                    fused += len(group)
        log.info("fuse-gemms: %d linears fused", fused)
