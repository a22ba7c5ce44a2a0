"""FP4 (e2m1) values, as the 4-bit float formats store them (NVFP4, MXFP4): the 16 codes, how
two of them share a byte, and rounding to them. Imports torch only.

A code is 4 bits: bit 3 the sign, bits 2-1 the exponent (bias 1), bit 0 the mantissa; its
magnitude is one of 0, 0.5, 1, 1.5, 2, 3, 4, 6 (`E2M1_MAGNITUDES`, by the low 3 bits), so code 8
is -0. Two codes share a byte along the packed (last) dimension: element 2i in the low nibble,
element 2i + 1 in the high one (ModelOpt's `NVFP4QTensor` and vLLM's loaders unpack it so).
"""

from __future__ import annotations

import torch

E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
"""The magnitude of each code's low 3 bits."""
E2M1_MAX = 6.0
E2M1_SIGN = 8
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
"""Between magnitudes i and i + 1: a value exactly there rounds to the even code."""


def e2m1_values(device: torch.device | str | None = None) -> torch.Tensor:
    """The float32 value of each of the 16 codes (index = code)."""
    magnitudes = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=device)
    return torch.cat([magnitudes, -magnitudes])


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K / 2] -> the codes, uint8 [..., K]: each byte's low nibble first."""
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten(-2)


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """The codes uint8 [..., K] (K even) -> uint8 [..., K / 2]: element 2i in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def decode(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K / 2] -> float32 [..., K]: the packed codes' values."""
    return e2m1_values(packed.device)[unpack_codes(packed).long()]


def round_to_codes(x: torch.Tensor) -> torch.Tensor:
    """float [...] -> uint8 codes: each magnitude rounded to the nearest e2m1 magnitude, a tie to
    the even code (0.25 -> 0, 0.75 -> 1, 2.5 -> 2, 5 -> 4), above 6 saturated to 6; the sign
    bit set for every negative value, those rounding to 0 included (-0: code 8), as ModelOpt's
    `_cast_fp4` writes them."""
    magnitude = x.abs().contiguous()  # bucketize copies (and warns about) a strided input
    midpoints = torch.tensor(_MIDPOINTS, dtype=magnitude.dtype, device=x.device)
    code = torch.bucketize(magnitude, midpoints)
    at_midpoint = magnitude == midpoints[code.clamp(max=len(_MIDPOINTS) - 1)]
    code = code + (at_midpoint & (code % 2 == 1)).to(code.dtype)
    return (code + E2M1_SIGN * (x < 0).to(code.dtype)).to(torch.uint8)
