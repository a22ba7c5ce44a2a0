"""FP4 (E2M1) values as the 4-bit formats store them (MXFP4, NVFP4): the 16 codes, two to a byte.

A code is `s e1 e0 m`: sign, a 2-bit exponent of bias 1 and one mantissa bit, so the magnitudes
of codes 0-7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6 and codes 8-15 their negatives (OCP Microscaling
spec, table of E2M1). A byte holds two consecutive elements, the first (even index) in its low
nibble, as transformers' `convert_moe_packed_tensors` and vLLM's unpacking read them. Scales are
the formats' own business (`zoo/mxfp4.py`). Imports nothing of the compiler.
"""

from __future__ import annotations

import torch

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
"""The value of each code 0-15."""
E2M1_MAX = 6.0
SIGN = 8

_ROUND_UP_FROM = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))
"""Between consecutive magnitudes, the midpoint and whether a tie goes to the upper code: ties go
to the even code (round to nearest even), which is the upper one when the lower code is odd."""


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[..., n] uint8 -> [..., 2n] codes (uint8), the low nibble of each byte first."""
    return torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[..., 2n] codes -> [..., n] uint8, element 2j in the low nibble of byte j."""
    pairs = codes.to(torch.uint8).unflatten(-1, (-1, 2))
    return pairs[..., 0] | (pairs[..., 1] << 4)


def e2m1_decode(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The values of `codes` (integers 0-15) in `dtype` (exact in any float dtype)."""
    return torch.tensor(E2M1_VALUES, dtype=dtype, device=codes.device)[codes.long()]


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """The code nearest each value of `x` (uint8), ties to the even code, magnitudes above 6
    saturating to 6; a negative value's code carries the sign (one rounded to zero: -0)."""
    magnitude = x.abs().float()
    code = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)
    for midpoint, tie_up in _ROUND_UP_FROM:
        code += (magnitude >= midpoint if tie_up else magnitude > midpoint).to(torch.uint8)
    return code | (x.float() < 0).to(torch.uint8) * SIGN
