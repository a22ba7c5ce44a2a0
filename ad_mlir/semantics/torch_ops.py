"""Torch meaning of the `ad` ops that have no ATen op: `torch.ops.ad_mlir.<op>`.

The LLM fusions make these ops (`ad.rms_norm`, `ad.silu_and_mul`...). Registered as
`torch.library` custom ops, they give the op table an overload like any ATen op, so the
exporter can emit an unfused one, the reference evaluator can run it, and a compiled graph
that calls one still imports. Each computes step by step what HF's module computes, with the
same roundings; `dialects/decompositions.py` spells the same steps as `ad` ops for codegen
(a unit test checks that both agree bit for bit).
"""

from __future__ import annotations

import importlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ad_mlir.dialects import ad
from ad_mlir.zoo import fp8_blocks, int4, nvfp4

NAMESPACE = "ad_mlir"

DIRECT: dict[str, Callable[..., Any]] = {}
"""The Python function of each op that writes its inputs, by qualified name (`direct_function`)."""


def _writing_op(name: str, mutates_args: tuple[str, ...]) -> Callable[[Callable[..., Any]], Any]:
    """`torch.library.custom_op` for an op that writes its inputs (the caches), its function also
    kept in `DIRECT`: torch dispatches such an op through a Python step that rebuilds the schema's
    argument list once per argument (measured ~200 us per call of `cached_attention`'s 20
    arguments, more than its decode step computes)."""
    def define(fn: Callable[..., Any]) -> Any:
        DIRECT[f"{NAMESPACE}::{name}"] = fn
        return torch.library.custom_op(f"{NAMESPACE}::{name}", mutates_args=mutates_args)(fn)
    return define


def direct_function(target: Any) -> Callable[..., Any] | None:
    """The Python function behind `target` (an op overload of `_writing_op`), which a caller
    that already declared the writes (a kernel op's `written` inputs) may call without torch's
    dispatch; else None."""
    schema = getattr(target, "_schema", None)
    return DIRECT.get(schema.name) if schema is not None else None


def _normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.to(torch.float32)
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


def _apply_weight(
    x: torch.Tensor, normed: torch.Tensor, weight: torch.Tensor | None, offset: float, weight_in_fp32: bool
) -> torch.Tensor:
    if weight is None:
        return normed.to(x.dtype)
    if weight_in_fp32:
        return (normed * (weight.to(torch.float32) + offset)).to(x.dtype)
    w = weight + offset if offset else weight
    return w * normed.to(x.dtype)


@torch.library.custom_op(f"{NAMESPACE}::rms_norm", mutates_args=())
def rms_norm(
    input: torch.Tensor, weight: torch.Tensor | None, eps: float, offset: float = 0.0, weight_in_fp32: bool = False
) -> torch.Tensor:
    return _apply_weight(input, _normalize(input, eps), weight, offset, weight_in_fp32)


@rms_norm.register_fake
def _(input: torch.Tensor, weight: torch.Tensor | None, eps: float, offset: float = 0.0,
      weight_in_fp32: bool = False) -> torch.Tensor:
    return _apply_weight(input, torch.empty_like(input, dtype=torch.float32), weight, offset, weight_in_fp32)


@torch.library.custom_op(f"{NAMESPACE}::add_rms_norm", mutates_args=())
def add_rms_norm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    offset: float = 0.0,
    weight_in_fp32: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    total = input + residual
    return _apply_weight(total, _normalize(total, eps), weight, offset, weight_in_fp32), total


@add_rms_norm.register_fake
def _(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float, offset: float = 0.0,
      weight_in_fp32: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    normed = _apply_weight(input, torch.empty_like(input, dtype=torch.float32), weight, offset, weight_in_fp32)
    return normed, torch.empty_like(input)


def _layer_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """`(x - mean) * rsqrt(var + eps)` in fp32, the variance biased (F.layer_norm's)."""
    xf = x.to(torch.float32)
    centered = xf - xf.mean(-1, keepdim=True)
    return centered * torch.rsqrt((centered * centered).mean(-1, keepdim=True) + eps)


def _affine(x: torch.Tensor, normed: torch.Tensor, weight: torch.Tensor | None,
            bias: torch.Tensor | None) -> torch.Tensor:
    """F.layer_norm's `normed * weight + bias` in fp32, rounded once to the input's dtype."""
    if weight is not None:
        normed = normed * weight.to(torch.float32)
    if bias is not None:
        normed = normed + bias.to(torch.float32)
    return normed.to(x.dtype)


@torch.library.custom_op(f"{NAMESPACE}::layer_norm", mutates_args=())
def layer_norm(input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
               eps: float) -> torch.Tensor:
    """`F.layer_norm(input, input.shape[-1:], weight, bias, eps)` step by step: the same math
    and the one rounding at the end, the row sums in torch's order rather than its kernel's."""
    return _affine(input, _layer_normalize(input, eps), weight, bias)


@layer_norm.register_fake
def _(input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    return torch.empty_like(input)


@torch.library.custom_op(f"{NAMESPACE}::add_layer_norm", mutates_args=())
def add_layer_norm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None,
                   bias: torch.Tensor | None, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    total = input + residual
    return _affine(total, _layer_normalize(total, eps), weight, bias), total


@add_layer_norm.register_fake
def _(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
      eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(input), torch.empty_like(input)


@torch.library.custom_op(f"{NAMESPACE}::silu_and_mul", mutates_args=())
def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(gate) * up


@silu_and_mul.register_fake
def _(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(gate)


def _route(router_logits: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, experts) [tokens, top_k], as HF's top-k routers compute them, in fp32."""
    weights, experts = torch.topk(torch.softmax(router_logits.float(), dim=-1), top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


def _expert(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """HF's gated MLP of one expert, in x's dtype."""
    gate, up = torch.nn.functional.linear(x, gate_up).chunk(2, dim=-1)
    return torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, down)


@torch.library.custom_op(f"{NAMESPACE}::moe", mutates_args=())
def moe(
    input: torch.Tensor,
    router_logits: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    shared_gate: torch.Tensor | None,
    top_k: int,
    shared_experts: int = 0,
    normalize: bool = False,
    round_weights: bool = False,
) -> torch.Tensor:
    """`ad.moe`: the plain loop over experts, each on the tokens routed to it (then the shared
    experts on every token), the weighted outputs summed in fp32."""
    weights, experts = _route(router_logits, top_k, normalize)
    shared = torch.ones_like(input[:, :1], dtype=torch.float32) if shared_gate is None else torch.sigmoid(
        shared_gate.float())
    if round_weights:
        weights, shared = weights.to(input.dtype).float(), shared.to(input.dtype).float()
    out = torch.zeros(input.shape, dtype=torch.float32, device=input.device)
    routed = gate_up.shape[0] - shared_experts
    for e in range(routed):
        tokens, slot = torch.where(experts == e)
        y = _expert(input[tokens], gate_up[e], down[e])
        out.index_add_(0, tokens, y.float() * weights[tokens, slot, None])
    for e in range(routed, gate_up.shape[0]):
        out += _expert(input, gate_up[e], down[e]).float() * shared
    return out.to(input.dtype)


@moe.register_fake
def _(input: torch.Tensor, router_logits: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
      shared_gate: torch.Tensor | None, top_k: int, shared_experts: int = 0, normalize: bool = False,
      round_weights: bool = False) -> torch.Tensor:
    return torch.empty_like(input)


@torch.library.custom_op(f"{NAMESPACE}::gelu_and_mul", mutates_args=())
def gelu_and_mul(gate: torch.Tensor, up: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return torch.nn.functional.gelu(gate, approximate=approximate) * up


@gelu_and_mul.register_fake
def _(gate: torch.Tensor, up: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return torch.empty_like(gate)


def _relu2(x: torch.Tensor) -> torch.Tensor:
    """HF's `ReLUSquaredActivation` (`torch.square`, which exports as `r * r`)."""
    r = torch.relu(x)
    return r * r


ACTIVATION_FUNCTIONS = {
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "relu": torch.relu,
    "relu2": _relu2,
    "silu": torch.nn.functional.silu,
}
"""`ad.activation` kind -> its torch function (`ad.ACTIVATIONS`)."""


@torch.library.custom_op(f"{NAMESPACE}::activation", mutates_args=())
def activation(input: torch.Tensor, bias: torch.Tensor | None, kind: str) -> torch.Tensor:
    return ACTIVATION_FUNCTIONS[kind](input if bias is None else input + bias)


@activation.register_fake
def _(input: torch.Tensor, bias: torch.Tensor | None, kind: str) -> torch.Tensor:
    return torch.empty_like(input)




def _quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (x.to(torch.float32) / scale).clamp(-ad.FP8_MAX, ad.FP8_MAX).to(torch.float8_e4m3fn)


@torch.library.custom_op(f"{NAMESPACE}::quantize_fp8", mutates_args=())
def quantize_fp8(input: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return _quantize(input, scale)


@quantize_fp8.register_fake
def _(input: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(input, dtype=torch.float8_e4m3fn)


def _dynamic_scale(x: torch.Tensor, per_token: bool) -> torch.Tensor:
    magnitude = x.to(torch.float32).abs()
    amax = magnitude.amax(-1, keepdim=True) if per_token else magnitude.amax()
    return amax.clamp_min(ad.FP8_MIN_AMAX) / ad.FP8_MAX


@torch.library.custom_op(f"{NAMESPACE}::quantize_fp8_dynamic", mutates_args=())
def quantize_fp8_dynamic(input: torch.Tensor, per_token: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    scale = _dynamic_scale(input, per_token)
    return _quantize(input, scale), scale


@quantize_fp8_dynamic.register_fake
def _(input: torch.Tensor, per_token: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    scale_shape = (*input.shape[:-1], 1) if per_token else ()
    return torch.empty_like(input, dtype=torch.float8_e4m3fn), input.new_empty(scale_shape, dtype=torch.float32)


@torch.library.custom_op(f"{NAMESPACE}::dequantize_fp8", mutates_args=())
def dequantize_fp8(input: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (input.to(torch.float32) * scale).to(dtype)


@dequantize_fp8.register_fake
def _(input: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_like(input, dtype=dtype)


@torch.library.custom_op(f"{NAMESPACE}::linear_fp8", mutates_args=())
def linear_fp8(
    input: torch.Tensor,
    weight: torch.Tensor,
    input_scale: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The reference: dequantize both operands and multiply in fp32 (what a scaled FP8 GEMM
    computes, up to its accumulation order)."""
    x = input.to(torch.float32) * input_scale
    w = weight.to(torch.float32) * weight_scale
    out = torch.nn.functional.linear(x, w, None if bias is None else bias.to(torch.float32))
    return out.to(dtype)


@linear_fp8.register_fake
def _(input: torch.Tensor, weight: torch.Tensor, input_scale: torch.Tensor, weight_scale: torch.Tensor,
      bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    return input.new_empty((*input.shape[:-1], weight.shape[0]), dtype=dtype)


@torch.library.custom_op(f"{NAMESPACE}::linear_fp8_block", mutates_args=())
def linear_fp8_block(input: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                     bias: torch.Tensor | None, block_size: list[int]) -> torch.Tensor:
    """`ad.linear_fp8_block`: the fine-grained FP8 format's arithmetic (`zoo/fp8_blocks.py`'s
    `block_linear`: the activation quantized per token per group of bk elements, each K
    block's fp8 x fp8 product times both scales, added in fp32; transformers' finegrained-fp8
    kernel's semantics), which a loaded checkpoint's `Fp8BlockLinear` also runs eagerly."""
    return fp8_blocks.block_linear(input, weight, weight_scale_inv, bias, block_size)


@linear_fp8_block.register_fake
def _(input: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor, bias: torch.Tensor | None,
      block_size: list[int]) -> torch.Tensor:
    return input.new_empty((*input.shape[:-1], weight.shape[0]))


@torch.library.custom_op(f"{NAMESPACE}::linear_nvfp4", mutates_args=())
def linear_nvfp4(input: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor,
                 bias: torch.Tensor | None) -> torch.Tensor:
    """`ad.linear_nvfp4`: ModelOpt NVFP4's weight-only linear (`zoo/nvfp4.py`'s `linear`: the
    input times the e2m1 codes times their e4m3 block scales in fp32, times the global scale,
    plus the bias, rounded once), which a loaded checkpoint's `Nvfp4Linear` also runs eagerly."""
    return nvfp4.linear(input, weight, weight_scale, weight_scale_2, bias)


@linear_nvfp4.register_fake
def _(input: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor,
      bias: torch.Tensor | None) -> torch.Tensor:
    return input.new_empty((*input.shape[:-1], weight.shape[0]))


@torch.library.custom_op(f"{NAMESPACE}::moe_mxfp4", mutates_args=())
def moe_mxfp4(input: torch.Tensor, router_logits: torch.Tensor, gate_up_blocks: torch.Tensor,
              gate_up_scales: torch.Tensor, gate_up_bias: torch.Tensor, down_blocks: torch.Tensor,
              down_scales: torch.Tensor, down_bias: torch.Tensor, top_k: int, alpha: float,
              limit: float) -> torch.Tensor:
    """`ad.moe_mxfp4`: gpt-oss's routing, then its experts on the routed experts' dequantized
    MXFP4 weights (`zoo/mxfp4.py`'s `moe_mxfp4`), which a loaded checkpoint's `Mxfp4Experts`
    also runs eagerly."""
    # imported here: zoo/mxfp4.py's loader imports transformers' quantization integrations, and
    # with them triton, which must not be imported before a caller picks the interpreter
    from ad_mlir.zoo import mxfp4

    return mxfp4.moe_mxfp4(input, router_logits, gate_up_blocks, gate_up_scales, gate_up_bias, down_blocks,
                           down_scales, down_bias, top_k, alpha, limit)


@moe_mxfp4.register_fake
def _(input: torch.Tensor, router_logits: torch.Tensor, gate_up_blocks: torch.Tensor, gate_up_scales: torch.Tensor,
      gate_up_bias: torch.Tensor, down_blocks: torch.Tensor, down_scales: torch.Tensor, down_bias: torch.Tensor,
      top_k: int, alpha: float, limit: float) -> torch.Tensor:
    return torch.empty_like(input)


@torch.library.custom_op(f"{NAMESPACE}::moe_fp8_block", mutates_args=())
def moe_fp8_block(input: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, gate_up: torch.Tensor,
                  gate_up_scale_inv: torch.Tensor, down: torch.Tensor, down_scale_inv: torch.Tensor,
                  block_size: list[int]) -> torch.Tensor:
    """`ad.moe_fp8_block`: MoE experts on fine-grained FP8 weights from the router's choices
    (`zoo/fp8_blocks.py`'s `block_experts`: each expert's two GEMMs as `linear_fp8_block`
    computes them, silu * up between; transformers' `FP8Experts`' semantics), which a loaded
    checkpoint's `Fp8BlockExperts` also runs eagerly."""
    return fp8_blocks.block_experts(input, topk_ids, topk_weights, gate_up, gate_up_scale_inv, down, down_scale_inv,
                                    block_size)


@moe_fp8_block.register_fake
def _(input: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, gate_up: torch.Tensor,
      gate_up_scale_inv: torch.Tensor, down: torch.Tensor, down_scale_inv: torch.Tensor,
      block_size: list[int]) -> torch.Tensor:
    return torch.empty_like(input)


@torch.library.custom_op(f"{NAMESPACE}::linear_int4", mutates_args=())
def linear_int4(input: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                g_idx: torch.Tensor | None, bias: torch.Tensor | None, group_size: int,
                zero_offset: int) -> torch.Tensor:
    """`ad.linear_int4`: GPTQ's and AWQ's int4 arithmetic (`zoo/int4.py`'s `int4_linear`: the
    weight dequantized exactly in fp32, rounded to the input's dtype, the product accumulated in
    fp32), which a loaded checkpoint's `Int4Linear` also runs eagerly."""
    return int4.int4_linear(input, qweight, qzeros, scales, g_idx, bias, group_size, zero_offset)


@linear_int4.register_fake
def _(input: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
      g_idx: torch.Tensor | None, bias: torch.Tensor | None, group_size: int, zero_offset: int) -> torch.Tensor:
    return input.new_empty((*input.shape[:-1], qweight.shape[1]))


def _rotate(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """HF's rotate_half, or with `interleaved` its rotate_every_two (GPT-J, GLM)."""
    if interleaved:
        return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """HF's `apply_rotary_pos_emb` for one tensor (`cos`/`sin` already unsqueezed over heads): the
    first `cos.shape[-1]` dims rotate, the rest pass (`ad.RopeAttentionOp`)."""
    rotary_dim = cos.shape[-1]
    if rotary_dim == x.shape[-1]:
        return x * cos + _rotate(x, interleaved) * sin
    rot = x[..., :rotary_dim]
    return torch.cat((rot * cos + _rotate(rot, interleaved) * sin, x[..., rotary_dim:]), dim=-1)


@torch.library.custom_op(f"{NAMESPACE}::rope", mutates_args=())
def rope(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
         interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return _apply_rope(query, cos, sin, interleaved), _apply_rope(key, cos, sin, interleaved)


@rope.register_fake
def _(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
      interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(query), torch.empty_like(key)


@torch.library.custom_op(f"{NAMESPACE}::rope_attention", mutates_args=())
def rope_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    attn_mask: torch.Tensor | None,
    scale: float,
    is_causal: bool = False,
    window: int | None = None,
    softcap: float | None = None,
    interleaved: bool = False,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    qk_norm_eps: float | None = None,
    qk_norm_offset: float = 0.0,
    qk_norm_weight_in_fp32: bool = False,
) -> torch.Tensor:
    """HF's QK-norm (when given), RoPE (`apply_rotary_pos_emb`) and `repeat_kv`, then SDPA: the
    ops it replaces (a sliding window is the boolean mask HF would build for it); soft-capped,
    HF's eager Gemma2 attention."""
    query, key = _qk_norm(query, key, q_norm_weight, k_norm_weight, qk_norm_eps, qk_norm_offset,
                          qk_norm_weight_in_fp32)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q, k = _apply_rope(query, cos, sin, interleaved), _apply_rope(key, cos, sin, interleaved)
    groups = query.shape[1] // key.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    if window is not None or (softcap is not None and is_causal):
        allowed = _causal_window(query.shape[2], window, query.device)
        attn_mask, is_causal = allowed if attn_mask is None else attn_mask & allowed, False
    if softcap is not None:
        return _eager_attention(q, k, v, attn_mask, scale, softcap)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                                            scale=scale)


def _qk_norm(query: torch.Tensor, key: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
             eps: float | None, offset: float, weight_in_fp32: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query and key head RMS-normalized over head_dim (`rms_norm`), or both as given."""
    if q_weight is None or k_weight is None or eps is None:
        return query, key
    return tuple(_apply_weight(x, _normalize(x, eps), w, offset, weight_in_fp32)
                 for x, w in ((query, q_weight), (key, k_weight)))


def _causal_window(seq: int, window: int | None, device: torch.device) -> torch.Tensor:
    """[seq, seq] booleans: key j seen by query i when j <= i (and i - window < j)."""
    return _keys_seen(torch.arange(seq, device=device), seq, window)


def _keys_seen(positions: torch.Tensor, end: int, window: int | None) -> torch.Tensor:
    """[queries, end] booleans: key j seen by the query at `positions[i]` when j <= it (and it -
    window < j): causal attention with an offset, within a sliding window."""
    position, keys = positions[:, None], torch.arange(end, device=positions.device)[None, :]
    return (keys <= position) & (keys > position - window) if window is not None else keys <= position


@rope_attention.register_fake
def _(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
      attn_mask: torch.Tensor | None, scale: float, is_causal: bool = False, window: int | None = None,
      softcap: float | None = None, interleaved: bool = False, q_norm_weight: torch.Tensor | None = None,
      k_norm_weight: torch.Tensor | None = None, qk_norm_eps: float | None = None, qk_norm_offset: float = 0.0,
      qk_norm_weight_in_fp32: bool = False) -> torch.Tensor:
    return torch.empty_like(query)


@_writing_op("cached_attention", mutates_args=("k_cache", "v_cache", "compressed_cache"))
def cached_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cache_starts: torch.Tensor,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    interleaved: bool = False,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    qk_norm_eps: float | None = None,
    qk_norm_offset: float = 0.0,
    qk_norm_weight_in_fp32: bool = False,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    distance_bias: torch.Tensor | None = None,
    compressed: torch.Tensor | None = None,
    compressed_cache: torch.Tensor | None = None,
    selected: torch.Tensor | None = None,
    query_starts: torch.Tensor | None = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
) -> torch.Tensor:
    """`ad.cached_attention`: QK-norm and RoPE on the new query/key (when given), then sequence
    by sequence (batch row s, or with `query_starts` its new tokens `query_starts[s]` ..
    `query_starts[s + 1]` of the one flattened row, after the `cache_starts[s]` it holds) the new
    keys/values written into its pages through its block table, and attention over its
    positions 0 .. start + seq - 1, causal with offset (and within `window`), the scores
    soft-capped with `softcap`, ALiBi's `slope * (key - query position)` added (`alibi_slopes`),
    each query's bias by backward distance added (`distance_bias`), each head's (or each
    token's) sink logit in its softmax (`sinks`); with `compressed`, its entries (each its own
    key and value) written into `compressed_cache` the same way and attended in the same
    softmax, causal with offset, without the window (with `selected`, only those it lists).
    Steps where every sequence brings one token are computed together (`_decodes`). The
    reference reads the metadata on the host. With `k_scale`/`v_scale` the pools are e4m3: the
    new rows are quantized before they are written (`quantize_kv`), and every row read, the new
    ones too, is dequantized (`dequantize_kv`)."""
    query, key = _new_query_key(query, key, cos, sin, interleaved, q_norm_weight, k_norm_weight, qk_norm_eps,
                                qk_norm_offset, qk_norm_weight_in_fp32)
    scales = KvScales(k_scale, v_scale, key.dtype)
    key, value = scales.stored(key, value)
    batched = query_starts is None
    bounds = None if batched else query_starts.tolist()
    seqs = cache_starts.shape[0]
    one_token = query.shape[2] == 1 if batched else bounds[-1] == seqs
    plain = softcap is None and sinks is None and alibi_slopes is None and distance_bias is None
    if one_token and plain and compressed is None and seqs > 1:
        if not batched:
            return _decodes(query, key, value, k_cache, v_cache, cache_starts, block_tables, scale, window, scales)
        # the batch rows' one token each, viewed as one flattened row [1, heads, seqs, d] and back
        flat = [x.transpose(0, 2) for x in (query, key, value)]
        return _decodes(*flat, k_cache, v_cache, cache_starts, block_tables, scale, window, scales).transpose(0, 2)
    out = query.new_empty((*query.shape[:3], value.shape[3]))
    if not batched:
        _flattened_decodes(query, key, value, k_cache, v_cache, cache_starts, block_tables, scale, window, bounds,
                           out if plain else None, scales)
    per_token = sinks is not None and sinks.dim() == 3  # [batch, heads, seq]: each token's own
    for s, (start, pages) in enumerate(zip(cache_starts.tolist(), block_tables.tolist(), strict=True)):
        rows = slice(None) if batched else slice(bounds[s], bounds[s + 1])
        b = s if batched else 0
        if not batched and plain and bounds[s + 1] - bounds[s] == 1:
            continue  # computed by _flattened_decodes
        q, k_new, v_new = (x[b, :, rows] for x in (query, key, value))
        k, v = scales.read(_sequence_positions(k_cache, pages, start, k_new),
                           _sequence_positions(v_cache, pages, start, v_new))
        if compressed is not None and compressed_cache is not None:
            entries = _sequence_positions(compressed_cache, pages, start, compressed[b])
            out[b] = _attend_with_compressed(q, k, v, entries, start, scale, window, sinks,
                                             selected[b] if selected is not None else None)
        else:
            out[b, :, rows] = _attend_over_prefix(
                q, k, v, start, scale, window, softcap, sinks[b] if per_token else sinks, alibi_slopes,
                distance_bias[b, :, rows] if distance_bias is not None else None)
    return out


E4M3_MAX = 448.0
"""The largest finite float8_e4m3fn value: what a quantized K/V row saturates to."""


def quantize_kv(x: torch.Tensor, scale: float) -> torch.Tensor:
    """K/V rows as an e4m3 pool holds them: x / scale (in fp32), saturated to +-448, rounded to
    nearest even (vLLM's fp8 KV cache with a per-tensor scale)."""
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def dequantize_kv(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """Rows of an e4m3 pool as attention reads them: x * scale in fp32, rounded to `dtype`."""
    return (x.float() * scale).to(dtype)


@dataclass(frozen=True)
class KvScales:
    """How `cached_attention`'s pools hold rows: as they are (no scales), or e4m3 with a scale
    each for keys and values, read back in `dtype` (the key's)."""

    k_scale: float | None
    v_scale: float | None
    dtype: torch.dtype

    def stored(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.k_scale is None or self.v_scale is None:
            return key, value
        return quantize_kv(key, self.k_scale), quantize_kv(value, self.v_scale)

    def read(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.k_scale is None or self.v_scale is None:
            return key, value
        return dequantize_kv(key, self.k_scale, self.dtype), dequantize_kv(value, self.v_scale, self.dtype)


def _bytes(x: torch.Tensor) -> torch.Tensor:
    """`x` as bytes where it is e4m3, whose `index_copy_` torch's CPU lacks."""
    return x.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x


def _sequence_positions(pool: torch.Tensor, pages: list[int], start: int, new: torch.Tensor) -> torch.Tensor:
    """`new` [kv_heads, n, d] written at positions start .. start + n - 1 of the sequence whose
    page ids are `pages` in `pool` [pages, page_size, kv_heads, d], and the sequence's positions
    [start + n, kv_heads, d]: a view of its page where one page holds them (a slot)."""
    page_size, end = pool.shape[1], start + new.shape[1]
    if end <= page_size:
        rows = pool[pages[0]]
        rows[start:end] = new.transpose(0, 1)
        return rows[:end]
    used = torch.tensor(pages[:-(-end // page_size)], device=pool.device)
    positions = torch.arange(start, end, device=pool.device)
    pool[used[positions // page_size], positions % page_size] = new.transpose(0, 1)
    return pool[used].flatten(0, 1)[:end]


def _attend_with_compressed(query: torch.Tensor, k: torch.Tensor, v: torch.Tensor, entries: torch.Tensor, start: int,
                            scale: float, window: int | None, sinks: torch.Tensor | None,
                            selected: torch.Tensor | None) -> torch.Tensor:
    """One sequence's queries [heads, seq, d] at positions start.. in one softmax over its keys
    (within `window`) and its compressed entries (causal only; with `selected` [seq, k], only
    those listed), each [end, kv_heads, d]: HF's `cat([kv, compressed_kv], dim=2)`."""
    end = k.shape[0]
    positions = torch.arange(start, end, device=query.device)
    seen = _keys_seen(positions, end, None)
    if selected is not None:  # a column of its own for -1, dropped after
        listed = torch.zeros(selected.shape[0], end + 1, dtype=torch.bool, device=query.device)
        seen = seen & listed.scatter(1, torch.where(selected >= 0, selected, end), True)[:, :end]
    allowed = torch.cat([_keys_seen(positions, end, window), seen], dim=-1)
    groups = query.shape[0] // k.shape[1]
    keys = torch.cat([k, entries]).transpose(0, 1).repeat_interleave(groups, dim=0)
    values = torch.cat([v, entries]).transpose(0, 1).repeat_interleave(groups, dim=0)
    return _eager_attention(query, keys, values, allowed, scale, None, sinks)


def _new_query_key(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
                   interleaved: bool, q_norm_weight: torch.Tensor | None, k_norm_weight: torch.Tensor | None,
                   qk_norm_eps: float | None, qk_norm_offset: float, qk_norm_weight_in_fp32: bool,
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The cached forms' new query and key: QK-norm, then RoPE when its tables are given."""
    query, key = _qk_norm(query, key, q_norm_weight, k_norm_weight, qk_norm_eps, qk_norm_offset,
                          qk_norm_weight_in_fp32)
    if cos is None or sin is None:
        return query, key
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    if query.shape[0] != key.shape[0] or query.shape[2:] != key.shape[2:] or query.dtype != key.dtype:
        return _apply_rope(query, cos, sin, interleaved), _apply_rope(key, cos, sin, interleaved)
    # one rotation of the query and key heads together: the same elementwise ops, half the calls
    both = _apply_rope(torch.cat((query, key), dim=1), cos, sin, interleaved)
    return both[:, :query.shape[1]], both[:, query.shape[1]:]


def _attend_over_prefix(query: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float,
                        window: int | None, softcap: float | None, sinks: torch.Tensor | None,
                        alibi_slopes: torch.Tensor | None,
                        distance_bias: torch.Tensor | None = None) -> torch.Tensor:
    """One sequence's new queries [heads, seq, head_dim] at positions start.. over its keys and
    values [positions, kv_heads, head_dim] (the cached ones, then the new ones): causal with
    offset, within `window`, soft-capped, ALiBi-biased, biased by distance ([heads, seq, extent]),
    with sinks, as `cached_attention` says."""
    k, v = k.transpose(0, 1), v.transpose(0, 1)
    if softcap is None and sinks is None and alibi_slopes is None and distance_bias is None:
        return _sdpa_with_offset(query[None], k[None], v[None], start, window, scale)[0]
    end, groups = k.shape[1], query.shape[0] // k.shape[0]
    positions = torch.arange(start, end, device=query.device)
    allowed = _keys_seen(positions, end, window)
    bias = None
    if alibi_slopes is not None:
        bias = alibi_slopes.float()[:, None, None] * (torch.arange(end, device=query.device) - positions[:, None])
    if distance_bias is not None:
        by_distance = _bias_by_distance(distance_bias, positions, end)
        bias = by_distance if bias is None else bias + by_distance
    k, v = k.repeat_interleave(groups, dim=0), v.repeat_interleave(groups, dim=0)
    return _eager_attention(query, k, v, allowed, scale, softcap, sinks, bias)


def _bias_by_distance(distance_bias: torch.Tensor, positions: torch.Tensor, end: int) -> torch.Tensor:
    """The scores' bias [heads, seq, end] of queries at `positions` over keys 0 .. end - 1 from
    `distance_bias` [heads, seq, extent]: each query's entry at its distance to the key, 0 where
    the key is ahead or `extent` or more back (fp32)."""
    extent = distance_bias.shape[-1]
    distance = positions[:, None] - torch.arange(end, device=positions.device)[None, :]
    index = distance.clamp(0, extent - 1).expand(distance_bias.shape[0], -1, -1)
    gathered = distance_bias.float().gather(-1, index)
    return gathered.masked_fill((distance < 0) | (distance >= extent), 0.0)


def _sdpa_with_offset(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, start: int, window: int | None,
                      scale: float) -> torch.Tensor:
    """SDPA of query [1, heads, seq, d] at positions start.. over key/value [1, kv_heads, start +
    seq, d], causal with that offset (and within `window`). Without a mask where none is needed
    (a decode token inside the window sees every key; a prompt from position 0 is SDPA's own
    causal form), so that the CPU's flash kernel runs rather than the masked math one."""
    seq, end = query.shape[2], key.shape[2]
    within = window is None or end <= window
    if within and (seq == 1 or start == 0):
        return torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=seq > 1, scale=scale,
                                                                enable_gqa=True)
    allowed = _keys_seen(torch.arange(start, end, device=query.device), end, window)
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=allowed, scale=scale,
                                                            enable_gqa=True)


def _eager_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, allowed: torch.Tensor | None,
                     scale: float, softcap: float | None = None, sinks: torch.Tensor | None = None,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """HF's eager attention where SDPA cannot say it: Gemma2's soft cap, a float `bias` added to
    the scores after it (ALiBi), gpt-oss's sink logits (one per head of query [..., heads, seq,
    head_dim], a softmax column of its own that is dropped after), in fp32 up to the probabilities, which are cast to the query's dtype before
    they weigh the values, as HF does. A query that may see no key gets 0, as SDPA gives it
    (without a sink; with one, the sink takes all the probability: 0 too)."""
    scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        # [heads]: one per head; [heads, seq]: one per query token and head
        sink = (sinks.float().reshape(-1, 1, 1) if sinks.dim() == 1 else sinks.float()[..., None])
        sink = sink.expand(*scores.shape[:-1], 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    if allowed is not None:
        probs = torch.where(allowed.any(-1, keepdim=True), probs, 0.0)
    return torch.matmul(probs.to(query.dtype), value)


@cached_attention.register_fake
def _(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
      k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor, cache_starts: torch.Tensor,
      scale: float, window: int | None = None, softcap: float | None = None, interleaved: bool = False,
      q_norm_weight: torch.Tensor | None = None, k_norm_weight: torch.Tensor | None = None,
      qk_norm_eps: float | None = None, qk_norm_offset: float = 0.0, qk_norm_weight_in_fp32: bool = False,
      sinks: torch.Tensor | None = None, alibi_slopes: torch.Tensor | None = None,
      distance_bias: torch.Tensor | None = None, compressed: torch.Tensor | None = None,
      compressed_cache: torch.Tensor | None = None, selected: torch.Tensor | None = None,
      query_starts: torch.Tensor | None = None, k_scale: float | None = None,
      v_scale: float | None = None) -> torch.Tensor:
    return query.new_empty((*query.shape[:3], value.shape[3]))


def _flattened_decodes(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, cache_starts: torch.Tensor, block_tables: torch.Tensor, scale: float,
                       window: int | None, bounds: list[int], out: torch.Tensor | None, scales: KvScales) -> None:
    """Into `out` (None: nothing to do, the attention has a form `_decodes` does not compute),
    the rows of the flattened sequences that bring one token, computed together (`_decodes`)."""
    decodes = [s for s in range(len(bounds) - 1) if bounds[s + 1] - bounds[s] == 1]
    if out is None or not decodes:
        return
    rows, chosen = torch.tensor([bounds[s] for s in decodes]), torch.tensor(decodes)
    out[:, :, rows] = _decodes(query[:, :, rows], key[:, :, rows], value[:, :, rows], k_cache, v_cache,
                               cache_starts[chosen], block_tables[chosen], scale, window, scales)


def _decodes(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
             v_cache: torch.Tensor, cache_starts: torch.Tensor, block_tables: torch.Tensor, scale: float,
             window: int | None, scales: KvScales) -> torch.Tensor:
    """`cached_attention` of sequences that each bring one token (decodes): the new K/V written
    at each one's position, then attention over every sequence's positions gathered to the
    longest, masked by each one's length (and window), rather than a call per sequence. The
    query heads are grouped by the K/V head they read ([seqs, kv_heads, group, d]), so neither
    K nor V is repeated per query head. One SDPA call, masked where a mask is needed: its CPU
    kernel reads the gathered K/V strided, where separate matmuls and a softmax needed them
    copied contiguous (measured on 2 CPU cores, SmolLM2's heads, 4 sequences of 80 tokens:
    240 -> 140 us a layer)."""
    page_size, kv_heads, dk, dv = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3], v_cache.shape[3]
    k_rows, v_rows = k_cache.view(-1, kv_heads, dk), v_cache.view(-1, kv_heads, dv)
    written = block_tables.gather(1, (cache_starts // page_size)[:, None])[:, 0] * page_size + cache_starts % page_size
    _bytes(k_rows).index_copy_(0, written, _bytes(key[0].transpose(0, 1)))
    _bytes(v_rows).index_copy_(0, written, _bytes(value[0].transpose(0, 1)))
    seqs, longest = cache_starts.shape[0], int(cache_starts.max()) + 1
    positions = torch.arange(longest, device=query.device)
    pages = block_tables[:, positions // page_size].clamp(0, k_cache.shape[0] - 1)  # past a sequence: masked
    read = (pages * page_size + positions % page_size).flatten()
    k, v = scales.read(k_rows.index_select(0, read), v_rows.index_select(0, read))
    k = k.view(seqs, longest, kv_heads, dk).transpose(1, 2)
    v = v.view(seqs, longest, kv_heads, dv).transpose(1, 2)
    q = query[0].transpose(0, 1).reshape(seqs, kv_heads, -1, dk)
    # one sequence without a window sees every position gathered: no mask
    seen = None if seqs == 1 and window is None else _keys_seen(cache_starts, longest, window)[:, None, None]
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=seen, scale=scale)
    return out.reshape(seqs, -1, dv).transpose(0, 1)[None]


@_writing_op("cached_mla_attention", mutates_args=("cache",))
def cached_mla_attention(q_nope: torch.Tensor, q_rope: torch.Tensor, latent: torch.Tensor, k_rope: torch.Tensor,
                         kv_b_weight: torch.Tensor, cache: torch.Tensor, block_tables: torch.Tensor,
                         cache_starts: torch.Tensor, scale: float, selected: torch.Tensor | None = None,
                         sinks: torch.Tensor | None = None, query_starts: torch.Tensor | None = None) -> torch.Tensor:
    """`ad.cached_mla_attention`: sequence by sequence (batch row s, or with `query_starts` its
    new tokens `query_starts[s]` .. `query_starts[s + 1]` of the one flattened row, after the
    `cache_starts[s]` it holds) the new latent ++ k_rope written into its pages through its block
    table, then HF's MLA over its positions (`_mla_over_prefix`; with `selected`, only over the
    positions each token's row lists: DeepSeek sparse attention; with `sinks`, a sink column per
    head). The reference reads the metadata on the host."""
    nope = q_nope.shape[3]
    query = torch.cat([q_nope, q_rope], dim=-1)
    new = torch.cat([latent[:, 0], k_rope[:, 0]], dim=-1)
    out = q_nope.new_empty((*q_nope.shape[:3], kv_b_weight.shape[0] // q_nope.shape[1] - nope))
    bounds = None if query_starts is None else query_starts.tolist()
    for s, (start, pages) in enumerate(zip(cache_starts.tolist(), block_tables.tolist(), strict=True)):
        b, rows = (s, slice(None)) if bounds is None else (0, slice(bounds[s], bounds[s + 1]))
        # the pool seen as one kv head ([pages, page_size, 1, rank + rope]), as cached_attention's
        cached = _sequence_positions(cache.unsqueeze(2), pages, start, new[b, rows][None])[:, 0]
        out[b, :, rows] = _mla_over_prefix(query[b, :, rows], cached, kv_b_weight, nope, start, scale,
                                           selected[b] if selected is not None else None, sinks)
    return out


def _mla_over_prefix(query: torch.Tensor, cached: torch.Tensor, kv_b_weight: torch.Tensor, nope: int, start: int,
                     scale: float, selected: torch.Tensor | None, sinks: torch.Tensor | None) -> torch.Tensor:
    """One sequence's MLA as HF computes it: queries [heads, seq, nope + rope] at positions
    start.. over its latents ++ rope keys [start + seq, rank + rope] expanded by `kv_b_weight`
    into each head's k_nope and value (HF's `expand_kv`), the rope key shared by the heads,
    SDPA causal with offset (only the positions `selected` [seq, k] lists, when given); with
    `sinks`, HF's eager attention with a sink column per head."""
    heads, end, rank = query.shape[0], cached.shape[0], kv_b_weight.shape[1]
    kv = torch.nn.functional.linear(cached[:, :rank], kv_b_weight).view(end, heads, -1).transpose(0, 1)
    k_nope, value = kv.split([nope, kv.shape[2] - nope], dim=-1)
    key = torch.cat([k_nope, cached[None, :, rank:].expand(heads, -1, -1)], dim=-1)
    allowed = torch.arange(end, device=query.device)[None, :] <= torch.arange(start, end, device=query.device)[:, None]
    if selected is not None:
        allowed = allowed & _chosen(selected, end)
    if sinks is not None:
        return _eager_attention(query, key, value, allowed, scale, sinks=sinks)
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=allowed, scale=scale)


@cached_mla_attention.register_fake
def _(q_nope: torch.Tensor, q_rope: torch.Tensor, latent: torch.Tensor, k_rope: torch.Tensor,
      kv_b_weight: torch.Tensor, cache: torch.Tensor, block_tables: torch.Tensor, cache_starts: torch.Tensor,
      scale: float, selected: torch.Tensor | None = None, sinks: torch.Tensor | None = None,
      query_starts: torch.Tensor | None = None) -> torch.Tensor:
    return q_nope.new_empty((*q_nope.shape[:3], kv_b_weight.shape[0] // q_nope.shape[1] - q_nope.shape[3]))


def _chosen(selected: torch.Tensor, end: int) -> torch.Tensor:
    """[seq, end] booleans: True at the positions below `end` each row of `selected` [seq, k]
    lists (-1: none)."""
    chosen = torch.zeros(selected.shape[0], end + 1, dtype=torch.bool, device=selected.device)
    outside = (selected < 0) | (selected >= end)
    chosen.scatter_(1, torch.where(outside, end, selected), True)  # the extra column takes what is outside
    return chosen[:, :end]


@_writing_op("cached_index_topk", mutates_args=("cache",))
def cached_index_topk(query: torch.Tensor, key: torch.Tensor, weights: torch.Tensor, cache: torch.Tensor,
                      slots: torch.Tensor, starts: torch.Tensor, scale: float, topk: int) -> torch.Tensor:
    """`ad.cached_index_topk`: each row's new keys written into its cache slot after the keys it
    holds, then HF's indexer scores over the slot's first start + seq positions (fp32: `sum_h w_h
    relu(scale q_h . k_t)`, -inf past each token's own position) and torch.topk of min(topk,
    positions) of them, as HF takes them (so equal scores are kept as HF keeps them on the same
    device); the positions of a -inf score (not causal) and the columns past that count are -1.
    One row at a time: the reference reads each row's slot and start on the host."""
    seq = query.shape[1]
    out = torch.full((*query.shape[:2], topk), -1, dtype=torch.int64, device=query.device)
    for b, (slot, start) in enumerate(zip(slots.tolist(), starts.tolist(), strict=True)):
        end = start + seq
        cache[slot, start:end] = key[b]
        scores = torch.relu(torch.matmul(query[b].float(), cache[slot, :end].float().T) * scale)  # [seq, heads, end]
        index = torch.matmul(weights[b].float()[:, None, :], scores)[:, 0]
        causal = torch.arange(end, device=query.device)[None, :] <= torch.arange(start, end, device=query.device)[:, None]
        best = index.masked_fill(~causal, float("-inf")).topk(min(topk, end), dim=-1)
        out[b, :, :best.indices.shape[1]] = best.indices.masked_fill(best.values == float("-inf"), -1)
    return out


@cached_index_topk.register_fake
def _(query: torch.Tensor, key: torch.Tensor, weights: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor,
      starts: torch.Tensor, scale: float, topk: int) -> torch.Tensor:
    return query.new_empty((*query.shape[:2], topk), dtype=torch.int64)


def by_sequence(rows: Callable[..., torch.Tensor], tokens: Sequence[torch.Tensor | None], axis: int,
                slots: torch.Tensor, starts: torch.Tensor, query_starts: torch.Tensor | None) -> torch.Tensor:
    """`rows(*tokens, slots, starts)` (a state op's batch rows), or with `query_starts` (the paged
    form: one row holding every sequence's tokens along `axis`) sequence by sequence, each as a
    batch row of its own with its slot and start, the results concatenated along `axis`: the
    same computation as the slot form's on that sequence. `tokens`: the per-token operands
    (None where an optional one is absent)."""
    if query_starts is None:
        return rows(*tokens, slots, starts)
    bounds = query_starts.tolist()
    return torch.cat([rows(*(t.narrow(axis, first, last - first) if t is not None else None for t in tokens),
                           slots[s:s + 1], starts[s:s + 1])
                      for s, (first, last) in enumerate(itertools.pairwise(bounds))], dim=axis)


@_writing_op("cached_causal_conv1d", mutates_args=("state",))
def cached_causal_conv1d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, state: torch.Tensor,
                         slots: torch.Tensor, starts: torch.Tensor,
                         query_starts: torch.Tensor | None = None) -> torch.Tensor:
    """`ad.cached_causal_conv1d`: each row's new inputs after its slot's state (zeros at start
    0) through HF's depthwise `conv1d`, the slot left holding the last kernel - 1 inputs. One
    row at a time: the reference reads each row's slot and start on the host (with
    `query_starts`, each sequence's: `by_sequence`)."""
    return by_sequence(lambda x, sl, st: _conv_rows(x, weight, bias, state, sl, st), [input], 2, slots, starts,
                       query_starts)


def _conv_rows(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, state: torch.Tensor,
               slots: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    history = weight.shape[2] - 1
    out = torch.empty_like(input)
    for b, (slot, start) in enumerate(zip(slots.tolist(), starts.tolist(), strict=True)):
        before = state[slot] if start > 0 else torch.zeros_like(state[slot])
        window = torch.cat([before, input[b]], dim=-1)
        out[b] = torch.nn.functional.conv1d(window[None], weight, bias, groups=weight.shape[0])[0]
        state[slot] = window[:, window.shape[-1] - history:]
    return out


@cached_causal_conv1d.register_fake
def _(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, state: torch.Tensor, slots: torch.Tensor,
      starts: torch.Tensor, query_starts: torch.Tensor | None = None) -> torch.Tensor:
    return torch.empty_like(input)


@_writing_op("cached_token_window", mutates_args=("state",))
def cached_token_window(input: torch.Tensor, initial: torch.Tensor | None, state: torch.Tensor, slots: torch.Tensor,
                        starts: torch.Tensor, dim: int, query_starts: torch.Tensor | None = None) -> torch.Tensor:
    """`ad.cached_token_window`: each row's new tokens along `dim` after the `width` rows before
    them (its slot's state, or at start 0 `initial`'s row, zeros without it), the slot left
    holding the last `width` rows; with `query_starts`, each flattened token's row `width` back
    in its own sequence (`_flattened_token_window`). Gathers and writes the slots by index (no
    host sync: a decode step stays capturable in a CUDA graph)."""
    if query_starts is not None:
        return _flattened_token_window(input, initial, state, slots, starts, dim, query_starts)
    width = state.shape[dim]
    before = state.index_select(0, slots)
    fresh = initial.to(before.dtype) if initial is not None else torch.zeros_like(before)
    started = (starts > 0).view(-1, *[1] * (before.dim() - 1))
    window = torch.cat([torch.where(started, before, fresh), input], dim=dim)
    state.index_copy_(0, slots, window.narrow(dim, window.shape[dim] - width, width))
    return window


def _flattened_token_window(input: torch.Tensor, initial: torch.Tensor | None, state: torch.Tensor,
                            slots: torch.Tensor, starts: torch.Tensor, dim: int,
                            query_starts: torch.Tensor) -> torch.Tensor:
    """The paged form of `cached_token_window`, by device indexing: token i, the j-th new one of
    sequence s, reads new token i - width when j >= width, else row j of the rows before s's new
    tokens (its slot, or at start 0 `initial`'s first row or zeros); each slot then gets its
    sequence's last `width` rows of those rows and its new tokens."""
    tokens, rows = input.movedim(dim, 1)[0], state.movedim(dim, 1)  # [T, ...], [slots, width, ...]
    width, n_tokens = rows.shape[1], tokens.shape[0]
    first, ends = query_starts[:-1], query_starts[1:]
    position = torch.arange(n_tokens, device=input.device)
    seq = torch.searchsorted(ends, position, right=True)
    within = position - first[seq]

    def before(s: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Row k (< width) of the rows before sequence s's new tokens."""
        k = k.clamp(max=width - 1)
        fresh = initial.movedim(dim, 1)[0, k].to(rows.dtype) if initial is not None else torch.zeros_like(rows[0, k])
        started = (starts[s] > 0).view(*s.shape, *[1] * (rows.dim() - 2))
        return torch.where(started, rows[slots[s], k], fresh)

    back = (within >= width).view(-1, *[1] * (tokens.dim() - 1))
    out = torch.where(back, tokens[(position - width).clamp(min=0)], before(seq, within))
    k = torch.arange(width, device=input.device)[None, :]
    taken = ends[:, None] - width + k  # the last rows' flattened tokens, where they are new ones
    count = (ends - first)[:, None]
    s = torch.arange(ends.shape[0], device=input.device)[:, None].expand(-1, width)
    held = torch.where((count + k >= width).view(*taken.shape, *[1] * (tokens.dim() - 1)),
                       tokens[taken.clamp(min=0, max=max(n_tokens - 1, 0))], before(s, count + k))
    rows.index_copy_(0, slots, held)
    return out[None].movedim(1, dim)


@cached_token_window.register_fake
def _(input: torch.Tensor, initial: torch.Tensor | None, state: torch.Tensor, slots: torch.Tensor,
      starts: torch.Tensor, dim: int, query_starts: torch.Tensor | None = None) -> torch.Tensor:
    if query_starts is not None:
        return torch.empty_like(input)
    shape = list(input.shape)
    shape[dim] += state.shape[dim]
    return input.new_empty(shape)


def ssm_time_steps(dt: torch.Tensor, dt_bias: torch.Tensor | None, dt_softplus: bool, dt_min: float,
                   dt_max: float | None) -> torch.Tensor:
    """HF's Mamba2 time steps in fp32: dt + dt_bias, softplus, clamped, each step in dt's dtype."""
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = torch.nn.functional.softplus(dt)
    return torch.clamp(dt, min=dt_min, max=dt_max).float()


@_writing_op("cached_ssm_scan", mutates_args=("state",))
def cached_ssm_scan(input: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
                    d: torch.Tensor | None, dt_bias: torch.Tensor | None, state: torch.Tensor, slots: torch.Tensor,
                    starts: torch.Tensor, query_starts: torch.Tensor | None = None, dt_softplus: bool = False,
                    dt_min: float = 0.0, dt_max: float | None = None) -> torch.Tensor:
    """`ad.cached_ssm_scan`: Mamba2's recurrence token by token (HF's one-token
    `selective_state_update` repeated) from each row's slot state (zeros at start 0), in fp32,
    the slot left holding the state after the last token. One row at a time: the reference reads
    each row's slot and start on the host (with `query_starts`, each sequence's: `by_sequence`)."""
    def rows(input: torch.Tensor, dt: torch.Tensor, b: torch.Tensor, c: torch.Tensor, slots: torch.Tensor,
             starts: torch.Tensor) -> torch.Tensor:
        return _ssm_scan_rows(input, dt, a, b, c, d, dt_bias, state, slots, starts, dt_softplus, dt_min, dt_max)

    return by_sequence(rows, [input, dt, b, c], 1, slots, starts, query_starts)


def _ssm_scan_rows(input: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
                   d: torch.Tensor | None, dt_bias: torch.Tensor | None, state: torch.Tensor, slots: torch.Tensor,
                   starts: torch.Tensor, dt_softplus: bool, dt_min: float, dt_max: float | None) -> torch.Tensor:
    heads, groups = input.shape[2], b.shape[2]
    steps = ssm_time_steps(dt, dt_bias, dt_softplus, dt_min, dt_max)
    x = input.float()
    b, c = (v.float().repeat_interleave(heads // groups, dim=2) for v in (b, c))
    a = a.float()[:, None, None]
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    for row, (slot, start) in enumerate(zip(slots.tolist(), starts.tolist(), strict=True)):
        h = state[slot] if start > 0 else torch.zeros_like(state[slot])
        for t in range(x.shape[1]):
            step = steps[row, t][:, None, None]
            h = h * torch.exp(step * a) + (step * x[row, t, :, :, None]) * b[row, t, :, None, :]
            out[row, t] = (h * c[row, t, :, None, :]).sum(-1)
        state[slot] = h
    if d is not None:
        out += d.float()[:, None] * x
    return out


@cached_ssm_scan.register_fake
def _(input: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor | None,
      dt_bias: torch.Tensor | None, state: torch.Tensor, slots: torch.Tensor, starts: torch.Tensor,
      query_starts: torch.Tensor | None = None, dt_softplus: bool = False, dt_min: float = 0.0,
      dt_max: float | None = None) -> torch.Tensor:
    return input.new_empty(input.shape, dtype=torch.float32)


@_writing_op("cached_selective_scan", mutates_args=("state",))
def cached_selective_scan(input: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
                          d: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None,
                          state: torch.Tensor, slots: torch.Tensor, starts: torch.Tensor,
                          query_starts: torch.Tensor | None = None, dt_softplus: bool = False) -> torch.Tensor:
    """`ad.cached_selective_scan`: Mamba1's recurrence token by token (HF's one-token
    `mamba_selective_state_update` repeated) from each row's slot state (zeros at start 0), in
    fp32, the slot left holding the state after the last token. One row at a time: the reference
    reads each row's slot and start on the host (with `query_starts`, each sequence's:
    `by_sequence`)."""
    def rows(input: torch.Tensor, dt: torch.Tensor, b: torch.Tensor, c: torch.Tensor, z: torch.Tensor | None,
             slots: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
        return _selective_scan_rows(input, dt, a, b, c, d, z, dt_bias, state, slots, starts, dt_softplus)

    return by_sequence(rows, [input, dt, b, c, z], 2, slots, starts, query_starts)


def _selective_scan_rows(input: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
                         d: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None,
                         state: torch.Tensor, slots: torch.Tensor, starts: torch.Tensor,
                         dt_softplus: bool) -> torch.Tensor:
    steps = dt if dt_bias is None else dt + dt_bias.to(dt.dtype)[:, None]
    if dt_softplus:
        steps = torch.nn.functional.softplus(steps)
    steps, x, a, b, c = steps.float(), input.float(), a.float(), b.float(), c.float()
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    for row, (slot, start) in enumerate(zip(slots.tolist(), starts.tolist(), strict=True)):
        h = state[slot] if start > 0 else torch.zeros_like(state[slot])
        for t in range(x.shape[2]):
            step = steps[row, :, t, None]
            h = h * torch.exp(step * a) + (step * x[row, :, t, None]) * b[row, None, :, t]
            out[row, :, t] = h @ c[row, :, t]
        state[slot] = h
    if d is not None:
        out += d.float()[:, None] * x
    if z is not None:
        out = out * torch.nn.functional.silu(z.float())
    return out.to(_selective_scan_dtype(input, d))


def _selective_scan_dtype(input: torch.Tensor, d: torch.Tensor | None) -> torch.dtype:
    """HF's scan output dtype: the input's, promoted by D's (fp32 in Mamba's call)."""
    return torch.promote_types(input.dtype, d.dtype) if d is not None else input.dtype


@cached_selective_scan.register_fake
def _(input: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
      d: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None, state: torch.Tensor,
      slots: torch.Tensor, starts: torch.Tensor, query_starts: torch.Tensor | None = None,
      dt_softplus: bool = False) -> torch.Tensor:
    return input.new_empty(input.shape, dtype=_selective_scan_dtype(input, d))


@_writing_op("cached_rg_lru", mutates_args=("state",))
def cached_rg_lru(input: torch.Tensor, a: torch.Tensor, state: torch.Tensor, slots: torch.Tensor,
                  starts: torch.Tensor, query_starts: torch.Tensor | None = None) -> torch.Tensor:
    """`ad.cached_rg_lru`: HF's RG-LRU step h = a_t h + x_t token by token from each row's slot
    state (zeros at start 0), in fp32, the slot left holding the state after the last token. One
    row at a time: the reference reads each row's slot and start on the host (with
    `query_starts`, each sequence's: `by_sequence`)."""
    return by_sequence(lambda x, g, sl, st: _rg_lru_rows(x, g, state, sl, st), [input, a], 1, slots, starts,
                       query_starts)


def _rg_lru_rows(x: torch.Tensor, a: torch.Tensor, state: torch.Tensor, slots: torch.Tensor,
                 starts: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    for row, (slot, start) in enumerate(zip(slots.tolist(), starts.tolist(), strict=True)):
        h = state[slot] if start > 0 else torch.zeros_like(state[slot])
        for t in range(x.shape[1]):
            h = a[row, t].float() * h + x[row, t].float()
            out[row, t] = h.to(x.dtype)
        state[slot] = h
    return out


@cached_rg_lru.register_fake
def _(input: torch.Tensor, a: torch.Tensor, state: torch.Tensor, slots: torch.Tensor, starts: torch.Tensor,
      query_starts: torch.Tensor | None = None) -> torch.Tensor:
    return torch.empty_like(input)


@_writing_op("cached_wkv", mutates_args=("state",))
def cached_wkv(w: torch.Tensor, u: torch.Tensor, key: torch.Tensor, value: torch.Tensor, state: torch.Tensor,
               slots: torch.Tensor, starts: torch.Tensor, query_starts: torch.Tensor | None = None) -> torch.Tensor:
    """`ad.cached_wkv`: HF's WKV step token by token from each row's slot state (num, den, max;
    an empty state at start 0), in fp32, the slot left holding the state after the last token.
    One row at a time: the reference reads each row's slot and start on the host (with
    `query_starts`, each sequence's: `by_sequence`)."""
    return by_sequence(lambda k, v, sl, st: _wkv_rows(w, u, k, v, state, sl, st), [key, value], 1, slots, starts,
                       query_starts)


def _wkv_rows(w: torch.Tensor, u: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: torch.Tensor,
              slots: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(k)
    for row, (slot, start) in enumerate(zip(slots.tolist(), starts.tolist(), strict=True)):
        before = state[slot:slot + 1] if start > 0 else _wkv_empty_state(k[row:row + 1, 0])
        state[slot] = _wkv_tokens(w, u, k[row:row + 1], v[row:row + 1], before, out[row:row + 1])[0]
    return out


@cached_wkv.register_fake
def _(w: torch.Tensor, u: torch.Tensor, key: torch.Tensor, value: torch.Tensor, state: torch.Tensor,
      slots: torch.Tensor, starts: torch.Tensor, query_starts: torch.Tensor | None = None) -> torch.Tensor:
    return torch.empty_like(key)


L2NORM_EPS = 1e-6
"""HF's (and FLA's) `l2norm` epsilon in the gated delta rule."""


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2NORM_EPS)


@_writing_op("cached_gated_delta_rule", mutates_args=("state",))
def cached_gated_delta_rule(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                            beta: torch.Tensor, state: torch.Tensor, slots: torch.Tensor, starts: torch.Tensor,
                            query_starts: torch.Tensor | None = None, use_qk_l2norm: bool = False) -> torch.Tensor:
    """`ad.cached_gated_delta_rule`: HF's `torch_recurrent_gated_delta_rule` token by token from
    each row's slot state (zeros at start 0), in fp32, the slot left holding the state after the
    last token. One row at a time: the reference reads each row's slot and start on the host
    (with `query_starts`, each sequence's: `by_sequence`)."""
    def rows(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
             slots: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
        return _gated_delta_rule_rows(query, key, value, g, beta, state, slots, starts, use_qk_l2norm)

    return by_sequence(rows, [query, key, value, g, beta], 1, slots, starts, query_starts)


def _gated_delta_rule_rows(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                           beta: torch.Tensor, state: torch.Tensor, slots: torch.Tensor, starts: torch.Tensor,
                           use_qk_l2norm: bool) -> torch.Tensor:
    groups = value.shape[2] // key.shape[2]
    q, k = (x.float().repeat_interleave(groups, dim=2) for x in (query, key))
    if use_qk_l2norm:
        q, k = _l2norm(q), _l2norm(k)
    q = q * q.shape[-1] ** -0.5
    v, decay, beta = value.float(), g.float().exp(), beta.float()
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    for row, (slot, start) in enumerate(zip(slots.tolist(), starts.tolist(), strict=True)):
        s = state[slot] if start > 0 else torch.zeros_like(state[slot])
        for t in range(v.shape[1]):
            s = s * decay[row, t, :, None, None]
            delta = (v[row, t] - (s * k[row, t, :, :, None]).sum(-2)) * beta[row, t, :, None]
            s = s + k[row, t, :, :, None] * delta[:, None, :]
            out[row, t] = (s * q[row, t, :, :, None]).sum(-2)
        state[slot] = s
    return out.to(query.dtype)


@cached_gated_delta_rule.register_fake
def _(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
      state: torch.Tensor, slots: torch.Tensor, starts: torch.Tensor, query_starts: torch.Tensor | None = None,
      use_qk_l2norm: bool = False) -> torch.Tensor:
    return value.new_empty(value.shape, dtype=query.dtype)


SEQUENCE_MIXER_FUNCTIONS: dict[tuple[str, str], Callable[..., Any]] = {}
"""(transformers module, function name) -> HF's own function, for the opaque ops below: set by
`frontends/export_patches.py` when it routes a module's function through one of them."""


def _hf_function(module: str, name: str) -> Callable[..., Any]:
    if (module, name) not in SEQUENCE_MIXER_FUNCTIONS:
        SEQUENCE_MIXER_FUNCTIONS[module, name] = getattr(importlib.import_module(module), name)
    return SEQUENCE_MIXER_FUNCTIONS[module, name]


@torch.library.custom_op(f"{NAMESPACE}::mamba2_chunk_scan", mutates_args=())
def mamba2_chunk_scan(module: str, hidden_states: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,  # noqa: N803
                      B: torch.Tensor, C: torch.Tensor, chunk_size: int, D: torch.Tensor | None,  # noqa: N803
                      dt_bias: torch.Tensor | None, dt_softplus: bool, dt_min: float, dt_max: float) -> torch.Tensor:
    """HF's `mamba2_chunk_scan` of `module` (no initial state, no final state returned): the
    Mamba2 state-space scan over the whole sequence, opaque to torch.export (its chunk loop
    would fix the sequence length). [batch, seq, heads, head_dim] in fp32."""
    return _hf_function(module, "mamba2_chunk_scan")(
        hidden_states, dt, A, B, C, chunk_size, D=D, dt_bias=dt_bias, dt_softplus=dt_softplus,
        dt_limit=(dt_min, dt_max))


@mamba2_chunk_scan.register_fake
def _(module: str, hidden_states: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,  # noqa: N803
      C: torch.Tensor, chunk_size: int, D: torch.Tensor | None, dt_bias: torch.Tensor | None,  # noqa: N803
      dt_softplus: bool, dt_min: float, dt_max: float) -> torch.Tensor:
    return hidden_states.new_empty(hidden_states.shape, dtype=torch.float32)


@torch.library.custom_op(f"{NAMESPACE}::chunk_gated_delta_rule", mutates_args=())
def chunk_gated_delta_rule(module: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           g: torch.Tensor, beta: torch.Tensor, chunk_size: int,
                           use_qk_l2norm_in_kernel: bool) -> torch.Tensor:
    """HF's `torch_chunk_gated_delta_rule` of `module` (no initial state, no final state
    returned): the gated delta rule over the whole sequence, opaque to torch.export (its chunk
    loop would fix the sequence length). [batch, seq, value heads, value head_dim] in the
    query's dtype."""
    out, _ = _hf_function(module, "torch_chunk_gated_delta_rule")(
        query, key, value, g=g, beta=beta, chunk_size=chunk_size, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    return out


@chunk_gated_delta_rule.register_fake
def _(module: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
      chunk_size: int, use_qk_l2norm_in_kernel: bool) -> torch.Tensor:
    return value.new_empty(value.shape, dtype=query.dtype)


@torch.library.custom_op(f"{NAMESPACE}::selective_scan", mutates_args=())
def selective_scan(module: str, hidden_states: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,  # noqa: N803
                   B: torch.Tensor, C: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None,  # noqa: N803
                   delta_bias: torch.Tensor | None, delta_softplus: bool) -> torch.Tensor:
    """HF's `mamba_selective_scan` of `module` (Mamba1: [batch, channels, seq] x and dt, A
    [channels, state], B and C [batch, state, seq]; no final state returned): the selective scan
    over the whole sequence, opaque to torch.export (its loop over time steps would fix the
    sequence length)."""
    return _hf_function(module, "mamba_selective_scan")(hidden_states, dt, A, B, C, D=D, z=z, delta_bias=delta_bias,
                                                         delta_softplus=delta_softplus)


@selective_scan.register_fake
def _(module: str, hidden_states: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,  # noqa: N803
      C: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None, delta_bias: torch.Tensor | None,  # noqa: N803
      delta_softplus: bool) -> torch.Tensor:
    return hidden_states.new_empty(hidden_states.shape, dtype=_selective_scan_dtype(hidden_states, D))


@torch.library.custom_op(f"{NAMESPACE}::rg_lru_scan", mutates_args=())
def rg_lru_scan(x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """RecurrentGemma's RG-LRU recurrence over the whole sequence from a zero state (HF's
    `RecurrentGemmaRglru._rnn_scan` without a cache): per channel h_t = a_t h_{t-1} + x_t in fp32,
    x and a [batch, seq, width] (a already 0 where a sequence restarts), the result in x's dtype.
    Opaque to torch.export (HF's loop over time steps would fix the sequence length)."""
    h = torch.zeros(x[:, 0].shape, dtype=torch.float32, device=x.device)
    out = torch.empty_like(x)
    for t in range(x.shape[1]):
        h = a[:, t].float() * h + x[:, t].float()
        out[:, t] = h.to(x.dtype)
    return out


@rg_lru_scan.register_fake
def _(x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op(f"{NAMESPACE}::wkv_scan", mutates_args=())
def wkv_scan(w: torch.Tensor, u: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """RWKV's time mixing (the WKV recurrence, HF's `rwkv_linear_attention_cpu` without a state)
    over the whole sequence from an empty state: w [width] the decay per channel, already
    `-exp(time_decay)`, u [width] the bonus of the current token (`time_first`), k and v
    [batch, seq, width]; per channel, with a running maximum p for stability,
    out_t = (e^(p-q) a + e^(u+k_t-q) v_t) / (e^(p-q) b + e^(u+k_t-q)), q = max(p, u + k_t), then
    a, b <- e^(p+w-p') a + e^(k_t-p') v_t, e^(p+w-p') b + e^(k_t-p'), p' = max(p + w, k_t), in
    fp32 (HF's order of operations), the result in k's dtype. Opaque to torch.export (HF's loop
    over time steps would fix the sequence length)."""
    out = torch.zeros_like(k)
    _wkv_tokens(w, u, k, v, _wkv_empty_state(k[:, 0]), out)
    return out


WKV_EMPTY_MAX = -1e38
"""The running maximum of an empty WKV state (HF's `max_state`: zeros - 1e38; its num and den are 0)."""


def _wkv_empty_state(like: torch.Tensor) -> torch.Tensor:
    """[*like.shape[:-1], 3, width] fp32: num, den, max of no token."""
    state = torch.zeros((*like.shape[:-1], 3, like.shape[-1]), dtype=torch.float32, device=like.device)
    state[..., 2, :] = WKV_EMPTY_MAX
    return state


def _wkv_tokens(w: torch.Tensor, u: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: torch.Tensor,
                out: torch.Tensor) -> torch.Tensor:
    """HF's WKV loop over k's and v's tokens (axis 1) from `state` [batch, 3, width] (num, den,
    max), each token's output written to `out`; returns the state after the last token."""
    num, den, top = state.unbind(-2)
    for t in range(k.shape[1]):
        key, value = k[:, t].float(), v[:, t]
        q = torch.maximum(top, key + u)
        e1, e2 = torch.exp(top - q), torch.exp(key + u - q)
        out[:, t] = ((e1 * num + e2 * value) / (e1 * den + e2)).to(out.dtype)
        q = torch.maximum(top + w, key)
        e1, e2 = torch.exp(top + w - q), torch.exp(key - q)
        num, den, top = e1 * num + e2 * value, e1 * den + e2, q
    return torch.stack([num, den, top], dim=-2)


@wkv_scan.register_fake
def _(w: torch.Tensor, u: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(k)


SEQUENCE_MIXER_OPS = frozenset(f"{NAMESPACE}.{name}.default"
                               for name in ("mamba2_chunk_scan", "chunk_gated_delta_rule", "selective_scan",
                                            "rg_lru_scan",
                                            "wkv_scan"))
"""The opaque scans above: each mixes every position of the sequence; `insert-cached-attention`
replaces them by their cached ops (`cached_ssm_scan`, `cached_gated_delta_rule`, `cached_selective_scan`,
`cached_rg_lru`, `cached_wkv`)."""


REFERENCE_OPS = frozenset(
    f"{NAMESPACE}.{name}.default"
    for name in ("rms_norm", "add_rms_norm", "silu_and_mul", "quantize_fp8", "quantize_fp8_dynamic", "dequantize_fp8",
                 "linear_fp8", "linear_fp8_block", "linear_int4", "rope", "rope_attention", "cached_attention", "cached_causal_conv1d",
                 "cached_token_window",
                 "layer_norm", "add_layer_norm", "moe", "gelu_and_mul", "activation",
                 "cached_ssm_scan", "cached_gated_delta_rule", "cached_mla_attention", "cached_index_topk",
                 "cached_selective_scan",
                 "cached_rg_lru",
                 "cached_wkv",
                 "linear_nvfp4")
)
"""The `str` of each reference op's overload: `ad_mlir.*` call targets that are not kernels."""
