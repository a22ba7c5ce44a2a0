"""The arithmetic of fine-grained (block-scaled) FP8, in plain torch: how a weight is quantized
in blocks (as transformers' `Fp8Quantize` writes checkpoints), dequantized, and how the linear
computes with it (as transformers' finegrained-fp8 kernel does). `zoo/quantized.py`'s module
runs it eagerly; `ad.linear_fp8_block`'s reference op (`semantics/torch_ops.py`) is it, and its
kernel (`codegen/templates/linear_fp8_block_kernel.py`) computes it on the tensor cores. Imports
torch only."""

from __future__ import annotations

from collections.abc import Sequence

import torch

FP8_MAX = 448.0
"""The largest finite float8_e4m3fn value."""
MIN_GROUP_SCALE = 1e-12
"""An activation group is divided by max(its scale, this): an all-zero group quantizes to 0
(transformers' finegrained-fp8 kernel's floor)."""


def _padded(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    return torch.nn.functional.pad(t, (0, cols - t.shape[-1], 0, rows - t.shape[-2]))


def quantize_blocks(weight: torch.Tensor, block: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 weight [N, K], float32 scale_inv [ceil(N / bn), ceil(K / bk)]) as transformers'
    `Fp8Quantize` writes them: per block `scale_inv = amax / 448` (1 for an all-zero block) and
    `fp8 = clamp(w * (448 / amax), -448, 448)` rounded to e4m3 (blocks at the edges are the
    ragged rest, as `FP8Linear` sizes its scales)."""
    bn, bk = block
    n, k = weight.shape
    rows, cols = -(-n // bn), -(-k // bk)
    blocks = _padded(weight.detach().to(torch.float32), rows * bn, cols * bk).view(rows, bn, cols, bk)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, FP8_MAX / torch.where(amax > 0, amax, 1.0), 1.0)
    fp8 = (blocks * scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return fp8.reshape(rows * bn, cols * bk)[:n, :k].contiguous(), (1.0 / scale).float()


def dequantize_blocks(fp8: torch.Tensor, scale_inv: torch.Tensor, block: Sequence[int],
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`fp8 * scale_inv` broadcast over each block, in fp32, then `dtype`."""
    bn, bk = block
    scale = scale_inv.float().repeat_interleave(bn, 0).repeat_interleave(bk, 1)
    return (fp8.float() * scale[:fp8.shape[0], :fp8.shape[1]]).to(dtype)


def quantize_groups(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The activation's quantization of `x` [M, K]: per row, per group of `group` elements (the
    last group the ragged rest), `s = amax(|group|) / 448` and `q = group / max(s, 1e-12)`
    rounded to e4m3. Returns (q as float32 [M, groups, group], zero-padded; s [M, groups])."""
    groups = -(-x.shape[-1] // group)
    xf = torch.nn.functional.pad(x.to(torch.float32), (0, groups * group - x.shape[-1]))
    xf = xf.view(x.shape[0], groups, group)
    scale = xf.abs().amax(-1) / FP8_MAX
    divisor = scale.clamp_min(MIN_GROUP_SCALE)[..., None]
    return (xf / divisor).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(torch.float32), scale


def block_linear(input: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                 bias: torch.Tensor | None, block: Sequence[int]) -> torch.Tensor:
    """The fine-grained FP8 linear: `input` [..., K] quantized per token per group of bk elements
    (`quantize_groups`), then each K block's fp8 x fp8 product, exact in fp32, times the
    activation's and the weight's scales, added block after block in fp32 (up to the order of
    each block's dot, what transformers' finegrained-fp8 kernel computes); rounded to the
    input's dtype, then the bias added and rounded again (HF's `output.add_(bias)`)."""
    bn, bk = block
    n, k = weight.shape
    x = input.reshape(-1, k)
    q, scale = quantize_groups(x, bk)
    groups = scale.shape[1]
    w = torch.nn.functional.pad(weight.to(torch.float32), (0, groups * bk - k)).view(n, groups, bk)
    w_scale = weight_scale_inv.to(torch.float32).repeat_interleave(bn, 0)[:n]
    acc = torch.zeros(x.shape[0], n, dtype=torch.float32, device=input.device)
    for g in range(groups):
        acc += q[:, g] @ w[:, g].T * scale[:, g, None] * w_scale[None, :, g]
    out = acc.to(input.dtype)
    if bias is not None:
        out = (out.to(torch.float32) + bias.to(torch.float32)).to(input.dtype)
    return out.view(*input.shape[:-1], n)


def block_experts(input: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, gate_up: torch.Tensor,
                  gate_up_scale_inv: torch.Tensor, down: torch.Tensor, down_scale_inv: torch.Tensor,
                  block: Sequence[int]) -> torch.Tensor:
    """MoE experts on fine-grained FP8 weights, as transformers' `FP8Experts` computes them with
    dynamic activations: for each expert e and the tokens `topk_ids` [T, k] route to it,
    `gu = block_linear(x, gate_up[e])` ([E, 2I, H]: gate rows, then up rows; rounded to x's
    dtype), `h = silu(gate) * up` (each rounded), `y = block_linear(h, down[e])` ([E, H, I]), times
    the pair's `topk_weights` rounded to x's dtype; the products of a token added in fp32 and
    rounded once. Each GEMM quantizes its input per token per group of bk (`block_linear`)."""
    out = torch.zeros(input.shape, dtype=torch.float32, device=input.device)
    for e in range(gate_up.shape[0]):
        tokens, slots = torch.where(topk_ids == e)
        if tokens.numel() == 0:
            continue
        gate, up = block_linear(input[tokens], gate_up[e], gate_up_scale_inv[e], None, block).chunk(2, dim=-1)
        h = torch.nn.functional.silu(gate) * up
        y = block_linear(h, down[e], down_scale_inv[e], None, block)
        out.index_add_(0, tokens, (y * topk_weights[tokens, slots, None].to(y.dtype)).to(torch.float32))
    return out.to(input.dtype)
