"""The arithmetic of NVFP4 (NVIDIA ModelOpt's 4-bit float weights), in plain torch: how a weight
is quantized (ModelOpt's recipe), dequantized, and how the linear computes with it.
`zoo/modelopt.py`'s module runs it eagerly; `ad.linear_nvfp4`'s reference op
(`semantics/torch_ops.py`) is `linear`, and its kernel
(`codegen/templates/linear_nvfp4_kernel.py`) computes the same in registers. Imports torch only.

A weight [N, K] is stored as e2m1 codes packed two a byte (`weight`, uint8 [N, K / 2], `fp4.py`),
one float8_e4m3fn scale per 16 consecutive elements of a row (`weight_scale`, [N, K / 16]) and
one float32 scale for the tensor (`weight_scale_2`): element (n, k) is
`e2m1[n, k] * weight_scale[n, k / 16] * weight_scale_2`.

The activations are not quantized: Hopper has no FP4 MMA, so, as vLLM's Marlin fallback runs
ModelOpt NVFP4 checkpoints there, the linear is weight-only. A checkpoint's `input_scale` (the
activation's global scale, for Blackwell's FP4 x FP4 GEMM) is kept but unused.
"""

from __future__ import annotations

import torch

from ad_mlir.zoo import fp4

GROUP = 16
"""Elements of a row that share one e4m3 block scale."""
FP8_MAX = 448.0
"""The largest finite float8_e4m3fn value."""
MIN_BLOCK_SCALE = 2.0**-9
"""ModelOpt clamps block scales up to e4m3's smallest subnormal, so that none rounds to 0."""


def global_scale(amax: torch.Tensor) -> torch.Tensor:
    """ModelOpt's global (per-tensor) scale of a tensor whose amax is `amax`: `amax / (6 * 448)`
    in float32, so that the largest block scale, `amax / 6 / global`, is e4m3's largest, 448."""
    return amax.float() / (fp4.E2M1_MAX * FP8_MAX)


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(packed codes uint8 [N, K / 2], block scales float8_e4m3fn [N, K / 16], global scale
    float32 []) of `weight` [N, K] (K a multiple of 16), by ModelOpt's recipe
    (`NVFP4QTensor.quantize`): the global scale from the tensor's amax; each block's scale
    `amax_block / (6 * global)` in float32 (1 for an all-zero block, at least 2^-9) rounded to
    e4m3; each element divided by its rounded block scale times the global scale (in float32)
    and rounded to e2m1 (`fp4.round_to_codes`)."""
    n, k = weight.shape
    if k % GROUP:
        raise ValueError(f"NVFP4 weight [{n}, {k}]: in-features must be a multiple of {GROUP}")
    blocks = weight.detach().float().view(n, k // GROUP, GROUP)
    scale_2 = global_scale(blocks.abs().amax())
    block_scale = blocks.abs().amax(-1) / (fp4.E2M1_MAX * scale_2)
    block_scale = torch.where(block_scale == 0, 1.0, block_scale).clamp_min(MIN_BLOCK_SCALE)
    block_scale = block_scale.to(torch.float8_e4m3fn)
    scaled = blocks / (block_scale.float() * scale_2)[..., None]
    return fp4.pack_codes(fp4.round_to_codes(scaled.view(n, k))), block_scale, scale_2


def dequantize(weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weight [N, K]: `e2m1 * (weight_scale * weight_scale_2)` in float32 (ModelOpt's
    `NVFP4QTensor.dequantize` order), then `dtype`."""
    scale = weight_scale.float() * weight_scale_2.float().reshape(-1, 1)
    return (fp4.decode(weight) * scale.repeat_interleave(GROUP, -1)).to(dtype)


def scaled_codes(weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """`e2m1 * weight_scale` [N, K] in float32: the weight without its global scale. Exact, and
    exact in bf16 and fp16 too: a 2-bit by 4-bit significand product within their range."""
    return fp4.decode(weight) * weight_scale.float().repeat_interleave(GROUP, -1)


def linear(input: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor,
           bias: torch.Tensor | None) -> torch.Tensor:
    """The NVFP4 linear, weight-only: `input` [..., K] times the block-scaled codes
    (`scaled_codes`) in float32, times the global scale (`weight_scale_2`: one value, or one per
    output row [N], as `fuse-gemms` folds the parts of a merged GEMM), plus the bias, in float32;
    rounded once to the input's dtype."""
    n = weight.shape[0]
    x = input.reshape(-1, input.shape[-1]).float()
    out = (x @ scaled_codes(weight, weight_scale).T) * weight_scale_2.float().reshape(-1)
    if bias is not None:
        out = out + bias.float()
    return out.to(input.dtype).view(*input.shape[:-1], n)
