"""The block-scaled FP8 linear (`ad.linear_fp8_block`): a kernel template, emitted as Python source.

`emit_linear_fp8_block_module` writes a kernel module with the interface of the region kernels
(a `@triton.jit` function named as asked, `OUTPUT_DTYPES`, `output_shapes`, `launch`). The
launch takes, in the op's operand order, `x [..., K]` (f32, f16 or bf16), `weight [N, K]`
(float8_e4m3fn), `weight_scale_inv [ceil(N / bn), ceil(K / bk)]` (f32) and, with a bias,
`bias [N]`, and returns `out [..., N]` in x's dtype.

One program computes a [BLOCK_M, BLOCK_N] tile of `out`, grid (cdiv(M, BLOCK_M), cdiv(N,
BLOCK_N)), M the tokens. Its K loop steps one weight block (bk) at a time, and each step is the
format's arithmetic on the tensor cores: the x tile [BLOCK_M, bk] is loaded and quantized in
registers (the activation's group is the K block: `s = max|x| / 448` per row, `x / max(s,
1e-12)` to e4m3), multiplied with the weight tile [BLOCK_N, bk] by an fp8 x fp8 `tl.dot`
(fp32 accumulator), and the product, times `s[:, None] * weight_scale_inv[n / bn, kb][None, :]`,
added to the fp32 accumulator. A decode step's tile (16 rows) is computed transposed, `w_tile @
q_tile.T`, so that the weight tile is the fp8 MMA's 64-row operand (`TileBlocks.swap_ab`: PTX
`wgmma.mma_async ... m64n16k32.f32.e4m3.e4m3` instead of `mma.sync` on fp16 copies). The
activation's quantization is fused: each of the cdiv(N,
BLOCK_N) programs of a row block quantizes the same x tiles again, which costs a load of x
(K elements a token, against the N x K fp8 weight bytes the decode step reads once). The
result is rounded to x's dtype at the store, with the bias added in fp32 after that rounding
and rounded again (HF's `output.add_(bias)`). Edge blocks (N or K not a multiple of the block)
are masked with zeros, which leave the amax and the dot unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from string import Template

import torch

from ad_mlir.codegen.emitters import KernelEmitter, spec_check
from ad_mlir.codegen.templates.skeleton import TL_DTYPE, module_source
from ad_mlir.dialects import ad
from ad_mlir.dialects.kernel_forms import next_power_of_2
from ad_mlir.semantics.op_table import torch_dtype
from ad_mlir.zoo import fp8_blocks

MAX_BLOCK_K = 128
"""The widest K block a program's tiles hold (a wider group would be quantized across programs)."""


@dataclass(frozen=True)
class LinearFp8BlockSpec:
    """What one kernel is specialized for (everything but the token count)."""

    n: int
    k: int
    block_n: int
    block_k: int
    dtype: torch.dtype
    """Of x and of the output."""
    bias: bool

    def __post_init__(self) -> None:
        if self.dtype not in TL_DTYPE:
            raise ValueError(f"linear_fp8_block kernel: dtype {self.dtype} is not one of "
                             f"{', '.join(map(str, TL_DTYPE))}")
        if not 16 <= self.block_k <= MAX_BLOCK_K:
            raise ValueError(f"linear_fp8_block kernel: K block {self.block_k} is not in 16..{MAX_BLOCK_K}")


@dataclass(frozen=True)
class TileBlocks:
    block_m: int
    block_n: int
    swap_ab: bool
    """The tile computed transposed, `w_tile @ q_tile.T` ([BLOCK_N, BLOCK_M]): Hopper's fp8 MMA
    (wgmma) takes 64 rows and more on its first operand, which a decode step's 16-row x tile
    is not (Triton then falls back to `mma.sync` on fp16 copies of the fp8 tiles); the weight
    tile is. The same products and scales, in the same order."""
    num_warps: int
    num_stages: int


def tile_blocks(spec: LinearFp8BlockSpec, tokens: int) -> TileBlocks:
    """The tile for `tokens` rows: BLOCK_M 16 (the smallest tl.dot) for decode, swapped (see
    `TileBlocks.swap_ab`), up to 64 for a prefill; BLOCK_N 128 (or N, a power of two >= 16, when
    smaller); 8 warps on a 64-row tile, which holds an fp32 x tile, its fp8 copy and the
    accumulator (no spills at Qwen3-8B's sizes, tests/unit/test_linear_fp8_block_kernel.py)."""
    block_m = max(16, min(64, next_power_of_2(tokens)))
    block_n = max(16, min(128, next_power_of_2(spec.n)))
    return TileBlocks(block_m, block_n, block_m == 16, 8 if block_m >= 64 else 4, 3)


_KERNEL = '''\
@triton.jit
def $name(x, w, ws, bias, out, n_rows, x_s0, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP_AB: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    r_in = rows < n_rows
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_in = n < N
    k = tl.arange(0, BK)
    x_rows = x + rows.to(tl.int64)[:, None] * x_s0
    w_rows = w + n.to(tl.int64)[:, None] * K
    w_scales = ws + (n // BN) * GROUPS
    if SWAP_AB:
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for kb in range(GROUPS):
        kk = kb * BK + k
        k_in = kk < K
        a = tl.load(x_rows + kk[None, :], mask=r_in[:, None] & k_in[None, :], other=0.0).to(tl.float32)
        a_s = tl.max(tl.abs(a), 1) / FP8_MAX
        q = (a / tl.maximum(a_s, MIN_SCALE)[:, None]).to(tl.float8e4nv)
        b = tl.load(w_rows + kk[None, :], mask=n_in[:, None] & k_in[None, :], other=0.0)
        b_s = tl.load(w_scales + kb, mask=n_in, other=0.0)
        if SWAP_AB:
            acc += tl.dot(b, tl.trans(q)) * a_s[None, :] * b_s[:, None]
        else:
            acc += tl.dot(q, tl.trans(b)) * a_s[:, None] * b_s[None, :]
    if SWAP_AB:
        y = tl.trans(acc).to(ELEM)
    else:
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
    if x.shape[-1] != $k or tuple(w.shape) != ($n, $k) or tuple(ws.shape) != ($scale_rows, $groups) or \\
            x.dtype != $dtype or w.dtype != torch.float8_e4m3fn or ws.dtype != torch.float32:
        raise ValueError(f"linear_fp8_block kernel for [$n, $k] fp8 weights in blocks [$bn, $bk] on $dtype: x "
                         f"{tuple(x.shape)} {x.dtype}, weight {tuple(w.shape)} {w.dtype}, scales "
                         f"{tuple(ws.shape)} {ws.dtype}")
    rows = x.reshape(-1, $k)
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    w, ws = w.contiguous(), ws.contiguous()
    out = torch.empty((*x.shape[:-1], $n), dtype=$dtype, device=x.device)
    n_rows = rows.shape[0]
    if n_rows == 0:
        return [out]
    tile = tile_blocks(SPEC, n_rows)
    kernel[(cdiv(n_rows, tile.block_m), cdiv($n, tile.block_n))](
        rows, w, ws, bias, out, n_rows, rows.stride(0), BLOCK_M=tile.block_m, BLOCK_N=tile.block_n,
        SWAP_AB=tile.swap_ab, num_warps=tile.num_warps, num_stages=tile.num_stages, enable_fp_fusion=True)
    return [out]
'''


def emit_linear_fp8_block_module(spec: LinearFp8BlockSpec, name: str, header: str) -> str:
    """The whole kernel file: imports, the spec's constants, the `@triton.jit` kernel and its
    launcher. `header` goes first (the cache's key and provenance comment)."""
    groups = -(-spec.k // spec.block_k)
    fields = {
        "name": name, "dtype": str(spec.dtype), "n": spec.n, "k": spec.k, "bn": spec.block_n, "bk": spec.block_k,
        "groups": groups, "scale_rows": -(-spec.n // spec.block_n),
        # Without a bias the kernel takes none: x stands in for it (never read).
        "unpack": "x, w, ws, bias = tensors" if spec.bias else "x, w, ws = tensors\n    bias = x",
    }
    constants = {"ELEM": TL_DTYPE[spec.dtype], "N": spec.n, "K": spec.k, "BN": spec.block_n, "BK": spec.block_k,
                 "GROUPS": groups, "HAS_BIAS": spec.bias, "FP8_MAX": fp8_blocks.FP8_MAX,
                 "MIN_SCALE": fp8_blocks.MIN_GROUP_SCALE}
    lines = [*(f"{k} = tl.constexpr({v})" for k, v in constants.items()), f"SPEC = {spec!r}"]
    return module_source(header, {"ad_mlir.codegen.templates.linear_fp8_block_kernel": ["LinearFp8BlockSpec",
                                                                                         "tile_blocks"]},
                         lines, [Template(_KERNEL).substitute(fields), Template(_LAUNCHER).substitute(fields)])


def linear_fp8_block_spec(op: ad.LinearFp8BlockOp) -> LinearFp8BlockSpec:
    n, k = op.weight.type.get_shape()
    bn, bk = op.blocks()
    return LinearFp8BlockSpec(n, k, bn, bk, torch_dtype(op.input.type), op.bias is not None)


EMITTER = KernelEmitter(lambda op, name, header: emit_linear_fp8_block_module(linear_fp8_block_spec(op), name,
                                                                              header),
                        check=spec_check(linear_fp8_block_spec))
