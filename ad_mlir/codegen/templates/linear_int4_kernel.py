"""The int4 weight-only linear (`ad.linear_int4`, GPTQ's and AWQ's): a kernel template, emitted as
Python source.

`emit_linear_int4_module` writes a kernel module with the interface of the region kernels (a
`@triton.jit` function named as asked, `OUTPUT_DTYPES`, `output_shapes`, `launch`). The launch
takes, in the op's operand order, `x [..., K]` (f32, f16 or bf16), `qweight [K / 8, N]` (int32,
eight rows of codes a word), `qzeros [G, N / 8]` (int32), `scales [G, N]`, then `g_idx [K]`
(int32) with act-order and `bias [N]` with a bias; it returns `out [..., N]` in x's dtype.

One program computes a [BLOCK_M, BLOCK_N] tile of `out`, grid (cdiv(M, BLOCK_M), cdiv(N,
BLOCK_N)), M the tokens. Its K loop steps BLOCK_K rows at a time and dequantizes the weight tile
in registers: each row k of the tile loads its word of `qweight` (row k // 8: the eight rows of a
word read the same word, from cache) and shifts its nibble out ((k % 8) * 4); its group (k //
group_size, or `g_idx[k]` with act-order) selects the zero point's word and nibble and the scale.
Where no tile straddles two groups (no act-order, group_size a multiple of BLOCK_K or one group
over K) the tile's zero points and scales are one row, loaded once a step; with act-order each
row loads its own (a gather from the small [G, N] tables). The weight `(code - zero) * scale` is
computed in fp32 (exact), rounded to x's dtype, and multiplied with the x tile by `tl.dot` in
x's dtype (fp32: IEEE, not TF32) into an fp32 accumulator: Hopper has no int4 MMA, so the
tensor cores see bf16/fp16. The result is rounded to x's dtype at the store, the bias added in
fp32 after that rounding and rounded again. Rows past K and columns past N are masked (zero
codes and scales: they add nothing).

Tiles: a decode step (up to 16 tokens) is weight-bound: 16 rows (the smallest tl.dot), 64
columns, 128 K rows a step; a prefill 64 x 128 tiles, 64 K rows a step, 8 warps.
"""

from __future__ import annotations

from dataclasses import dataclass
from string import Template

import torch

from ad_mlir.codegen.emitters import KernelEmitter, spec_check
from ad_mlir.codegen.templates.skeleton import TL_DTYPE, dot_dtype_line, module_source
from ad_mlir.dialects import ad
from ad_mlir.dialects.kernel_forms import next_power_of_2
from ad_mlir.semantics.op_table import torch_dtype

SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class LinearInt4Spec:
    """What one kernel is specialized for (everything but the token count)."""

    n: int
    k: int
    group_size: int
    zero_offset: int
    act_order: bool
    dtype: torch.dtype
    """Of x and of the output."""
    scale_dtype: torch.dtype
    bias: bool

    def __post_init__(self) -> None:
        if self.dtype not in TL_DTYPE or self.scale_dtype not in SCALE_DTYPES:
            raise ValueError(f"linear_int4 kernel: dtype {self.dtype} or scales {self.scale_dtype} is not one of "
                             f"{', '.join(map(str, TL_DTYPE))}")
        if self.k % 8 or self.n % 8 or self.group_size <= 0:
            raise ValueError(f"linear_int4 kernel: [{self.n}, {self.k}] in groups of {self.group_size}")

    @property
    def groups(self) -> int:
        return -(-self.k // self.group_size)


@dataclass(frozen=True)
class TileBlocks:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def tile_blocks(spec: LinearInt4Spec, tokens: int) -> TileBlocks:
    """The tile for `tokens` rows (see the module docstring); BLOCK_N no wider than N's power of
    two, BLOCK_K no deeper than K's (at least 16: tl.dot's depth)."""
    block_n_cap = max(16, next_power_of_2(spec.n))
    block_k_cap = max(16, next_power_of_2(spec.k))
    if tokens <= 16:
        return TileBlocks(16, min(64, block_n_cap), min(128, block_k_cap), 4, 3)
    return TileBlocks(64, min(128, block_n_cap), min(64, block_k_cap), 8, 3)


def one_group_per_tile(spec: LinearInt4Spec, block_k: int) -> bool:
    """No tile of `block_k` rows straddles two groups (then its zero points and scales are one row)."""
    return not spec.act_order and (spec.group_size % block_k == 0 or spec.group_size >= spec.k)


_KERNEL = '''\
@triton.jit
def $name(x, qw, qz, sc, g_idx, bias, out, n_rows, x_s0, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
          BLOCK_K: tl.constexpr, ROW_GROUPS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    r_in = rows < n_rows
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_in = n < N
    x_rows = x + rows.to(tl.int64)[:, None] * x_s0
    z_shift = ((n % 8) * 4)[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_in = k < K
        a = tl.load(x_rows + k[None, :], mask=r_in[:, None] & k_in[None, :], other=0.0).to(DOT_DTYPE)
        kn_in = k_in[:, None] & n_in[None, :]
        words = tl.load(qw + (k // 8).to(tl.int64)[:, None] * N + n[None, :], mask=kn_in, other=0)
        codes = (words >> ((k % 8) * 4)[:, None]) & 15
        if ROW_GROUPS:
            g = k0 // GROUP
            z = (tl.load(qz + g * N8 + n // 8, mask=n_in, other=0)[None, :] >> z_shift) & 15
            s = tl.load(sc + g * N + n, mask=n_in, other=0.0).to(tl.float32)[None, :]
        else:
            if ACT_ORDER:
                g = tl.load(g_idx + k, mask=k_in, other=0)
            else:
                g = k // GROUP
            z = (tl.load(qz + g[:, None] * N8 + (n // 8)[None, :], mask=kn_in, other=0) >> z_shift) & 15
            s = tl.load(sc + g[:, None] * N + n[None, :], mask=kn_in, other=0.0).to(tl.float32)
        w = ((codes - z - ZERO_OFFSET).to(tl.float32) * s).to(ELEM).to(DOT_DTYPE)
        acc = tl.dot(a, w, acc$precision)
    y = acc.to(ELEM)
    if HAS_BIAS:
        y = (y.to(tl.float32) + tl.load(bias + n, mask=n_in, other=0.0).to(tl.float32)[None, :]).to(ELEM)
    tl.store(out + rows.to(tl.int64)[:, None] * N + n[None, :], y, mask=r_in[:, None] & n_in[None, :])
'''

_LAUNCHER = '''\
OUTPUT_DTYPES = ($dtype, )


def output_shapes(tensors):
    return [(*tensors[0].shape[:-1], $n)]


def launch(kernel, tensors, scalars):
    $unpack
    if x.shape[-1] != $k or tuple(qw.shape) != ($k8, $n) or tuple(qz.shape) != ($groups, $n8) or \\
            tuple(sc.shape) != ($groups, $n) or x.dtype != $dtype or qw.dtype != torch.int32 or \\
            qz.dtype != torch.int32 or sc.dtype != $scale_dtype:
        raise ValueError(f"linear_int4 kernel for [$n, $k] in groups of $group on $dtype: x {tuple(x.shape)} "
                         f"{x.dtype}, qweight {tuple(qw.shape)} {qw.dtype}, qzeros {tuple(qz.shape)}, scales "
                         f"{tuple(sc.shape)} {sc.dtype}")
    rows = x.reshape(-1, $k)
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    qw, qz, sc, g_idx = qw.contiguous(), qz.contiguous(), sc.contiguous(), g_idx.contiguous()
    out = torch.empty((*x.shape[:-1], $n), dtype=$dtype, device=x.device)
    n_rows = rows.shape[0]
    if n_rows == 0:
        return [out]
    tile = tile_blocks(SPEC, n_rows)
    kernel[(cdiv(n_rows, tile.block_m), cdiv($n, tile.block_n))](
        rows, qw, qz, sc, g_idx, bias, out, n_rows, rows.stride(0), BLOCK_M=tile.block_m, BLOCK_N=tile.block_n,
        BLOCK_K=tile.block_k, ROW_GROUPS=one_group_per_tile(SPEC, tile.block_k), num_warps=tile.num_warps,
        num_stages=tile.num_stages)
    return [out]
'''


def emit_linear_int4_module(spec: LinearInt4Spec, name: str, header: str) -> str:
    """The whole kernel file: imports, the spec's constants, the `@triton.jit` kernel and its
    launcher. `header` goes first (the cache's key and provenance comment)."""
    # Without g_idx or a bias the kernel takes none: x stands in for them (never read).
    operands = ["x", "qw", "qz", "sc", *(["g_idx"] if spec.act_order else []), *(["bias"] if spec.bias else [])]
    absent = [f"\n    {name} = x" for name in ("g_idx", "bias") if name not in operands]
    fields = {
        "name": name, "dtype": str(spec.dtype), "scale_dtype": str(spec.scale_dtype), "n": spec.n, "k": spec.k,
        "k8": spec.k // 8, "n8": spec.n // 8, "groups": spec.groups, "group": spec.group_size,
        "unpack": f"{', '.join(operands)} = tensors" + "".join(absent),
        "precision": ', input_precision="ieee"' if spec.dtype == torch.float32 else "",
    }
    constants = {"ELEM": TL_DTYPE[spec.dtype], "N": spec.n, "K": spec.k, "N8": spec.n // 8,
                 "GROUP": spec.group_size, "ZERO_OFFSET": spec.zero_offset, "ACT_ORDER": spec.act_order,
                 "HAS_BIAS": spec.bias}
    lines = [*(f"{k} = tl.constexpr({v})" for k, v in constants.items()), dot_dtype_line(spec.dtype),
             f"SPEC = {spec!r}"]
    return module_source(header, {"ad_mlir.codegen.templates.linear_int4_kernel": ["LinearInt4Spec", "tile_blocks",
                                                                                    "one_group_per_tile"]},
                         lines, [Template(_KERNEL).substitute(fields), Template(_LAUNCHER).substitute(fields)])


def linear_int4_spec(op: ad.LinearInt4Op) -> LinearInt4Spec:
    n, k = op.features()
    return LinearInt4Spec(n, k, op.group_size.value.data, op.zero_offset.value.data, op.g_idx is not None,
                          torch_dtype(op.input.type), torch_dtype(op.scales.type), op.bias is not None)


EMITTER = KernelEmitter(lambda op, name, header: emit_linear_int4_module(linear_int4_spec(op), name, header),
                        check=spec_check(linear_int4_spec))
