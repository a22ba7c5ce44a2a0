"""The FP8 linear with per-token / per-channel scales (`ad.linear_fp8`): a kernel template,
emitted as Python source.

`emit_linear_fp8_module` writes a kernel module with the interface of the region kernels (a
`@triton.jit` function named as asked, `OUTPUT_DTYPES`, `output_shapes`, `launch`). The launch
takes, in the op's operand order, `x [..., K]` (float8_e4m3fn, quantized before: by
`ad.quantize_fp8_dynamic`, often fused into the norm or SiLU-mul before), `weight [N, K]`
(float8_e4m3fn), `input_scale` (f32, per token `[..., 1]` or one value), `weight_scale` (f32,
per channel `[N, 1]` or one value) and, with a bias, `bias [N]`; it returns `out [..., N]` in
the op's result dtype.

Why not the block-scaled kernel with one K group and bn = 1: its scales are applied in the K
loop, one group of at most 128 elements at a time, and its weight blocks are 16 rows and more.
Here the scales are constant along K, so the K loop is pure fp8 x fp8 `tl.dot`s into one fp32
accumulator, and both scales (and the bias) are applied once, after the loop:
`out = acc * input_scale[m] * weight_scale[n] + bias[n]`, rounded once to the result dtype. The
reference (`torch_ops.linear_fp8`) multiplies the dequantized operands instead; the products of
e4m3 values are exact in fp32, so the two differ only by fp32 rounding of the scale products
and the order of the sums.

One program computes a [BLOCK_M, BLOCK_N] tile of `out`, grid (cdiv(M, BLOCK_M), cdiv(N,
BLOCK_N)). A decode step's tile (16 rows) is computed transposed, `w_tile @ x_tile.T`, so that
the weight tile is the fp8 MMA's 64-row operand (as in `linear_fp8_block_kernel.py`: PTX
`wgmma ... e4m3.e4m3` instead of `mma.sync` on fp16 copies). Edge tiles are masked with zeros.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from string import Template

import torch

from ad_mlir.codegen.emitters import KernelEmitter, spec_check
from ad_mlir.codegen.templates.skeleton import TL_DTYPE, module_source
from ad_mlir.dialects import ad
from ad_mlir.dialects.kernel_forms import next_power_of_2
from ad_mlir.semantics.op_table import torch_dtype


@dataclass(frozen=True)
class LinearFp8Spec:
    """What one kernel is specialized for (everything but the token count)."""

    n: int
    k: int
    dtype: torch.dtype
    """Of the output."""
    per_token: bool
    """The input scale is one per row ([..., 1]), else one value."""
    per_channel: bool
    """The weight scale is one per output channel ([N, 1]), else one value."""
    bias: bool

    def __post_init__(self) -> None:
        if self.dtype not in TL_DTYPE:
            raise ValueError(f"linear_fp8 kernel: dtype {self.dtype} is not one of {', '.join(map(str, TL_DTYPE))}")


@dataclass(frozen=True)
class TileBlocks:
    block_m: int
    block_n: int
    block_k: int
    swap_ab: bool
    """The tile computed transposed (see the module docstring)."""
    num_warps: int
    num_stages: int


def tile_blocks(spec: LinearFp8Spec, tokens: int) -> TileBlocks:
    """The tile for `tokens` rows: BLOCK_M 16 (the smallest tl.dot) for decode, swapped, up to 64
    for a prefill (8 warps); BLOCK_N 128 (or N, a power of two >= 16, when smaller); BLOCK_K 128
    fp8 values (128 B a row; 32, an fp8 MMA's depth, at least)."""
    block_m = max(16, min(64, next_power_of_2(tokens)))
    block_n = max(16, min(128, next_power_of_2(spec.n)))
    block_k = max(32, min(128, next_power_of_2(spec.k)))
    return TileBlocks(block_m, block_n, block_k, block_m == 16, 8 if block_m >= 64 else 4, 3)


_KERNEL = '''\
@triton.jit
def $name(x, w, xs, ws, bias, out, n_rows, x_s0, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
          BLOCK_K: tl.constexpr, SWAP_AB: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    r_in = rows < n_rows
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_in = n < N
    k = tl.arange(0, BLOCK_K)
    x_rows = x + rows.to(tl.int64)[:, None] * x_s0
    w_rows = w + n.to(tl.int64)[:, None] * K
    if SWAP_AB:
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + k
        k_in = kk < K
        a = tl.load(x_rows + kk[None, :], mask=r_in[:, None] & k_in[None, :], other=0.0)
        b = tl.load(w_rows + kk[None, :], mask=n_in[:, None] & k_in[None, :], other=0.0)
        if SWAP_AB:
            acc += tl.dot(b, tl.trans(a))
        else:
            acc += tl.dot(a, tl.trans(b))
    if SWAP_AB:
        y = tl.trans(acc)
    else:
        y = acc
    if PER_TOKEN:
        y = y * tl.load(xs + rows, mask=r_in, other=0.0)[:, None]
    else:
        y = y * tl.load(xs)
    if PER_CHANNEL:
        y = y * tl.load(ws + n, mask=n_in, other=0.0)[None, :]
    else:
        y = y * tl.load(ws)
    if HAS_BIAS:
        y = y + tl.load(bias + n, mask=n_in, other=0.0).to(tl.float32)[None, :]
    tl.store(out + rows.to(tl.int64)[:, None] * N + n[None, :], y.to(ELEM), mask=r_in[:, None] & n_in[None, :])
'''

_LAUNCHER = '''\
OUTPUT_DTYPES = ($dtype, )


def output_shapes(tensors):
    return [(*tensors[0].shape[:-1], $n)]


def launch(kernel, tensors, scalars):
    $unpack
    rows = x.reshape(-1, $k)
    n_rows = rows.shape[0]
    if x.shape[-1] != $k or tuple(w.shape) != ($n, $k) or x.dtype != torch.float8_e4m3fn or \\
            w.dtype != torch.float8_e4m3fn or xs.numel() != ($x_scales) or ws.numel() != $w_scales or \\
            xs.dtype != torch.float32 or ws.dtype != torch.float32:
        raise ValueError(f"linear_fp8 kernel for [$n, $k] fp8 weights: x {tuple(x.shape)} {x.dtype}, weight "
                         f"{tuple(w.shape)} {w.dtype}, scales {tuple(xs.shape)} {xs.dtype}, {tuple(ws.shape)} {ws.dtype}")
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    w, xs, ws = w.contiguous(), xs.reshape(-1).contiguous(), ws.reshape(-1).contiguous()
    out = torch.empty((*x.shape[:-1], $n), dtype=$dtype, device=x.device)
    if n_rows == 0:
        return [out]
    tile = tile_blocks(SPEC, n_rows)
    kernel[(cdiv(n_rows, tile.block_m), cdiv($n, tile.block_n))](
        rows, w, xs, ws, bias, out, n_rows, rows.stride(0), BLOCK_M=tile.block_m, BLOCK_N=tile.block_n,
        BLOCK_K=tile.block_k, SWAP_AB=tile.swap_ab, num_warps=tile.num_warps, num_stages=tile.num_stages,
        enable_fp_fusion=True)
    return [out]
'''


def emit_linear_fp8_module(spec: LinearFp8Spec, name: str, header: str) -> str:
    """The whole kernel file: imports, the spec's constants, the `@triton.jit` kernel and its
    launcher. `header` goes first (the cache's key and provenance comment)."""
    fields = {
        "name": name, "dtype": str(spec.dtype), "n": spec.n, "k": spec.k,
        "x_scales": "n_rows" if spec.per_token else "1", "w_scales": spec.n if spec.per_channel else 1,
        # Without a bias the kernel takes none: x stands in for it (never read).
        "unpack": "x, w, xs, ws, bias = tensors" if spec.bias else "x, w, xs, ws = tensors\n    bias = x",
    }
    constants = {"ELEM": TL_DTYPE[spec.dtype], "N": spec.n, "K": spec.k, "PER_TOKEN": spec.per_token,
                 "PER_CHANNEL": spec.per_channel, "HAS_BIAS": spec.bias}
    lines = [*(f"{k} = tl.constexpr({v})" for k, v in constants.items()), f"SPEC = {spec!r}"]
    return module_source(header, {"ad_mlir.codegen.templates.linear_fp8_kernel": ["LinearFp8Spec", "tile_blocks"]},
                         lines, [Template(_KERNEL).substitute(fields), Template(_LAUNCHER).substitute(fields)])


def linear_fp8_spec(op: ad.LinearFp8Op) -> LinearFp8Spec:
    """The op's spec; a ValueError for what the kernel does not take: a weight that is not a
    static 2-D tensor, scales that are neither one value nor one per token / per channel, a bias
    that is not [N]."""
    shape = op.weight.type.get_shape()
    if len(shape) != 2 or min(shape) < 1:
        raise ValueError(f"linear_fp8 kernel: weight {list(shape)} is not a static 2-D tensor")
    n, k = shape
    x_scale, w_scale = op.input_scale.type.get_shape(), op.weight_scale.type.get_shape()
    x_shape = op.input.type.get_shape()
    per_token = len(x_scale) == len(x_shape) and x_scale[-1] == 1 and math.prod(x_scale) != 1
    if not per_token and math.prod(x_scale) != 1:
        raise ValueError(f"linear_fp8 kernel: input scale {list(x_scale)} is neither per token nor per tensor")
    per_channel = tuple(w_scale) in ((n, 1), (n,)) and n != 1
    if not per_channel and math.prod(w_scale) != 1:
        raise ValueError(f"linear_fp8 kernel: weight scale {list(w_scale)} is neither per channel nor per tensor")
    if op.bias is not None and tuple(op.bias.type.get_shape()) != (n,):
        raise ValueError(f"linear_fp8 kernel: bias {list(op.bias.type.get_shape())} is not [{n}]")
    return LinearFp8Spec(n, k, torch_dtype(op.result.type), per_token, per_channel, op.bias is not None)


EMITTER = KernelEmitter(lambda op, name, header: emit_linear_fp8_module(linear_fp8_spec(op), name, header),
                        check=spec_check(linear_fp8_spec))
