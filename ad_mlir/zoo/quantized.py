"""Fine-grained (block-scaled) FP8 checkpoints, as Qwen3-*-FP8 and DeepSeek-V3/R1 ship them:
a writer that makes one from a small model, and the loader `checkpoints.load_checkpoint` calls.

The format (transformers' `FineGrainedFP8Config`, `integrations/finegrained_fp8.py`):
config.json holds `quantization_config = {"quant_method": "fp8", "fmt": "e4m3",
"activation_scheme": "dynamic", "weight_block_size": [bn, bk]}`; in the safetensors each
quantized linear has `<name>.weight` in float8_e4m3fn [N, K] and `<name>.weight_scale_inv` in
float32 [ceil(N / bn), ceil(K / bk)], the weight being `fp8 * scale_inv` broadcast over its
block; the LM head, the embeddings and the norms keep the model's dtype. At run time the
activations are quantized per token per group of bk elements (scale `amax / 448`) and the GEMM
adds each K block's fp8 x fp8 product times the activation's and the weight's scales.

Loaded here, a quantized linear is an `Fp8BlockLinear`: transformers' own `FP8Linear` (its
parameter names and attributes), whose forward computes the format in torch on any device
(`fp8_blocks.py`; transformers' calls a Hub kernel) and whose fp8 weight and fp32 scales
follow the module to a device but never to a dtype (`model.to(torch.float32)` casts the rest of
the model; fp8 bytes cast to fp32 would be a dequantized model no longer quantized, scales cast
to bf16 would lose bits). transformers' own loader cannot keep them on a CPU: without a GPU its
quantizer dequantizes to the model's dtype (that dequantized model is the tests' reference).
Imports nothing of the compiler.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
import transformers
from transformers.core_model_loading import revert_weight_conversion
from transformers.integrations.finegrained_fp8 import FP8Experts, FP8Linear

from ad_mlir.zoo.fp8_blocks import block_experts, block_linear, quantize_blocks

QUANT_METHOD = "fp8"
FORMATS = ("e4m3",)
ACTIVATION_SCHEMES = ("dynamic",)
MIN_BLOCK = 16
"""The smallest block side: a block feeds one tl.dot (depth >= 16), and sides are powers of two."""
SCALE_SUFFIX = ".weight_scale_inv"


def _block_side(value: Any) -> bool:
    return type(value) is int and value >= MIN_BLOCK and value & (value - 1) == 0


def fp8_block_size(quantization_config: dict[str, Any]) -> tuple[int, int]:
    """The (bn, bk) of a config.json's `quantization_config` that is fine-grained FP8 as we
    load it; a ValueError naming the field and its value for anything else (another
    `quant_method`, another `fmt`, a static activation scheme, a block that is not two powers of
    two >= 16, per-tensor scales or scales stored as ue8m0)."""
    def refuse(field: str, why: str) -> ValueError:
        value = quantization_config.get(field)
        return ValueError(f"quantization_config.{field} = {json.dumps(value)}: {why}")

    method = quantization_config.get("quant_method")
    if method != QUANT_METHOD:
        raise refuse("quant_method", f"not supported; ad-mlir loads \"{QUANT_METHOD}\" (fine-grained FP8 with "
                                     "weight_block_size), \"compressed-tensors\" (FP8-dynamic), \"mxfp4\" "
                                     "(gpt-oss's experts), \"gptq\" and \"awq\" (int4) only")
    if quantization_config.get("fmt", "e4m3") not in FORMATS:
        raise refuse("fmt", f"not supported; fine-grained FP8 is loaded in {', '.join(FORMATS)}")
    if quantization_config.get("activation_scheme", "dynamic") not in ACTIVATION_SCHEMES:
        raise refuse("activation_scheme", "not supported; the activations are quantized dynamically (\"dynamic\")")
    if quantization_config.get("scale_fmt", "float") != "float":
        raise refuse("scale_fmt", "not supported; the block scales are loaded as float32 (\"float\")")
    block = quantization_config.get("weight_block_size")
    if not isinstance(block, list | tuple) or len(block) != 2 or not all(_block_side(b) for b in block):
        raise refuse("weight_block_size", f"must be [bn, bk], two powers of two >= {MIN_BLOCK} (per-tensor FP8, "
                                          "null, is not supported)")
    return int(block[0]), int(block[1])


def tensor_bits(t: torch.Tensor) -> torch.Tensor:
    """`t` viewed as the integer dtype of its width: a dtype cast (`Module.to(dtype)`) leaves it."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


class KeepsQuantizedTensors:
    """A module mixin: the parameters named in `QUANTIZED` keep their dtypes when the module is
    cast (`Module.to`, `.float()`, `.bfloat16()` move their bits to a device only); the others
    follow the cast as usual."""

    QUANTIZED: tuple[str, ...] = ()

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> KeepsQuantizedTensors:
        held = {name: self._parameters.pop(name) for name in self.QUANTIZED}
        try:
            super()._apply(fn, recurse)
        finally:
            for name, param in held.items():
                moved = fn(tensor_bits(param.detach())).view(param.dtype)
                self._parameters[name] = torch.nn.Parameter(moved, requires_grad=False)
        return self


class Fp8BlockLinear(KeepsQuantizedTensors, FP8Linear):
    """transformers' `FP8Linear` with block scales (`block_size` [bn, bk], dynamic activations),
    whose `weight` (float8_e4m3fn) and `weight_scale_inv` (float32) keep their dtypes when the
    module is cast: `Module.to`, `.float()`, `.bfloat16()` move them to a device only; the bias
    follows the cast as any parameter does. Its forward is the format's arithmetic in torch."""

    QUANTIZED = ("weight", "weight_scale_inv")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """The format's arithmetic in torch (`fp8_blocks.block_linear`), on any device:
        transformers' forward calls a kernel from the Hub, which needs a GPU and the network. The
        export routes this method through `ad.linear_fp8_block`'s op (`frontends/export_patches.py`)."""
        return block_linear(input, self.weight, self.weight_scale_inv, self.bias, self.block_size)

    def __init__(self, in_features: int, out_features: int, block_size: tuple[int, int], bias: bool) -> None:
        super().__init__(in_features, out_features, block_size=block_size, activation_scheme="dynamic",
                         has_bias=bias)

class Fp8BlockExperts(KeepsQuantizedTensors, FP8Experts):
    """transformers' `FP8Experts` (gated, block scales, dynamic activations): the experts stacked,
    `gate_up_proj` [E, 2I, H] (each expert's gate rows, then its up rows) and `down_proj`
    [E, H, I] in float8_e4m3fn, their `<proj>_scale_inv` per block in float32, kept in their
    dtypes when the module is cast. Its forward is the format's arithmetic in torch
    (`fp8_blocks.block_experts`); the export routes it through `ad.moe_fp8_block`'s op
    (`frontends/export_patches.py`)."""

    QUANTIZED = ("gate_up_proj", "gate_up_proj_scale_inv", "down_proj", "down_proj_scale_inv")

    def __init__(self, config: transformers.PretrainedConfig, block_size: tuple[int, int]) -> None:
        super().__init__(config, block_size=block_size, activation_scheme="dynamic")

    def operands(self) -> tuple[torch.Tensor, ...]:
        """The four tensors in `ad.moe_fp8_block`'s operand order."""
        return self.gate_up_proj, self.gate_up_proj_scale_inv, self.down_proj, self.down_proj_scale_inv

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        return block_experts(hidden_states, top_k_index, top_k_weights, *self.operands(), self.block_size)


def linear_names(model: torch.nn.Module, skip: Sequence[str]) -> list[str]:
    """The linears a writer quantizes: every `nn.Linear` but the output embeddings (transformers
    keeps the LM head unquantized) and those named in `skip` (a name or a prefix of one)."""
    head = model.get_output_embeddings()
    return [name for name, module in model.named_modules()
            if type(module) is torch.nn.Linear and module is not head
            and not any(name == s or name.startswith(s + ".") for s in skip)]


def expert_linears(tensors: dict[str, torch.Tensor], in_memory: set[str], skip: Sequence[str]) -> list[str]:
    """The experts' linears of a checkpoint's `tensors` (names as on disk) that the model holds
    fused (`in_memory`, its state dict's names): a 2-D weight a MoE's fused experts become one per
    expert (`experts.<e>.gate_proj.weight` ...), which DeepSeek-V3's and Qwen3-MoE's FP8
    checkpoints quantize as any linear; those named in `skip` (a name or a prefix of one) left."""
    return [key.removesuffix(".weight") for key, t in tensors.items()
            if key not in in_memory and key.endswith(".weight") and t.dim() == 2
            and not any(key.startswith(s + ".") for s in skip)]


def write_fp8_block_checkpoint(model: transformers.PreTrainedModel, directory: str | Path,
                               block_size: Sequence[int] = (128, 128),
                               modules_to_not_convert: Sequence[str] = ()) -> Path:
    """Write `model` to `directory` as a fine-grained FP8 checkpoint (see the module docstring):
    config.json with its `quantization_config`, generation_config.json, model.safetensors with
    each quantized linear's fp8 `weight` and float32 `weight_scale_inv`, every other tensor in
    the model's dtype (tied weights once and a MoE's fused experts one linear per expert, quantized
    too, as `save_pretrained` writes them: transformers' `revert_weight_conversion`). `block_size` is
    [bn, bk] (real checkpoints: [128, 128]); `modules_to_not_convert` is written to the config
    when given, as transformers reads it."""
    bn, bk = block_size
    config = {"quant_method": QUANT_METHOD, "fmt": "e4m3", "activation_scheme": "dynamic",
              "weight_block_size": [bn, bk]}
    if modules_to_not_convert:
        config["modules_to_not_convert"] = list(modules_to_not_convert)
    fp8_block_size(config)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().contiguous() for name, t in model.state_dict().items()}
    head = model.get_output_embeddings()
    if head is not None and head.weight is model.get_input_embeddings().weight:
        del tensors[f"{module_name(model, head)}.weight"]
    in_memory = set(tensors)
    tensors = {k: t.contiguous() for k, t in revert_weight_conversion(model, tensors).items()}
    for name in linear_names(model, modules_to_not_convert) + expert_linears(tensors, in_memory, modules_to_not_convert):
        fp8, scale_inv = quantize_blocks(tensors[f"{name}.weight"], (bn, bk))
        tensors[f"{name}.weight"], tensors[f"{name}{SCALE_SUFFIX}"] = fp8, scale_inv
    return save_checkpoint(model, directory, tensors, config)


def save_checkpoint(model: transformers.PreTrainedModel, directory: Path, tensors: dict[str, torch.Tensor],
                    quantization_config: dict[str, Any]) -> Path:
    """`directory` (made if missing) with config.json (the model's config and
    `quantization_config`), generation_config.json and model.safetensors holding `tensors`, as a
    quantized checkpoint of `model`."""
    directory.mkdir(parents=True, exist_ok=True)
    hf_config = model.config.to_dict()
    hf_config["quantization_config"] = quantization_config
    hf_config.pop("_name_or_path", None)
    (directory / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
    model.generation_config.save_pretrained(directory)
    safetensors.torch.save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def module_name(model: torch.nn.Module, module: torch.nn.Module) -> str:
    return next(n for n, m in model.named_modules() if m is module)


def safetensors_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        return sorted({directory / f for f in json.loads(index.read_text())["weight_map"].values()})
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"'{directory}': a fine-grained FP8 checkpoint without .safetensors weights")
    return files


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Within it, every parameter a module registers lives on the meta device (no memory, no
    initialization) while buffers are made as usual (RoPE's inv_freq is computed, not loaded):
    accelerate's `init_empty_weights(include_buffers=False)`, without the dependency."""
    register = torch.nn.Module.register_parameter

    def on_meta(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None:
            module._parameters[name] = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def load_fp8_block_checkpoint(directory: Path, config: transformers.PretrainedConfig,
                              block_size: tuple[int, int]) -> transformers.PreTrainedModel:
    """The model of `config` (its quantization_config dropped: no transformers quantizer runs)
    with the checkpoint's tensors: each linear that has a `weight_scale_inv` becomes an
    `Fp8BlockLinear` keeping the fp8 bytes and the scales, each MoE experts module whose experts
    have them an `Fp8BlockExperts` holding them stacked (`stack_fp8_experts`), every other tensor
    loads as it is (cast by the caller). Parameters are created on the meta device and assigned
    from the file (buffers such as RoPE's are computed as usual); a tensor the model lacks, a
    parameter the file lacks (other than tied ones), a scale on what is no `nn.Linear` or expert
    or a quantized weight of the wrong dtype or shape is a ValueError naming it."""
    def replace(name: str, module: torch.nn.Linear) -> torch.nn.Module:
        _check_quantized(directory, name, module, tensors, block_size)
        return Fp8BlockLinear(module.in_features, module.out_features, block_size, module.bias is not None)

    model = model_on_meta(config)
    tensors = stack_fp8_experts(directory, model, read_safetensors(directory), block_size)
    replace_quantized_linears(directory, model, config, tensors, SCALE_SUFFIX, replace, "fine-grained FP8")
    return assign_tensors(directory, model, tensors)


def experts_modules(model: torch.nn.Module) -> list[str]:
    """The MoE experts modules of `model` as transformers 5 holds them: stacked 3-D `gate_up_proj`
    [E, 2I, H] and `down_proj` [E, H, I] parameters (Qwen3-MoE's, DeepSeek-V3's, Mixtral's...)."""
    return [name for name, module in model.named_modules()
            if all(isinstance(p := getattr(module, proj, None), torch.nn.Parameter) and p.dim() == 3
                   for proj in ("gate_up_proj", "down_proj"))]


def stack_fp8_experts(directory: Path, model: transformers.PreTrainedModel, tensors: dict[str, torch.Tensor],
                      block_size: tuple[int, int]) -> dict[str, torch.Tensor]:
    """`tensors` with each experts module's per-expert FP8 linears (`<m>.<e>.<proj>.weight` and
    `.weight_scale_inv`, as DeepSeek-V3's and Qwen3-MoE's checkpoints hold them) stacked as
    transformers' checkpoint conversion stacks them (gate rows, then up rows; scales alike),
    under `Fp8BlockExperts`' names, and that module put in `model` (on the meta device) in
    place of the experts module. A ValueError names what does not fit: an expert missing or
    of the wrong dtype or shape, an intermediate size that splits a block between gate and up
    rows, an activation other than silu."""
    for name in experts_modules(model):
        if not any(key.startswith(f"{name}.") and key.endswith(SCALE_SUFFIX) for key in tensors):
            continue
        experts, hidden, inter = model.get_submodule(name).down_proj.shape
        _check_fp8_experts(directory, name, model.config, inter, block_size)
        sizes = {"gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter)}
        stacked = {(proj, suffix): _stacked(directory, tensors, f"{name}.{{}}.{proj}{suffix}", experts, n, k, suffix,
                                            block_size)
                   for proj, (n, k) in sizes.items() for suffix in (".weight", SCALE_SUFFIX)}
        for fused, parts in (("gate_up_proj", ("gate_proj", "up_proj")), ("down_proj", ("down_proj",))):
            tensors[f"{name}.{fused}"] = torch.cat([stacked[p, ".weight"] for p in parts], dim=1)
            tensors[f"{name}.{fused}_scale_inv"] = torch.cat([stacked[p, SCALE_SUFFIX] for p in parts], dim=1)
        with parameters_on_meta():
            model.set_submodule(name, Fp8BlockExperts(model.config, block_size))
    return tensors


def _check_fp8_experts(directory: Path, name: str, config: transformers.PretrainedConfig, inter: int,
                       block_size: tuple[int, int]) -> None:
    """A ValueError unless the experts stack into `Fp8BlockExperts`: I a multiple of bn (no block
    holding both gate and up rows), silu experts (what `ad.moe_fp8_block` computes)."""
    if inter % block_size[0]:
        raise ValueError(f"'{directory}': {name} has intermediate size {inter}, not a multiple of "
                         f"weight_block_size's bn {block_size[0]}: its stacked gate and up rows would share a block")
    act = getattr(config, "hidden_act", None)
    if act != "silu":
        raise ValueError(f"'{directory}': {name}: config.hidden_act = {act!r}; FP8 experts are loaded with silu")


def _stacked(directory: Path, tensors: dict[str, torch.Tensor], key: str, experts: int, n: int, k: int, suffix: str,
             block_size: tuple[int, int]) -> torch.Tensor:
    """The `experts` tensors `key.format(e)` (popped from `tensors`) stacked: fp8 [n, k] weights, or
    their float32 block scales; a ValueError names one missing or of the wrong dtype or shape."""
    bn, bk = block_size
    dtype, shape = (torch.float8_e4m3fn, (n, k)) if suffix == ".weight" else (torch.float32, (-(-n // bn), -(-k // bk)))
    per_expert = [tensors.pop(key.format(e), None) for e in range(experts)]
    for e, t in enumerate(per_expert):
        if t is None or t.dtype != dtype or tuple(t.shape) != shape:
            got = "missing" if t is None else f"{t.dtype} {list(t.shape)}"
            raise ValueError(f"'{directory}': {key.format(e)} is {got}, expected {dtype} {list(shape)} "
                             f"(weight_block_size {list(block_size)})")
    return torch.stack(per_expert)


def read_safetensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint directory's safetensors files (one or several shards)."""
    tensors: dict[str, torch.Tensor] = {}
    for file in safetensors_files(directory):
        tensors.update(safetensors.torch.load_file(str(file)))
    return tensors


def load_with_quantized_linears(directory: Path, config: transformers.PretrainedConfig,
                                tensors: dict[str, torch.Tensor], scale_suffix: str,
                                replace: Callable[[str, torch.nn.Linear], torch.nn.Module], format_name: str
                                ) -> transformers.PreTrainedModel:
    """The model of `config` (its quantization_config dropped: no transformers quantizer runs),
    parameters created on the meta device, its quantized linears replaced
    (`replace_quantized_linears`, `format_name` the format a refusal names), then `tensors`
    assigned. A tensor the model lacks or a parameter the file lacks (other than tied ones) is a
    ValueError naming it."""
    model = model_on_meta(config)
    replace_quantized_linears(directory, model, config, tensors, scale_suffix, replace, format_name)
    return assign_tensors(directory, model, tensors)


def replace_quantized_linears(directory: Path, model: transformers.PreTrainedModel,
                              config: transformers.PretrainedConfig, tensors: dict[str, torch.Tensor],
                              scale_suffix: str, replace: Callable[[str, torch.nn.Linear], torch.nn.Module],
                              format_name: str) -> None:
    """Each linear of `model` (on the meta device) that has a `<name><scale_suffix>` tensor
    swapped for `replace(name, linear)` (made on the meta device too). A scale on an expert of a
    stacked experts module (quantized MoE experts in `format_name`, which do not load) or on
    what is no `nn.Linear` is a ValueError naming it."""
    experts = experts_modules(model)
    for key in sorted(k for k in tensors if k.endswith(scale_suffix)):
        name = key.removesuffix(scale_suffix)
        module = model.get_submodule(name) if has_submodule(model, name) else None
        if type(module) is not torch.nn.Linear:
            owner = next((m for m in experts if name.startswith(m + ".")), None)
            if owner is not None:
                raise _experts_refusal(directory, model, config, key, owner, format_name)
            raise ValueError(f"'{directory}': {key} scales {name}, which is not a linear layer of "
                             f"{type(model).__name__}")
        with parameters_on_meta():
            model.set_submodule(name, replace(name, module))


def _experts_refusal(directory: Path, model: transformers.PreTrainedModel, config: transformers.PretrainedConfig,
                     key: str, experts: str, format_name: str) -> ValueError:
    """Why a checkpoint whose MoE experts are quantized in a format other than fine-grained FP8
    does not load: the format, its `quant_method` (where config.json has one) and the tensor."""
    fields = getattr(config, "quantization_config", None) or {}
    method = (fields if isinstance(fields, dict) else fields.to_dict()).get("quant_method")
    field = "" if method is None else f"quantization_config.quant_method = {json.dumps(method)}: "
    return ValueError(f"'{directory}': {field}quantized MoE experts in {format_name} are not supported ({key} "
                      f"quantizes an expert of {experts}, {type(model.get_submodule(experts)).__name__}); ad-mlir "
                      "loads MoE experts quantized in fine-grained FP8 (quant_method \"fp8\") and MXFP4 (gpt-oss)")


def model_on_meta(config: transformers.PretrainedConfig) -> transformers.PreTrainedModel:
    """The model of `config` without its quantization_config (no transformers quantizer runs),
    its parameters on the meta device, its buffers computed."""
    plain = copy.deepcopy(config)
    if hasattr(plain, "quantization_config"):  # ModelOpt's older exports say it in hf_quant_config.json only
        del plain.quantization_config
    with parameters_on_meta():
        return transformers.AutoModelForCausalLM.from_config(plain, dtype=torch.float32)


def assign_tensors(directory: Path, model: transformers.PreTrainedModel,
                   tensors: dict[str, torch.Tensor]) -> transformers.PreTrainedModel:
    """`model` (parameters on the meta device) with `tensors` assigned as its parameters, tied
    weights tied, in eval mode; a tensor the model lacks or a parameter the file lacks (other
    than tied ones) is a ValueError naming it."""
    missing, unexpected = model.load_state_dict(tensors, strict=False, assign=True)
    if unexpected:
        raise ValueError(f"'{directory}': tensors {', '.join(sorted(unexpected)[:5])} are not parameters of "
                         f"{type(model).__name__}")
    model.tie_weights()
    unloaded = [n for n, p in model.named_parameters() if p.is_meta]
    if unloaded:
        raise ValueError(f"'{directory}': the checkpoint lacks {', '.join(unloaded[:5])}")
    return model.eval()


def has_submodule(model: torch.nn.Module, name: str) -> bool:
    try:
        model.get_submodule(name)
    except AttributeError:
        return False
    return True


def _check_quantized(directory: Path, name: str, module: torch.nn.Linear, tensors: dict[str, torch.Tensor],
                     block_size: tuple[int, int]) -> None:
    weight, scale = tensors.get(f"{name}.weight"), tensors[f"{name}{SCALE_SUFFIX}"]
    expected = (math.ceil(module.out_features / block_size[0]), math.ceil(module.in_features / block_size[1]))
    if weight is None or weight.dtype != torch.float8_e4m3fn or tuple(weight.shape) != (module.out_features,
                                                                                          module.in_features):
        got = "missing" if weight is None else f"{weight.dtype} {list(weight.shape)}"
        raise ValueError(f"'{directory}': {name}.weight is {got}, expected float8_e4m3fn "
                         f"[{module.out_features}, {module.in_features}] beside its weight_scale_inv")
    if scale.dtype != torch.float32 or tuple(scale.shape) != expected:
        raise ValueError(f"'{directory}': {name}{SCALE_SUFFIX} is {scale.dtype} {list(scale.shape)}, expected "
                         f"float32 {list(expected)} for weight_block_size {list(block_size)}")


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m ad_mlir.zoo.quantized MODEL DIRECTORY [--block-size BN BK] [--layers N]
    [--dtype D]`: a built-in tiny family or a transformers model type (random weights, as
    `--model` builds them) written to DIRECTORY as a fine-grained FP8 checkpoint."""
    import argparse

    from ad_mlir.zoo.checkpoints import named_model
    from ad_mlir.zoo.tiny import DTYPES

    parser = argparse.ArgumentParser(prog="python -m ad_mlir.zoo.quantized", description=main.__doc__)
    parser.add_argument("model", help="a built-in tiny family (llama, qwen2, ...) or a transformers model type")
    parser.add_argument("directory")
    parser.add_argument("--block-size", type=int, nargs=2, default=(128, 128), metavar=("BN", "BK"))
    parser.add_argument("--layers", type=int)
    parser.add_argument("--dtype", choices=DTYPES, default="bfloat16",
                        help="of the tensors left unquantized (default: bfloat16, as released checkpoints)")
    args = parser.parse_args(argv)
    model = named_model(args.model, args.dtype, args.layers)
    print(write_fp8_block_checkpoint(model, args.directory, args.block_size))


if __name__ == "__main__":
    main()
