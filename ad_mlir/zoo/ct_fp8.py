"""compressed-tensors FP8 checkpoints ("FP8-dynamic", as Red Hat / Neural Magic ship them, written
by llm-compressor): the format's arithmetic in torch, a writer that makes one from a small model,
and the loader `checkpoints.load_checkpoint` calls.

The format: config.json holds `quantization_config = {"quant_method": "compressed-tensors",
"format": "float-quantized", "config_groups": {"group_0": {"targets": ["Linear"], "weights":
{"num_bits": 8, "type": "float", "strategy": "channel" | "tensor", "symmetric": true, "dynamic":
false, ...}, "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
"dynamic": true, "symmetric": true, ...}}}, "ignore": ["lm_head"], ...}`; in the safetensors each
quantized linear has `<name>.weight` in float8_e4m3fn [N, K] and `<name>.weight_scale` [N, 1]
(channel) or [1] (tensor), in the model's dtype as compressed-tensors computes it (`amax / 448`
of the row or the tensor). At run time each token (row) of the input is quantized with
`s = amax(|row|) / 448`; the GEMM multiplies the fp8 operands, times `s` and the weight's scale.

Loaded here, a quantized linear is an `Fp8ChannelLinear` whose fp8 weight and float32 scale
(the file's scale widened, exactly) keep their dtypes through `model.to(dtype)`, as the
fine-grained loader's `Fp8BlockLinear` does. The export routes its forward through
`ad.quantize_fp8_dynamic` (per token) and `ad.linear_fp8` (`frontends/export_patches.py`),
whose references compute exactly this module's forward. Imports nothing of the compiler.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import transformers

from ad_mlir.zoo.quantized import (
    KeepsQuantizedTensors,
    linear_names,
    load_with_quantized_linears,
    module_name,
    read_safetensors,
    save_checkpoint,
)

QUANT_METHOD = "compressed-tensors"
FP8_MAX = 448.0
"""The largest finite float8_e4m3fn value."""
MIN_AMAX = 1e-12
"""A token's scale is max(amax, this) / 448, as `ad.quantize_fp8_dynamic` computes it: an all-zero
row quantizes to 0 (compressed-tensors replaces a 0 scale by its dtype's eps, which also gives 0)."""
WEIGHT_STRATEGIES = ("channel", "tensor")
SCALE_SUFFIX = ".weight_scale"
SCALE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

WEIGHTS = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "group_size": None,
           "block_structure": None, "observer": "minmax", "observer_kwargs": {}, "actorder": None}
"""The weights' QuantizationArgs as llm-compressor's FP8_DYNAMIC preset writes them (strategy apart)."""
INPUT_ACTIVATIONS = {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True, "dynamic": True,
                     "group_size": None, "block_structure": None, "observer": None, "observer_kwargs": {},
                     "actorder": None}


def _refuse(path: str, value: Any, why: str) -> ValueError:
    return ValueError(f"quantization_config.{path} = {json.dumps(value)}: {why}")


def _check_args(path: str, args: Any, expected: dict[str, Any], strategies: Sequence[str]) -> str:
    """The strategy of a group's QuantizationArgs `args` that match `expected` in the fields that
    change the arithmetic; a ValueError naming the first field that does not."""
    if not isinstance(args, dict):
        raise _refuse(path, args, "not supported; FP8 weights with dynamic per-token FP8 activations "
                                  "(FP8-dynamic) are loaded")
    for field in ("num_bits", "type", "symmetric", "dynamic", "group_size", "block_structure"):
        if args.get(field, expected[field]) != expected[field]:
            raise _refuse(f"{path}.{field}", args.get(field), f"not supported; ad-mlir loads "
                                                              f"{json.dumps(expected[field])}")
    strategy = args.get("strategy")
    if strategy not in strategies:
        raise _refuse(f"{path}.strategy", strategy, f"not supported; ad-mlir loads {' or '.join(map(repr, strategies))}")
    return str(strategy)


def fp8_weight_strategy(quantization_config: dict[str, Any]) -> str:
    """The weights' strategy ("channel" or "tensor") of a config.json's compressed-tensors
    `quantization_config` that is FP8-dynamic as we load it; a ValueError naming the field and
    its value for anything else (another format, several groups, int or 4-bit types, group or
    block strategies, static or missing activation quantization, output or KV-cache schemes,
    sparsity, transforms)."""
    if quantization_config.get("format") != "float-quantized":
        raise _refuse("format", quantization_config.get("format"), "not supported; ad-mlir loads compressed-tensors "
                                                                   "\"float-quantized\" (FP8) checkpoints only")
    for field in ("kv_cache_scheme", "sparsity_config", "transform_config"):
        if quantization_config.get(field):
            raise _refuse(field, quantization_config[field], "not supported")
    groups = quantization_config.get("config_groups")
    if not isinstance(groups, dict) or len(groups) != 1:
        raise _refuse("config_groups", groups, "must hold one group (FP8 weights and per-token activations)")
    (name, group), = groups.items()
    prefix = f"config_groups.{name}"
    if group.get("targets") != ["Linear"]:
        raise _refuse(f"{prefix}.targets", group.get("targets"), "not supported; ad-mlir loads [\"Linear\"]")
    if group.get("output_activations") is not None:
        raise _refuse(f"{prefix}.output_activations", group["output_activations"], "not supported")
    _check_args(f"{prefix}.input_activations", group.get("input_activations"), INPUT_ACTIVATIONS, ("token",))
    return _check_args(f"{prefix}.weights", group.get("weights"), WEIGHTS, WEIGHT_STRATEGIES)


def quantize_weight(weight: torch.Tensor, strategy: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 weight [N, K], scale [N, 1] or [1] in the weight's dtype) as compressed-tensors
    computes them (`calculate_qparams`, then `quantize`): `scale = amax / 448` per row (channel)
    or over the tensor, a 0 scale replaced by the dtype's eps, `fp8 = clamp(w / scale, -448, 448)`
    rounded to e4m3, the division in the weight's dtype."""
    magnitude = weight.detach().abs()
    amax = magnitude.amax(dim=1, keepdim=True) if strategy == "channel" else magnitude.amax().reshape(1)
    scale = amax / FP8_MAX
    scale = torch.where(scale == 0, torch.finfo(scale.dtype).eps, scale)
    fp8 = (weight.detach() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return fp8.contiguous(), scale


def quantize_tokens(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of `x` [..., K] quantized with its own scale `max(amax, 1e-12) / 448` in fp32:
    (fp8 values, scales [..., 1]); `ad.quantize_fp8_dynamic` with `per_token`."""
    xf = x.to(torch.float32)
    scale = xf.abs().amax(-1, keepdim=True).clamp_min(MIN_AMAX) / FP8_MAX
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def channel_linear(input: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                   bias: torch.Tensor | None) -> torch.Tensor:
    """The FP8-dynamic linear: the input quantized per token (`quantize_tokens`), the fp8 x fp8
    product in fp32 with both scales (`(q * s) @ (weight * weight_scale).T`, products of e4m3
    values and fp32 scales), the bias added in fp32, rounded to the input's dtype; what
    `ad.quantize_fp8_dynamic` then `ad.linear_fp8` compute, and vLLM's scaled GEMM up to fp32
    rounding."""
    q, scale = quantize_tokens(input)
    w = weight.to(torch.float32) * weight_scale.to(torch.float32)
    out = torch.nn.functional.linear(q.to(torch.float32) * scale, w,
                                     None if bias is None else bias.to(torch.float32))
    return out.to(input.dtype)


class Fp8ChannelLinear(KeepsQuantizedTensors, torch.nn.Module):
    """A compressed-tensors FP8-dynamic linear: `weight` float8_e4m3fn [N, K] and `weight_scale`
    float32 [N, 1] (channel) or [1] (tensor) keep their dtypes when the module is cast (they move
    to a device only); the bias follows the cast. Its forward is `channel_linear`."""

    QUANTIZED = ("weight", "weight_scale")

    def __init__(self, in_features: int, out_features: int, strategy: str, bias: bool) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, dtype=torch.float8_e4m3fn),
                                         requires_grad=False)
        scale_shape = (out_features, 1) if strategy == "channel" else (1,)
        self.weight_scale = torch.nn.Parameter(torch.empty(scale_shape), requires_grad=False)
        self.bias = torch.nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """`channel_linear`; the export routes this method through `ad.quantize_fp8_dynamic` and
        `ad.linear_fp8` (`frontends/export_patches.py`)."""
        return channel_linear(input, self.weight, self.weight_scale, self.bias)


def quantization_config(strategy: str) -> dict[str, Any]:
    """The `quantization_config` llm-compressor writes for its FP8_DYNAMIC scheme (weights per
    channel) or FP8-dynamic with a per-tensor weight scale."""
    return {
        "quant_method": QUANT_METHOD, "format": "float-quantized", "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {**WEIGHTS, "strategy": strategy},
                                      "input_activations": dict(INPUT_ACTIVATIONS), "output_activations": None,
                                      "format": "float-quantized"}},
        "ignore": ["lm_head"], "kv_cache_scheme": None, "global_compression_ratio": None, "sparsity_config": {},
        "transform_config": {}, "version": "0.20.1",
    }


def write_fp8_dynamic_checkpoint(model: transformers.PreTrainedModel, directory: str | Path,
                                 strategy: str = "channel") -> Path:
    """Write `model` to `directory` as a compressed-tensors FP8-dynamic checkpoint (see the module
    docstring): config.json with its `quantization_config`, generation_config.json and
    model.safetensors with each linear but the LM head as an fp8 `weight` and its `weight_scale`
    (`quantize_weight`), every other tensor in the model's dtype (tied weights once)."""
    config = quantization_config(strategy)
    fp8_weight_strategy(config)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().contiguous() for name, t in model.state_dict().items()}
    head = model.get_output_embeddings()
    if head is not None and head.weight is model.get_input_embeddings().weight:
        del tensors[f"{module_name(model, head)}.weight"]
    for name in linear_names(model, ()):
        tensors[f"{name}.weight"], tensors[f"{name}{SCALE_SUFFIX}"] = quantize_weight(tensors[f"{name}.weight"],
                                                                                      strategy)
    return save_checkpoint(model, directory, tensors, config)


def _checked_scale(directory: Path, name: str, module: torch.nn.Linear, tensors: dict[str, torch.Tensor],
                   strategy: str) -> torch.Tensor:
    """The scale of `name` widened to float32 (exact from bf16/fp16), after checking the fp8
    weight's and the scale's dtypes and shapes; a ValueError naming the tensor."""
    weight, scale = tensors.get(f"{name}.weight"), tensors[f"{name}{SCALE_SUFFIX}"]
    n, k = module.out_features, module.in_features
    if weight is None or weight.dtype != torch.float8_e4m3fn or tuple(weight.shape) != (n, k):
        got = "missing" if weight is None else f"{weight.dtype} {list(weight.shape)}"
        raise ValueError(f"'{directory}': {name}.weight is {got}, expected float8_e4m3fn [{n}, {k}] beside its "
                         "weight_scale")
    expected = (n, 1) if strategy == "channel" else (1,)
    if scale.dtype not in SCALE_DTYPES or tuple(scale.shape) != expected:
        raise ValueError(f"'{directory}': {name}{SCALE_SUFFIX} is {scale.dtype} {list(scale.shape)}, expected a "
                         f"float {list(expected)} for weights.strategy {strategy!r}")
    return scale.to(torch.float32)


def load_fp8_dynamic_checkpoint(directory: Path, config: transformers.PretrainedConfig,
                                strategy: str) -> transformers.PreTrainedModel:
    """The model of `config` (its quantization_config dropped: no transformers quantizer runs)
    with the checkpoint's tensors: each linear that has a `weight_scale` becomes an
    `Fp8ChannelLinear` keeping the fp8 bytes and the scale (in float32), every other tensor loads
    as it is (cast by the caller). A tensor the model lacks, a parameter the file lacks, a scale
    on what is no `nn.Linear`, an input_scale (static activations), or a quantized weight or
    scale of the wrong dtype or shape is a ValueError naming it."""
    def replace(name: str, module: torch.nn.Linear) -> torch.nn.Module:
        tensors[name + SCALE_SUFFIX] = _checked_scale(directory, name, module, tensors, strategy)
        return Fp8ChannelLinear(module.in_features, module.out_features, strategy, module.bias is not None)

    tensors = read_safetensors(directory)
    static = sorted(k for k in tensors if k.endswith(".input_scale"))
    if static:
        raise ValueError(f"'{directory}': {static[0]}: static activation scales are not supported (the "
                         "config's input_activations are dynamic)")
    return load_with_quantized_linears(directory, config, tensors, SCALE_SUFFIX, replace, "compressed-tensors FP8")


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m ad_mlir.zoo.ct_fp8 MODEL DIRECTORY [--strategy channel|tensor] [--layers N]
    [--dtype D]`: a built-in tiny family or a transformers model type (random weights, as
    `--model` builds them) written to DIRECTORY as a compressed-tensors FP8-dynamic checkpoint."""
    import argparse

    from ad_mlir.zoo.checkpoints import named_model
    from ad_mlir.zoo.tiny import DTYPES

    parser = argparse.ArgumentParser(prog="python -m ad_mlir.zoo.ct_fp8", description=main.__doc__)
    parser.add_argument("model", help="a built-in tiny family (llama, qwen2, ...) or a transformers model type")
    parser.add_argument("directory")
    parser.add_argument("--strategy", choices=WEIGHT_STRATEGIES, default="channel",
                        help="of the weight scales (default: channel, as llm-compressor's FP8_DYNAMIC)")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--dtype", choices=DTYPES, default="bfloat16",
                        help="of the tensors left unquantized (default: bfloat16, as released checkpoints)")
    args = parser.parse_args(argv)
    model = named_model(args.model, args.dtype, args.layers)
    print(write_fp8_dynamic_checkpoint(model, args.directory, args.strategy))


if __name__ == "__main__":
    main()
