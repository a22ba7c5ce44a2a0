"""The arithmetic of 4-bit weight-only quantization with group scales and zero points (the GPTQ
and AWQ checkpoint formats), in plain torch: how the 4-bit codes are packed into int32 words on
disk, how a weight is quantized round-to-nearest per group, dequantized, and how the linear
computes with it. `zoo/gptq.py` and `zoo/awq.py` write and load the formats with it;
`ad.linear_int4`'s reference op (`semantics/torch_ops.py`) is `int4_linear`, and its kernel
(`codegen/templates/linear_int4_kernel.py`) computes the same in registers.

Orientation: a linear's weight is held transposed, `[K, N]` (in-features by out-features), as
both formats store it. `ad.linear_int4`'s layout is GPTQ's:

- `qweight` int32 [K / 8, N]: nibble j (bits 4j..4j+3) of word [i, n] is the code of row 8i + j;
- `qzeros` int32 [G, N / 8]: nibble j of word [g, c] is the zero point of group g, column 8c + j;
- `scales` [G, N] (float16 on disk): the scale of group g, column n;
- `g_idx` int32 [K] or absent: the group of each row (act-order); absent, row k is in group
  k // group_size. G = ceil(K / group_size).

The weight is `w[k, n] = (code[k, n] - (zero[g, n] + zero_offset)) * scales[g, n]` with g the
row's group: GPTQ's v1 checkpoints store each zero point minus one (`zero_offset` 1), AWQ's and
GPTQ v2's store it as it is (0). AWQ packs `qweight` along N instead, [K, N / 8], and both its
tensors in an interleaved nibble order (`AWQ_ORDER`); its loader repacks them into this layout,
which is lossless (`awq_to_rows`). Imports torch only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

BITS = 4
PACK = 32 // BITS
"""Codes per int32 word."""
MAX_CODE = 2**BITS - 1
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""AWQ's interleave: nibble i of a word holds column AWQ_ORDER[i] of the word's eight."""
PLAIN_ORDER = tuple(range(PACK))
_SHIFTS = torch.arange(0, 32, BITS, dtype=torch.int64)


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """int64 words in [0, 2^32) as the int32 of the same bits."""
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def pack_rows(codes: torch.Tensor) -> torch.Tensor:
    """Codes [K, N] (0..15; K a multiple of 8) -> int32 [K / 8, N], eight rows a word, row 8i + j
    in nibble j of word row i (GPTQ's qweight)."""
    k, n = codes.shape
    grouped = codes.to(torch.int64).view(k // PACK, PACK, n)
    return _to_int32((grouped << _SHIFTS.to(codes.device)[None, :, None]).sum(1))


def unpack_rows(words: torch.Tensor) -> torch.Tensor:
    """`pack_rows`' inverse: int32 [K / 8, N] -> int64 codes [K, N]."""
    rows, n = words.shape
    nibbles = (words.to(torch.int64)[:, None, :] >> _SHIFTS.to(words.device)[None, :, None]) & MAX_CODE
    return nibbles.reshape(rows * PACK, n)


def pack_columns(codes: torch.Tensor, order: Sequence[int] = PLAIN_ORDER) -> torch.Tensor:
    """Codes [R, C] (0..15; C a multiple of 8) -> int32 [R, C / 8], eight columns a word, nibble i
    holding column `order[i]` of the word's eight (GPTQ's qzeros: the plain order; AWQ's qweight
    and qzeros: `AWQ_ORDER`)."""
    r, c = codes.shape
    grouped = codes.to(torch.int64).view(r, c // PACK, PACK)[..., list(order)]
    return _to_int32((grouped << _SHIFTS.to(codes.device)).sum(-1))


def unpack_columns(words: torch.Tensor, order: Sequence[int] = PLAIN_ORDER) -> torch.Tensor:
    """`pack_columns`' inverse: int32 [R, C / 8] -> int64 codes [R, C]."""
    r, c = words.shape
    nibbles = (words.to(torch.int64)[..., None] >> _SHIFTS.to(words.device)) & MAX_CODE
    columns = torch.empty_like(nibbles)
    columns[..., list(order)] = nibbles
    return columns.reshape(r, c * PACK)


def awq_to_rows(qweight: torch.Tensor, qzeros: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """AWQ's (qweight [K, N / 8], qzeros [G, N / 8], both in `AWQ_ORDER`) in `ad.linear_int4`'s
    layout (qweight [K / 8, N] along K, qzeros in the plain order): the same codes, repacked."""
    return pack_rows(unpack_columns(qweight, AWQ_ORDER)), pack_columns(unpack_columns(qzeros, AWQ_ORDER))


def row_groups(k: int, group_size: int, g_idx: torch.Tensor | None) -> torch.Tensor:
    """The group of each of the K rows: `g_idx`, or k // group_size without one."""
    if g_idx is not None:
        return g_idx.to(torch.int64)
    return torch.arange(k, device="cpu") // group_size


def quantize_groups(weight: torch.Tensor, group_size: int, sym: bool, g_idx: torch.Tensor | None = None,
                    min_zero: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest 4-bit quantization of `weight` [N, K] (an nn.Linear's) per group of rows of
    its transpose (`g_idx`, or `group_size` consecutive ones) and per column, as GPTQ's quantizer
    sets its grid (without GPTQ's error feedback): the group's range widened to hold 0, `scale =
    (max - min) / 15` rounded to float16 (a range of 0 taken as [-1, 1]), `zero = round(-min /
    scale)` clamped to [min_zero, 15] (8 when `sym`, the range then symmetric about 0), `code = clamp(round(w / scale) +
    zero, 0, 15)`. Returns (codes int64 [K, N], zeros int64 [G, N], scales float16 [G, N])."""
    wt = weight.detach().to(torch.float32).T
    k, n = wt.shape
    groups = row_groups(k, group_size, g_idx)
    count = int(groups.max()) + 1
    lo = torch.zeros(count, n).scatter_reduce(0, groups[:, None].expand(k, n), wt, "amin")
    hi = torch.zeros(count, n).scatter_reduce(0, groups[:, None].expand(k, n), wt, "amax")
    if sym:
        hi = torch.maximum(hi, -lo)
        lo = -hi
    flat = (hi == lo)
    lo, hi = torch.where(flat, -1.0, lo), torch.where(flat, 1.0, hi)
    scales = ((hi - lo) / MAX_CODE).to(torch.float16)
    zeros = torch.full_like(lo, (MAX_CODE + 1) // 2) if sym else torch.round(-lo / scales.float())
    zeros = zeros.clamp(min_zero, MAX_CODE).to(torch.int64)
    codes = torch.round(wt / scales.float()[groups]) + zeros[groups]
    return codes.clamp(0, MAX_CODE).to(torch.int64), zeros, scales


def dequantize(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor | None,
               group_size: int, zero_offset: int) -> torch.Tensor:
    """The weight [N, K] (an nn.Linear's) in float32: `(code - (zero + zero_offset)) * scale` of
    each row's group, exact (a 5-bit integer times a float16 scale fits float32's mantissa)."""
    codes = unpack_rows(qweight)
    zeros = unpack_columns(qzeros) + zero_offset
    groups = row_groups(codes.shape[0], group_size, g_idx).to(codes.device)
    return ((codes - zeros[groups]).to(torch.float32) * scales.to(torch.float32)[groups]).T


def int4_linear(input: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                g_idx: torch.Tensor | None, bias: torch.Tensor | None, group_size: int,
                zero_offset: int) -> torch.Tensor:
    """The int4 linear: the weight dequantized exactly in float32 (`dequantize`) and rounded once
    to the input's dtype (bf16 rounds it; fp32 keeps it), multiplied with the input in float32
    (the products of two values of the input's dtype are exact there, added in float32 as a
    tensor-core dot does), rounded to the input's dtype; then the bias added in float32 and
    rounded again (the formats' `out + bias`)."""
    w = dequantize(qweight, qzeros, scales, g_idx, group_size, zero_offset).to(input.dtype)
    k = w.shape[1]
    out = (input.reshape(-1, k).to(torch.float32) @ w.to(torch.float32).T).to(input.dtype)
    if bias is not None:
        out = (out.to(torch.float32) + bias.to(torch.float32)).to(input.dtype)
    return out.view(*input.shape[:-1], w.shape[0])
