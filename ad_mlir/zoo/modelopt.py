"""NVIDIA ModelOpt NVFP4 checkpoints (nvidia/Llama-3.1-8B-Instruct-FP4 and the other `-FP4` /
`-NVFP4` models ModelOpt exports): a writer that makes one from a small model, and the loader
`checkpoints.load_checkpoint` calls.

The format, as ModelOpt's `export_hf_checkpoint` writes it and vLLM's and SGLang's ModelOpt
loaders read it: `hf_quant_config.json` holds `{"producer": {"name": "modelopt", ...},
"quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": null, "group_size": 16,
"exclude_modules": ["lm_head", ...]}}`, and newer exports also put the same in config.json's
`quantization_config` in compressed-tensors' shape (`{"quant_method": "modelopt", "quant_algo":
"NVFP4", "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "float",
"group_size": 16, ...}, "input_activations": {...}, "targets": ["Linear"]}}, "ignore": [...],
"producer": ...}`); either is read. In the safetensors each quantized linear has `weight`
(uint8 [N, K / 2], two e2m1 codes a byte), `weight_scale` (float8_e4m3fn [N, K / 16]),
`weight_scale_2` (float32, one value) and `input_scale` (float32, one value); the LM head, the
embeddings and the norms keep the model's dtype. The arithmetic is `nvfp4.py`'s.

Loaded here, a quantized linear is an `Nvfp4Linear` whose packed codes and scales keep their
dtypes through `model.to(dtype)` (they move to a device only), and whose forward is
`nvfp4.linear` (weight-only; `input_scale` kept, unused). transformers 5.24 has no loader for
these checkpoints (its `NVFP4Config` quantizes a bf16 checkpoint on a Blackwell GPU and refuses a
pre-quantized one), so the tests' dequantized reference is `nvfp4.dequantize`. Imports nothing of
the compiler.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
import transformers

from ad_mlir.zoo import nvfp4
from ad_mlir.zoo.quantized import (
    KeepsQuantizedTensors,
    linear_names,
    load_with_quantized_linears,
    module_name,
    read_safetensors,
)

QUANT_METHOD = "modelopt"
QUANT_ALGO = "NVFP4"
HF_QUANT_CONFIG = "hf_quant_config.json"
SCALE_SUFFIX = ".weight_scale_2"
PRODUCER = {"name": "modelopt", "version": "0.39.0"}
"""What our writer names as its producer: the ModelOpt version whose export layout it writes."""
FP4_ARGS = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": nvfp4.GROUP}
"""A config group's `weights` and `input_activations` as ModelOpt writes them for NVFP4."""


class QuantizationFields:
    """The NVFP4 fields of a checkpoint, read from config.json's `quantization_config` or, without
    one, from hf_quant_config.json's `quantization`; `where` prefixes each field's name in errors."""

    def __init__(self, fields: dict[str, Any], where: str) -> None:
        self.fields, self.where = fields, where

    def refuse(self, field: str, value: Any, why: str) -> ValueError:
        return ValueError(f"{self.where}.{field} = {json.dumps(value)}: {why}")

    def check(self) -> None:
        """A ValueError naming the first field that is not NVFP4 as we load it: another
        `quant_algo` (FP8, W4A8_AWQ, NVFP4_AWQ, MIXED_PRECISION...), a group size other than 16,
        a quantized KV cache, a config group of other weights or activations or targets."""
        algo = self.fields.get("quant_algo")
        if str(algo).upper() != QUANT_ALGO:  # vLLM reads it case-blind: some exports write it in lower case
            raise self.refuse("quant_algo", algo, f"not supported; ad-mlir loads ModelOpt \"{QUANT_ALGO}\" only")
        if self.fields.get("group_size", nvfp4.GROUP) != nvfp4.GROUP:
            raise self.refuse("group_size", self.fields["group_size"], f"not supported; NVFP4 groups are "
                                                                       f"{nvfp4.GROUP} elements")
        for field in ("kv_cache_quant_algo", "kv_cache_scheme"):
            if self.fields.get(field) is not None:
                raise self.refuse(field, self.fields[field], "not supported; the KV cache is not quantized")
        ignore = self.fields.get("exclude_modules", self.fields.get("ignore", []))
        if not isinstance(ignore, list):
            raise self.refuse("exclude_modules" if "exclude_modules" in self.fields else "ignore", ignore,
                              "must be a list of module names")
        groups = self.fields.get("config_groups") or {}
        for name, group in groups.items():
            if group.get("targets", ["Linear"]) != ["Linear"]:
                raise self.refuse(f"config_groups.{name}.targets", group.get("targets"), "not supported; ad-mlir "
                                                                                         "loads [\"Linear\"]")
            for part in ("weights", "input_activations"):
                args = group.get(part) or {}
                for field, expected in FP4_ARGS.items():
                    # static or dynamic activation scales alike: the activations are not quantized here
                    if field != "dynamic" and args.get(field, expected) != expected:
                        raise self.refuse(f"config_groups.{name}.{part}.{field}", args.get(field),
                                          f"not supported; NVFP4 is {json.dumps(expected)}")


def check_nvfp4_config(directory: Path, quantization_config: dict[str, Any] | None) -> None:
    """A ValueError naming the field for what we do not load in the checkpoint in `directory`
    whose config.json holds `quantization_config` (None: none, then hf_quant_config.json is
    read). Which linears are quantized is read from the tensors (those with a `weight_scale_2`),
    not from `exclude_modules` / `ignore`, which name the same modules the other way round."""
    if quantization_config is None:
        quantization = json.loads((directory / HF_QUANT_CONFIG).read_text()).get("quantization")
        fields = QuantizationFields(quantization if isinstance(quantization, dict) else {},
                                    f"{HF_QUANT_CONFIG}: quantization")
    elif isinstance(quantization_config.get("quantization"), dict):
        fields = QuantizationFields(quantization_config["quantization"], "quantization_config.quantization")
    else:
        fields = QuantizationFields(quantization_config, "quantization_config")
    fields.check()


def is_modelopt(directory: Path, quantization_config: dict[str, Any] | None) -> bool:
    """Whether the checkpoint is ModelOpt's: its config.json says so, or it has none and an
    hf_quant_config.json (older exports)."""
    if quantization_config is None:
        return (directory / HF_QUANT_CONFIG).is_file()
    return str(quantization_config.get("quant_method", "")).lower() == QUANT_METHOD


class Nvfp4Linear(KeepsQuantizedTensors, torch.nn.Module):
    """A ModelOpt NVFP4 linear: `weight` uint8 [N, K / 2] (packed e2m1 codes), `weight_scale`
    float8_e4m3fn [N, K / 16], `weight_scale_2` and `input_scale` float32 [] keep their dtypes
    when the module is cast (they move to a device only); the bias follows the cast. Its forward
    is `nvfp4.linear` (weight-only: `input_scale` is not used)."""

    QUANTIZED = ("weight", "weight_scale", "weight_scale_2", "input_scale")

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features

        def frozen(*shape: int, dtype: torch.dtype) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)

        self.weight = frozen(out_features, in_features // 2, dtype=torch.uint8)
        self.weight_scale = frozen(out_features, in_features // nvfp4.GROUP, dtype=torch.float8_e4m3fn)
        self.weight_scale_2 = frozen(dtype=torch.float32)
        self.input_scale = frozen(dtype=torch.float32)
        self.bias = torch.nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """`nvfp4.linear`; the export routes this method through `ad.linear_nvfp4`
        (`frontends/export_patches.py`)."""
        return nvfp4.linear(input, self.weight, self.weight_scale, self.weight_scale_2, self.bias)


def input_amax(model: transformers.PreTrainedModel, names: Sequence[str], tokens: int = 16) -> dict[str, torch.Tensor]:
    """Each named linear's input amax over one forward of `tokens` random token ids: the
    calibration ModelOpt's max calibrator does on real text, for the `input_scale`s."""
    amax: dict[str, torch.Tensor] = {}

    def record(name: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            amax[name] = args[0].detach().abs().amax().float()
        return hook

    handles = [model.get_submodule(name).register_forward_pre_hook(record(name)) for name in names]
    try:
        with torch.no_grad():
            ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0))
            model(ids)
    finally:
        for handle in handles:
            handle.remove()
    return amax


def quantization_configs(exclude_modules: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(hf_quant_config.json, config.json's `quantization_config`) as ModelOpt's export writes
    them for NVFP4 (the second is its `convert_hf_quant_config_format` of the first)."""
    hf_quant = {"producer": dict(PRODUCER), "quantization": {"quant_algo": QUANT_ALGO, "kv_cache_quant_algo": None,
                                                             "group_size": nvfp4.GROUP,
                                                             "exclude_modules": list(exclude_modules)}}
    group = {"input_activations": dict(FP4_ARGS), "weights": dict(FP4_ARGS), "targets": ["Linear"]}
    config = {"config_groups": {"group_0": group}, "ignore": list(exclude_modules), "quant_algo": QUANT_ALGO,
              "producer": dict(PRODUCER), "quant_method": QUANT_METHOD}
    return hf_quant, config


def write_nvfp4_checkpoint(model: transformers.PreTrainedModel, directory: str | Path,
                           exclude_modules: Sequence[str] = (), legacy: bool = False) -> Path:
    """Write `model` to `directory` as a ModelOpt NVFP4 checkpoint (see the module docstring):
    hf_quant_config.json, config.json with its `quantization_config` (without, with `legacy`:
    ModelOpt's older exports), generation_config.json and model.safetensors with each linear but
    the LM head and `exclude_modules` (names or prefixes) quantized (`nvfp4.quantize`), its
    `input_scale` from one calibration forward (`input_amax`), every other tensor in the model's
    dtype (tied weights once)."""
    excluded = ["lm_head", *exclude_modules]
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    names = linear_names(model, exclude_modules)
    amax = input_amax(model, names)
    tensors = {name: t.detach().contiguous() for name, t in model.state_dict().items()}
    head = model.get_output_embeddings()
    if head is not None and head.weight is model.get_input_embeddings().weight:
        del tensors[f"{module_name(model, head)}.weight"]
    for name in names:
        packed, block_scale, scale_2 = nvfp4.quantize(tensors[f"{name}.weight"])
        tensors.update({f"{name}.weight": packed, f"{name}.weight_scale": block_scale,
                        f"{name}{SCALE_SUFFIX}": scale_2, f"{name}.input_scale": nvfp4.global_scale(amax[name])})
    hf_quant, config = quantization_configs(excluded)
    hf_config = model.config.to_dict()
    if not legacy:
        hf_config["quantization_config"] = config
    hf_config.pop("_name_or_path", None)
    (directory / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
    (directory / HF_QUANT_CONFIG).write_text(json.dumps(hf_quant, indent=4) + "\n")
    model.generation_config.save_pretrained(directory)
    safetensors.torch.save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def _checked(directory: Path, name: str, module: torch.nn.Linear, tensors: dict[str, torch.Tensor]) -> None:
    """Check a quantized linear's four tensors (dtype and shape), making its scalars 0-d (a file
    may hold them as [1]); a ValueError naming the tensor."""
    n, k = module.out_features, module.in_features
    if k % nvfp4.GROUP:
        raise ValueError(f"'{directory}': {name} has {k} in-features, not a multiple of {nvfp4.GROUP}: not NVFP4")
    expected = {"weight": (torch.uint8, (n, k // 2)), "weight_scale": (torch.float8_e4m3fn, (n, k // nvfp4.GROUP)),
                "weight_scale_2": (torch.float32, ()), "input_scale": (torch.float32, ())}
    for part, (dtype, shape) in expected.items():
        key = f"{name}.{part}"
        t = tensors.get(key)
        if t is not None and not shape and t.shape == (1,):
            t = tensors[key] = t.reshape(())
        if t is None or t.dtype != dtype or tuple(t.shape) != shape:
            got = "missing" if t is None else f"{t.dtype} {list(t.shape)}"
            raise ValueError(f"'{directory}': {key} is {got}, expected {str(dtype).removeprefix('torch.')} "
                             f"{list(shape)} for NVFP4 [{n}, {k}]")


def load_nvfp4_checkpoint(directory: Path, config: transformers.PretrainedConfig) -> transformers.PreTrainedModel:
    """The model of `config` (its quantization_config dropped: no transformers quantizer runs)
    with the checkpoint's tensors: each linear that has a `weight_scale_2` becomes an
    `Nvfp4Linear` keeping the packed codes and the scales, every other tensor loads as it is
    (cast by the caller). NVFP4 MoE experts (not loaded: the refusal names the format), a tensor
    the model lacks, a parameter the file lacks, or a quantized tensor of the wrong dtype or shape
    is a ValueError naming it."""
    def replace(name: str, module: torch.nn.Linear) -> torch.nn.Module:
        _checked(directory, name, module, tensors)
        return Nvfp4Linear(module.in_features, module.out_features, module.bias is not None)

    tensors = read_safetensors(directory)
    return load_with_quantized_linears(directory, config, tensors, SCALE_SUFFIX, replace, "NVFP4")


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m ad_mlir.zoo.modelopt MODEL DIRECTORY [--layers N] [--dtype D] [--legacy]`: a
    built-in tiny family or a transformers model type (random weights, as `--model` builds them)
    written to DIRECTORY as a ModelOpt NVFP4 checkpoint."""
    import argparse

    from ad_mlir.zoo.checkpoints import named_model
    from ad_mlir.zoo.tiny import DTYPES

    parser = argparse.ArgumentParser(prog="python -m ad_mlir.zoo.modelopt", description=main.__doc__)
    parser.add_argument("model", help="a built-in tiny family (llama, qwen2, ...) or a transformers model type")
    parser.add_argument("directory")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--dtype", choices=DTYPES, default="bfloat16",
                        help="of the tensors left unquantized (default: bfloat16, as released checkpoints)")
    parser.add_argument("--legacy", action="store_true",
                        help="hf_quant_config.json only, no quantization_config in config.json (older exports)")
    args = parser.parse_args(argv)
    model = named_model(args.model, args.dtype, args.layers)
    print(write_nvfp4_checkpoint(model, args.directory, legacy=args.legacy))


if __name__ == "__main__":
    main()
