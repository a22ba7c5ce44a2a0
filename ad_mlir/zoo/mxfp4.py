"""MXFP4 checkpoints as gpt-oss ships them (its MoE experts quantized, everything else bf16): the
format's arithmetic in torch, gpt-oss's experts on it, a writer that makes such a checkpoint from a
small gpt-oss, and the loader `checkpoints.load_checkpoint` calls.

The format (transformers' `Mxfp4Config`, `integrations/mxfp4.py`): config.json holds
`quantization_config = {"quant_method": "mxfp4", "modules_to_not_convert": [...]}`; in the
safetensors each quantized experts module (`model.layers.N.mlp.experts`) has, for `gate_up_proj`
([E, 2I, H] as [out, in]: gate and up rows interleaved, gate first) and `down_proj` ([E, H, I]),
`<proj>_blocks` uint8 [E, out, in / 32, 16] (32 E2M1 codes per block, two per byte, `zoo/fp4.py`)
and `<proj>_scales` uint8 [E, out, in / 32] (E8M0: the block's scale is 2^(s - 127)), beside its
`<proj>_bias` [E, out] in the model's dtype. The weight is `e2m1 * 2^(s - 127)`, exact in any
float dtype of 8 exponent bits.

Loaded here, a quantized experts module is an `Mxfp4Experts` keeping the bytes and scales as
uint8 parameters (a dtype cast of the model leaves integer tensors alone); its forward
dequantizes the routed experts and computes gpt-oss's expert math (`gpt_oss_experts`), what
`ad.moe_mxfp4`'s reference runs after gpt-oss's routing. transformers' own loader cannot keep them
on a CPU: there it dequantizes to the model's dtype (the tests' reference). Imports nothing of
the compiler.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import transformers

from ad_mlir.zoo import fp4
from ad_mlir.zoo.quantized import (
    assign_tensors,
    has_submodule,
    model_on_meta,
    parameters_on_meta,
    read_safetensors,
    save_checkpoint,
)

QUANT_METHOD = "mxfp4"
MODEL_TYPE = "gpt_oss"
FIELDS = ("quant_method", "modules_to_not_convert")
"""What an mxfp4 `quantization_config` holds (`Mxfp4Config.to_dict()`)."""
NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]
"""gpt-oss's `modules_to_not_convert`: only the experts are MXFP4."""
BLOCK = 32
"""Elements per scale (the MX block)."""
E8M0_BIAS = 127
E8M0_NAN = 255
E2M1_EMAX = 2
"""The exponent of E2M1's largest power of two (4): a block's scale is 2^(floor(log2 amax) - 2)."""
PROJECTIONS = ("gate_up_proj", "down_proj")


def _refuse(field: str, value: Any, why: str) -> ValueError:
    return ValueError(f"quantization_config.{field} = {json.dumps(value)}: {why}")


def check_mxfp4_config(quantization_config: dict[str, Any], model_type: str) -> None:
    """A ValueError naming the field and its value unless `quantization_config` is mxfp4 as gpt-oss
    writes it: another field than `FIELDS`, `modules_to_not_convert` not a list of names, or a
    model other than gpt-oss (whose experts alone transformers quantizes in this format)."""
    for field, value in quantization_config.items():
        if field not in FIELDS:
            raise _refuse(field, value, f"not supported; an mxfp4 quantization_config holds {' and '.join(FIELDS)}")
    skipped = quantization_config.get("modules_to_not_convert")
    if skipped is not None and not (isinstance(skipped, list) and all(isinstance(s, str) for s in skipped)):
        raise _refuse("modules_to_not_convert", skipped, "must be a list of module names")
    if model_type != MODEL_TYPE:
        raise _refuse("quant_method", QUANT_METHOD, f"ad-mlir loads MXFP4 for gpt_oss's experts only (as transformers "
                                                    f"does), not for {model_type}")


def mx_quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`weight` [..., K] (K a multiple of 32) as (blocks uint8 [..., K / 32, 16], scales uint8
    [..., K / 32]): each block of 32 scaled by 2^(floor(log2 amax) - 2) (the OCP MX rule: amax
    lands in [4, 8), values beyond 6 saturate), an all-zero block by 2^-127, the scaled values
    rounded to the nearest E2M1 value, ties to even."""
    if weight.shape[-1] % BLOCK:
        raise ValueError(f"MXFP4 quantizes rows of a multiple of {BLOCK} elements, not {weight.shape[-1]}")
    w = weight.detach().float().unflatten(-1, (-1, BLOCK))
    amax = w.abs().amax(-1)
    exponent = torch.frexp(amax).exponent - 1 - E2M1_EMAX  # frexp: amax = m * 2^e, m in [0.5, 1)
    exponent = torch.where(amax > 0, exponent, -E8M0_BIAS).clamp(-E8M0_BIAS, E8M0_BIAS)
    codes = fp4.round_to_codes(torch.ldexp(w, -exponent[..., None]))
    return fp4.pack_codes(codes), (exponent + E8M0_BIAS).to(torch.uint8)


def mx_dequantize(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[..., G, 16] codes and [..., G] E8M0 scales -> the weight [..., 32 G] in `dtype`."""
    values = fp4.decode(blocks)
    return torch.ldexp(values, scales.to(torch.int32)[..., None] - E8M0_BIAS).flatten(-2).to(dtype)


def gpt_oss_route(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, experts) [tokens, top_k] as `GptOssTopKRouter` computes them: the top-k logits,
    their softmax in the logits' dtype."""
    values, experts = torch.topk(router_logits, top_k, dim=-1)
    return torch.softmax(values, dim=-1, dtype=values.dtype), experts


def gpt_oss_experts(hidden_states: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor,
                    gate_up_blocks: torch.Tensor, gate_up_scales: torch.Tensor, gate_up_bias: torch.Tensor,
                    down_blocks: torch.Tensor, down_scales: torch.Tensor, down_bias: torch.Tensor,
                    alpha: float, limit: float) -> torch.Tensor:
    """gpt-oss's experts on MXFP4 weights, in the activations' dtype, as transformers' grouped
    form computes them on the dequantized weights: for each (token, slot) pair of `experts`
    [tokens, k], `gate_up = x @ W.T + b` (rounded, then the bias), gate and up the even and odd
    columns, `gate = min(gate, limit)`, `up = clamp(up, -limit, limit)`, `h = (up + 1) * gate *
    sigmoid(alpha * gate)`, `y = h @ D.T + d`, times the pair's weight; a token's k products summed.
    Each expert is dequantized only when some token is routed to it."""
    pairs = hidden_states.new_zeros((*experts.shape, hidden_states.shape[-1]))
    for e in range(gate_up_blocks.shape[0]):
        tokens, slots = torch.where(experts == e)
        if tokens.numel() == 0:
            continue
        gate_up = hidden_states[tokens] @ mx_dequantize(gate_up_blocks[e], gate_up_scales[e], hidden_states.dtype).T
        gate_up = gate_up + gate_up_bias[e]
        gate, up = gate_up[..., ::2].clamp(max=limit), gate_up[..., 1::2].clamp(min=-limit, max=limit)
        h = (up + 1) * (gate * torch.sigmoid(gate * alpha))
        y = h @ mx_dequantize(down_blocks[e], down_scales[e], hidden_states.dtype).T + down_bias[e]
        pairs[tokens, slots] = y * weights[tokens, slots, None]
    return pairs.sum(dim=1).to(hidden_states.dtype)


def moe_mxfp4(input: torch.Tensor, router_logits: torch.Tensor, gate_up_blocks: torch.Tensor,
              gate_up_scales: torch.Tensor, gate_up_bias: torch.Tensor, down_blocks: torch.Tensor,
              down_scales: torch.Tensor, down_bias: torch.Tensor, top_k: int, alpha: float,
              limit: float) -> torch.Tensor:
    """gpt-oss's MoE block on MXFP4 experts from the router's logits: `gpt_oss_route`, then
    `gpt_oss_experts` (what `ad.moe_mxfp4` computes)."""
    weights, experts = gpt_oss_route(router_logits, top_k)
    return gpt_oss_experts(input, experts, weights, gate_up_blocks, gate_up_scales, gate_up_bias, down_blocks,
                           down_scales, down_bias, alpha, limit)


def _quantized(shape: tuple[int, ...]) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.empty(shape, dtype=torch.uint8), requires_grad=False)


class Mxfp4Experts(torch.nn.Module):
    """gpt-oss's experts (`GptOssExperts`) with the checkpoint's MXFP4 tensors as parameters, under
    the checkpoint's names: `<proj>_blocks` and `<proj>_scales` uint8 (a dtype cast of the model
    leaves them), `<proj>_bias` in the model's dtype. Its forward is `gpt_oss_experts`; the export
    routes the MoE block around it through `ad.moe_mxfp4` (`frontends/export_patches.py`)."""

    def __init__(self, experts: int, hidden: int, intermediate: int, alpha: float, limit: float) -> None:
        super().__init__()
        self.num_experts, self.hidden_size, self.intermediate_size = experts, hidden, intermediate
        self.alpha, self.limit = alpha, limit
        self.gate_up_proj_blocks = _quantized((experts, 2 * intermediate, hidden // BLOCK, BLOCK // 2))
        self.gate_up_proj_scales = _quantized((experts, 2 * intermediate, hidden // BLOCK))
        self.gate_up_proj_bias = torch.nn.Parameter(torch.empty(experts, 2 * intermediate))
        self.down_proj_blocks = _quantized((experts, hidden, intermediate // BLOCK, BLOCK // 2))
        self.down_proj_scales = _quantized((experts, hidden, intermediate // BLOCK))
        self.down_proj_bias = torch.nn.Parameter(torch.empty(experts, hidden))

    def operands(self) -> tuple[torch.Tensor, ...]:
        """The six tensors in `ad.moe_mxfp4`'s operand order."""
        return (self.gate_up_proj_blocks, self.gate_up_proj_scales, self.gate_up_proj_bias, self.down_proj_blocks,
                self.down_proj_scales, self.down_proj_bias)

    def forward(self, hidden_states: torch.Tensor, router_indices: torch.Tensor,
                routing_weights: torch.Tensor) -> torch.Tensor:
        return gpt_oss_experts(hidden_states, router_indices, routing_weights, *self.operands(), self.alpha,
                               self.limit)


def _experts_modules(model: torch.nn.Module) -> list[str]:
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    return [name for name, module in model.named_modules() if isinstance(module, GptOssExperts)]


def write_mxfp4_checkpoint(model: transformers.PreTrainedModel, directory: str | Path) -> Path:
    """Write a gpt-oss `model` to `directory` as gpt-oss ships it (see the module docstring): each
    experts module's gate_up_proj and down_proj as MXFP4 blocks and scales (`mx_quantize` of the
    [E, out, in] weight), every other tensor in the model's dtype; config.json with
    `quantization_config = {"quant_method": "mxfp4", "modules_to_not_convert": NOT_CONVERTED}`."""
    config = {"quant_method": QUANT_METHOD, "modules_to_not_convert": list(NOT_CONVERTED)}
    check_mxfp4_config(config, model.config.model_type)
    tensors = {name: t.detach().contiguous() for name, t in model.state_dict().items()}
    for name in _experts_modules(model):
        for proj in PROJECTIONS:
            weight = tensors.pop(f"{name}.{proj}").transpose(1, 2)  # HF keeps [E, in, out]
            tensors[f"{name}.{proj}_blocks"], tensors[f"{name}.{proj}_scales"] = mx_quantize(weight)
    return save_checkpoint(model, Path(directory), tensors, config)


def _check_experts(directory: Path, name: str, tensors: dict[str, torch.Tensor], experts: int, hidden: int,
                   intermediate: int) -> None:
    """A ValueError naming the tensor unless `name`'s blocks and scales have the dtype and shape of
    experts of these sizes, and no scale is E8M0's NaN."""
    for proj, (out, k) in zip(PROJECTIONS, ((2 * intermediate, hidden), (hidden, intermediate)), strict=True):
        if k % BLOCK:
            raise ValueError(f"'{directory}': {name}.{proj} has {k} input features, not a multiple of the MX "
                             f"block ({BLOCK})")
        for suffix, shape in (("_blocks", (experts, out, k // BLOCK, BLOCK // 2)), ("_scales", (experts, out, k // BLOCK))):
            key = f"{name}.{proj}{suffix}"
            t = tensors.get(key)
            if t is None or t.dtype != torch.uint8 or tuple(t.shape) != shape:
                got = "missing" if t is None else f"{t.dtype} {list(t.shape)}"
                raise ValueError(f"'{directory}': {key} is {got}, expected uint8 {list(shape)}")
        if (tensors[f"{name}.{proj}_scales"] == E8M0_NAN).any():
            raise ValueError(f"'{directory}': {name}.{proj}_scales holds {E8M0_NAN} (E8M0's NaN)")


def load_mxfp4_checkpoint(directory: Path, config: transformers.PretrainedConfig) -> transformers.PreTrainedModel:
    """The gpt-oss model of `config` (its quantization_config dropped: no transformers quantizer
    runs) with the checkpoint's tensors: each experts module that has `gate_up_proj_blocks` becomes
    an `Mxfp4Experts` keeping the bytes and scales (an experts module without them, one of
    `modules_to_not_convert`, loads as it is); a quantized tensor of the wrong dtype or shape, a
    NaN scale, a tensor the model lacks or a parameter the file lacks is a ValueError naming it."""
    tensors = read_safetensors(directory)
    model = model_on_meta(config)
    suffix = f".{PROJECTIONS[0]}_blocks"
    for key in sorted(k for k in tensors if k.endswith(suffix)):
        name = key.removesuffix(suffix)
        if name not in _experts_modules(model):
            raise ValueError(f"'{directory}': {key} quantizes {name}, which is not an experts module of "
                             f"{type(model).__name__}" + ("" if has_submodule(model, name) else " (no such module)"))
        sizes = (config.num_local_experts, config.hidden_size, config.intermediate_size)
        _check_experts(directory, name, tensors, *sizes)
        with parameters_on_meta():
            model.set_submodule(name, Mxfp4Experts(*sizes, config.swiglu_alpha, config.swiglu_limit))
    return assign_tensors(directory, model, tensors)


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m ad_mlir.zoo.mxfp4 gpt_oss DIRECTORY [--layers N] [--dtype D]`: a small random
    gpt-oss (as `--model gpt_oss` builds it) written to DIRECTORY as an MXFP4 checkpoint."""
    import argparse

    from ad_mlir.zoo.checkpoints import named_model
    from ad_mlir.zoo.tiny import DTYPES

    parser = argparse.ArgumentParser(prog="python -m ad_mlir.zoo.mxfp4", description=main.__doc__)
    parser.add_argument("model", help="a gpt_oss model: the type (built small) or a checkpoint directory")
    parser.add_argument("directory")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--dtype", choices=DTYPES, default="bfloat16",
                        help="of the tensors left unquantized (default: bfloat16, as released checkpoints)")
    args = parser.parse_args(argv)
    print(write_mxfp4_checkpoint(named_model(args.model, args.dtype, args.layers), args.directory))


if __name__ == "__main__":
    main()
