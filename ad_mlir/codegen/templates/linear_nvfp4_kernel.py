"""The NVFP4 linear (`ad.linear_nvfp4`): a kernel template, emitted as Python source.

`emit_linear_nvfp4_module` writes a kernel module with the interface of the region kernels (a
`@triton.jit` function named as asked, `OUTPUT_DTYPES`, `output_shapes`, `launch`). The launch
takes, in the op's operand order, `x [..., K]` (f32, f16 or bf16), `weight [N, K / 2]` (uint8,
two e2m1 codes a byte, the even element in the low nibble), `weight_scale [N, K / 16]`
(float8_e4m3fn), `weight_scale_2` (f32, one value or one per output row [N]) and, with a bias,
`bias [N]`, and returns `out [..., N]` in x's dtype.

Weight-only, as on Hopper (no FP4 MMA): one program computes a [BLOCK_M, BLOCK_N] tile of `out`,
grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)). Its K loop loads a [BLOCK_N, BLOCK_K / 2] tile of
packed bytes and the [BLOCK_N, BLOCK_K / 16] e4m3 block scales that go with it, decodes the
codes in registers (low and high nibbles joined into [BLOCK_N, BLOCK_K]; a code's value from its
bits: sign, exponent e, mantissa m: m / 2 when e = 0, else (2 + m) * 2^(e-1) / 2), multiplies
each by its block scale, casts the tile to x's dtype (exact in bf16 and fp16: 2-bit by 4-bit
significands; `DOT_DTYPE`, fp32 for bf16 tiles in the interpreter, which multiplies bf16 as raw
bits) and `tl.dot`s it with the x tile into an fp32 accumulator. The global scale is
constant along K, so it is applied once, after the loop, to the accumulator (per column when it
is one per row), then the bias; one rounding to x's dtype at the store. The reference
(`zoo/nvfp4.py`'s `linear`) computes the same products in fp32; the two differ only by the order
of the fp32 sums.

A decode step's tile (16 rows) is computed transposed, `w_tile @ x_tile.T`, so that the decoded
weight tile, which is in registers, is the MMA's 64-row first operand (Hopper's wgmma takes
that operand from registers, the second from shared memory). Edge tiles are masked with zeros
(a zero byte decodes to 0, a zero scale scales to 0).
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


@dataclass(frozen=True)
class LinearNvfp4Spec:
    """What one kernel is specialized for (everything but the token count)."""

    n: int
    k: int
    """In-features (twice the packed weight's columns), a multiple of 16."""
    dtype: torch.dtype
    """Of x and of the output."""
    per_row: bool
    """The global scale is one per output row ([N]: merged GEMMs), else one value."""
    bias: bool

    def __post_init__(self) -> None:
        if self.dtype not in TL_DTYPE:
            raise ValueError(f"linear_nvfp4 kernel: dtype {self.dtype} is not one of "
                             f"{', '.join(map(str, TL_DTYPE))}")
        if self.k % ad.NVFP4_GROUP:
            raise ValueError(f"linear_nvfp4 kernel: K {self.k} is not a multiple of {ad.NVFP4_GROUP}")


@dataclass(frozen=True)
class TileBlocks:
    block_m: int
    block_n: int
    block_k: int
    swap_ab: bool
    """The tile computed transposed (see the module docstring)."""
    num_warps: int
    num_stages: int


def tile_blocks(spec: LinearNvfp4Spec, tokens: int) -> TileBlocks:
    """The tile for `tokens` rows: BLOCK_M 16 (the smallest tl.dot) for decode, swapped, up to 64
    for a prefill (8 warps); BLOCK_N 64 for decode, 128 for a prefill (or N, a power of two >= 16,
    when smaller); BLOCK_K 64 (32 bytes of codes a row, 4 block scales; 16 at least). The decoded
    weight tile is held in fp32 before its cast: [BLOCK_N, BLOCK_K] of it is what bounds the tile
    (no spills at Llama-3-8B's sizes, tests/unit/test_linear_nvfp4_kernel.py)."""
    block_m = max(16, min(64, next_power_of_2(tokens)))
    block_n = max(16, min(64 if block_m == 16 else 128, next_power_of_2(spec.n)))
    block_k = max(16, min(64, next_power_of_2(spec.k)))
    return TileBlocks(block_m, block_n, block_k, block_m == 16, 8 if block_m >= 64 else 4, 3)


_KERNEL = '''\
@triton.jit
def $name(x, w, ws, gs, bias, out, n_rows, x_s0, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
          BLOCK_K: tl.constexpr, SWAP_AB: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    r_in = rows < n_rows
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_in = n < N
    k = tl.arange(0, BLOCK_K)
    kp = tl.arange(0, BLOCK_K // 2)
    kg = tl.arange(0, BLOCK_K // GROUP)
    x_rows = x + rows.to(tl.int64)[:, None] * x_s0
    w_rows = w + n.to(tl.int64)[:, None] * (K // 2)
    s_rows = ws + n.to(tl.int64)[:, None] * (K // GROUP)
    if SWAP_AB:
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + k
        a = tl.load(x_rows + kk[None, :], mask=r_in[:, None] & (kk < K)[None, :], other=0.0).to(DOT_DTYPE)
        kb = k0 // 2 + kp
        packed = tl.load(w_rows + kb[None, :], mask=n_in[:, None] & (kb < K // 2)[None, :], other=0)
        codes = tl.reshape(tl.join(packed & 0xF, packed >> 4), [BLOCK_N, BLOCK_K])
        e = (codes >> 1) & 3
        m = codes & 1
        halves = tl.where(e == 0, m, (2 + m) << (tl.maximum(e, 1) - 1)).to(tl.float32) * 0.5
        value = tl.where((codes & 8) != 0, -halves, halves)
        g = k0 // GROUP + kg
        scale = tl.load(s_rows + g[None, :], mask=n_in[:, None] & (g < K // GROUP)[None, :], other=0.0)
        scaled = tl.reshape(value, [BLOCK_N, BLOCK_K // GROUP, GROUP]) * scale.to(tl.float32)[:, :, None]
        b = tl.reshape(scaled, [BLOCK_N, BLOCK_K]).to(DOT_DTYPE)
        if SWAP_AB:
            acc += tl.dot(b, tl.trans(a)$precision)
        else:
            acc += tl.dot(a, tl.trans(b)$precision)
    if SWAP_AB:
        y = tl.trans(acc)
    else:
        y = acc
    if PER_ROW:
        y = y * tl.load(gs + n, mask=n_in, other=0.0)[None, :]
    else:
        y = y * tl.load(gs)
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
    if x.shape[-1] != $k or tuple(w.shape) != ($n, $k // 2) or tuple(ws.shape) != ($n, $groups) or \\
            x.dtype != $dtype or w.dtype != torch.uint8 or ws.dtype != torch.float8_e4m3fn or \\
            gs.dtype != torch.float32 or gs.numel() != $global_scales:
        raise ValueError(f"linear_nvfp4 kernel for [$n, $k] NVFP4 weights on $dtype: x {tuple(x.shape)} {x.dtype}, "
                         f"weight {tuple(w.shape)} {w.dtype}, scales {tuple(ws.shape)} {ws.dtype}, "
                         f"{tuple(gs.shape)} {gs.dtype}")
    rows = x.reshape(-1, $k)
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    w, ws, gs = w.contiguous(), ws.contiguous(), gs.reshape(-1).contiguous()
    out = torch.empty((*x.shape[:-1], $n), dtype=$dtype, device=x.device)
    n_rows = rows.shape[0]
    if n_rows == 0:
        return [out]
    tile = tile_blocks(SPEC, n_rows)
    kernel[(cdiv(n_rows, tile.block_m), cdiv($n, tile.block_n))](
        rows, w, ws, gs, bias, out, n_rows, rows.stride(0), BLOCK_M=tile.block_m, BLOCK_N=tile.block_n,
        BLOCK_K=tile.block_k, SWAP_AB=tile.swap_ab, num_warps=tile.num_warps, num_stages=tile.num_stages,
        enable_fp_fusion=True)
    return [out]
'''


def emit_linear_nvfp4_module(spec: LinearNvfp4Spec, name: str, header: str) -> str:
    """The whole kernel file: imports, the spec's constants, the `@triton.jit` kernel and its
    launcher. `header` goes first (the cache's key and provenance comment)."""
    fields = {
        "name": name, "dtype": str(spec.dtype), "n": spec.n, "k": spec.k, "groups": spec.k // ad.NVFP4_GROUP,
        "global_scales": spec.n if spec.per_row else 1,
        # fp32 activations multiply in fp32 (not TF32): the reference's products exactly.
        "precision": ', input_precision="ieee"' if spec.dtype == torch.float32 else "",
        # Without a bias the kernel takes none: x stands in for it (never read).
        "unpack": "x, w, ws, gs, bias = tensors" if spec.bias else "x, w, ws, gs = tensors\n    bias = x",
    }
    constants = {"ELEM": TL_DTYPE[spec.dtype], "N": spec.n, "K": spec.k,
                 "GROUP": ad.NVFP4_GROUP, "PER_ROW": spec.per_row, "HAS_BIAS": spec.bias}
    lines = [*(f"{k} = tl.constexpr({v})" for k, v in constants.items()), dot_dtype_line(spec.dtype),
             f"SPEC = {spec!r}"]
    return module_source(header, {"ad_mlir.codegen.templates.linear_nvfp4_kernel": ["LinearNvfp4Spec", "tile_blocks"]},
                         lines, [Template(_KERNEL).substitute(fields), Template(_LAUNCHER).substitute(fields)])


def linear_nvfp4_spec(op: ad.LinearNvfp4Op) -> LinearNvfp4Spec:
    n = op.weight.type.get_shape()[0]
    per_row = tuple(op.weight_scale_2.type.get_shape()) == (n,) and n != 1
    return LinearNvfp4Spec(n, op.in_features(), torch_dtype(op.input.type), per_row, op.bias is not None)


EMITTER = KernelEmitter(lambda op, name, header: emit_linear_nvfp4_module(linear_nvfp4_spec(op), name, header),
                        check=spec_check(linear_nvfp4_spec))
