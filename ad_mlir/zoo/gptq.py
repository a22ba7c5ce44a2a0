"""GPTQ int4 checkpoints (as GPTQModel, AutoGPTQ and optimum write them, the Hub's `*-GPTQ-Int4`
models): a writer that makes one from a small model, and the loader `checkpoints.load_checkpoint`
calls; the module both int4 formats load into (`Int4Linear`).

The format: config.json holds `quantization_config = {"quant_method": "gptq", "bits": 4,
"group_size": g (-1: one group over K), "sym": ..., "desc_act": ..., "checkpoint_format": "gptq",
...}`; in the safetensors each quantized linear `<name>` has `qweight` int32 [K / 8, N] (packed
along K), `qzeros` int32 [ceil(K / g), N / 8] (packed along N), `scales` float16 [ceil(K / g), N]
and `g_idx` int32 [K] (each input row's group: `k // g`, or with `desc_act` (act-order) the
groups of the rows in the order GPTQ quantized them), the bias if the linear has one; the nibble
layouts and the arithmetic are `zoo/int4.py`'s. The "gptq" checkpoint format (v1) stores each
zero point minus one, "gptq_v2" as it is. The LM head, the embeddings and the norms keep the
model's dtype.

Loaded here, a quantized linear is an `Int4Linear` keeping the packed words, the scales in the
file's dtype (through `model.to(dtype)` too) and `g_idx` only where it is not the trivial `k //
g`; linears whose `g_idx` are equal (GPTQ's Q/K/V, gate/up: one input, one Hessian, one
act-order) share one tensor, so that `fuse-gemms` can merge them. transformers' own loader needs
the `gptqmodel` and `optimum` packages for this format (a GPU-oriented build), which ad-mlir does
not install: the tests' reference is the dequantized copy `zoo/int4.py` computes. Imports nothing
of the compiler.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
import transformers

from ad_mlir.zoo.int4 import BITS, dequantize, int4_linear, pack_columns, pack_rows, quantize_groups
from ad_mlir.zoo.quantized import (
    KeepsQuantizedTensors,
    linear_names,
    load_with_quantized_linears,
    module_name,
    read_safetensors,
)

QUANT_METHOD = "gptq"
ZERO_OFFSETS = {"gptq": 1, "gptq_v2": 0}
"""Checkpoint format -> what is added to each stored zero point (v1 stores it minus one)."""
PACKED_SUFFIX = ".qweight"
INT4_TENSORS = ("qweight", "qzeros", "scales", "g_idx")
SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def refuse(quantization_config: dict[str, Any], field: str, why: str) -> ValueError:
    return ValueError(f"quantization_config.{field} = {json.dumps(quantization_config.get(field))}: {why}")


def group_size_of(quantization_config: dict[str, Any], field: str = "group_size") -> int:
    """The config's group size: a positive multiple of 8, or -1 (one group over K); else a
    ValueError naming the field."""
    size = quantization_config.get(field)
    if type(size) is not int or not (size == -1 or (size > 0 and size % 8 == 0)):
        raise refuse(quantization_config, field, "must be -1 (one group) or a positive multiple of 8")
    return size


def gptq_settings(quantization_config: dict[str, Any]) -> tuple[int, int]:
    """(group_size, zero_offset) of a config.json's GPTQ `quantization_config` as we load it; a
    ValueError naming the field and its value for anything else: bits other than 4, a checkpoint
    format other than "gptq" (v1) or "gptq_v2" (e.g. "marlin", "bitblas": kernel-specific
    repackings), words other than int32, a quantized LM head, per-module overrides (`dynamic`)."""
    if quantization_config.get("quant_method") != QUANT_METHOD:
        raise refuse(quantization_config, "quant_method", f"not a {QUANT_METHOD} checkpoint")
    if quantization_config.get("bits") != BITS:
        raise refuse(quantization_config, "bits", "not supported; ad-mlir loads 4-bit GPTQ checkpoints")
    field = "checkpoint_format" if "checkpoint_format" in quantization_config else "format"
    if quantization_config.get(field, "gptq") not in ZERO_OFFSETS:
        raise refuse(quantization_config, field, f"not supported; ad-mlir loads {' and '.join(map(repr, ZERO_OFFSETS))}")
    if quantization_config.get("pack_dtype", "int32") != "int32":
        raise refuse(quantization_config, "pack_dtype", "not supported; ad-mlir loads int32 words")
    if quantization_config.get("lm_head", False):
        raise refuse(quantization_config, "lm_head", "not supported; the LM head is loaded unquantized")
    if quantization_config.get("dynamic"):
        raise refuse(quantization_config, "dynamic", "not supported; one setting for every module")
    if type(quantization_config.get("desc_act", False)) is not bool:
        raise refuse(quantization_config, "desc_act", "must be true or false")
    return group_size_of(quantization_config), ZERO_OFFSETS[quantization_config.get(field, "gptq")]


class Int4Linear(KeepsQuantizedTensors, torch.nn.Module):
    """A 4-bit weight-only linear in `ad.linear_int4`'s layout (`zoo/int4.py`): `qweight` int32
    [K / 8, N], `qzeros` int32 [G, N / 8], `scales` [G, N] and, with act-order, `g_idx` int32 [K].
    The scales keep their dtype when the module is cast (they move to a device only: cast to
    bf16 they would lose bits); the bias follows the cast. Its forward is `int4_linear`."""

    QUANTIZED = ("scales",)

    def __init__(self, in_features: int, out_features: int, group_size: int, zero_offset: int, act_order: bool,
                 bias: bool, scale_dtype: torch.dtype = torch.float16) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.group_size, self.zero_offset = group_size, zero_offset
        groups = -(-in_features // group_size)

        def frozen(*shape: int, dtype: torch.dtype) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)

        self.qweight = frozen(in_features // 8, out_features, dtype=torch.int32)
        self.qzeros = frozen(groups, out_features // 8, dtype=torch.int32)
        self.scales = frozen(groups, out_features, dtype=scale_dtype)
        self.g_idx = frozen(in_features, dtype=torch.int32) if act_order else None
        self.bias = torch.nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """`int4_linear`; the export routes this method through `ad.linear_int4`
        (`frontends/export_patches.py`)."""
        return int4_linear(input, self.qweight, self.qzeros, self.scales, self.g_idx, self.bias, self.group_size,
                           self.zero_offset)

    def dequantized(self) -> torch.Tensor:
        """The weight [N, K] in float32."""
        return dequantize(self.qweight, self.qzeros, self.scales, self.g_idx, self.group_size, self.zero_offset)


def act_order_groups(importance: torch.Tensor, group_size: int) -> torch.Tensor:
    """g_idx [K] of act-order: the rows taken by decreasing `importance` (GPTQ's order: the
    Hessian's diagonal), each run of `group_size` of them one group."""
    order = torch.argsort(importance, descending=True, stable=True)
    g_idx = torch.empty_like(order)
    g_idx[order] = torch.arange(order.numel()) // group_size
    return g_idx.to(torch.int32)


SHARED_INPUTS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""Projections that read one input: GPTQ computes one Hessian, so one act-order, for them."""


def _importance(tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """A stand-in for the Hessian's diagonal of `name`'s input (no calibration data here): the
    squared column norms of the weights that read that input, summed (Q/K/V, gate/up together)."""
    parent, _, leaf = name.rpartition(".")
    siblings = next((group for group in SHARED_INPUTS if leaf in group), (leaf,))
    weights = [tensors[f"{parent}.{s}.weight"] for s in siblings if f"{parent}.{s}.weight" in tensors]
    return sum(w.float().pow(2).sum(0) for w in weights)


def write_checkpoint(model: transformers.PreTrainedModel, directory: str | Path, quantization_config: dict[str, Any],
                     quantize: Callable[[str, dict[str, torch.Tensor]], dict[str, torch.Tensor]],
                     modules_to_not_convert: Sequence[str] = ()) -> Path:
    """Write `model` to `directory`: config.json with `quantization_config`, generation_config.json,
    model.safetensors with each linear but the LM head (and `modules_to_not_convert`) replaced by
    the tensors `quantize(name, state)` gives (suffix -> tensor), every other tensor in the
    model's dtype (tied weights once, as `save_pretrained` writes them)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    original = {name: t.detach().contiguous() for name, t in model.state_dict().items()}
    tensors = dict(original)
    head = model.get_output_embeddings()
    if head is not None and head.weight is model.get_input_embeddings().weight:
        del tensors[f"{module_name(model, head)}.weight"]
    for name in linear_names(model, modules_to_not_convert):
        del tensors[f"{name}.weight"]
        tensors.update({f"{name}.{suffix}": t.contiguous() for suffix, t in quantize(name, original).items()})
    hf_config = model.config.to_dict()
    hf_config["quantization_config"] = quantization_config
    hf_config.pop("_name_or_path", None)
    (directory / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
    model.generation_config.save_pretrained(directory)
    safetensors.torch.save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def gptq_config(group_size: int, sym: bool, desc_act: bool, checkpoint_format: str = "gptq") -> dict[str, Any]:
    """The `quantization_config` GPTQModel writes (the fields that describe the layout, and its
    defaults for the others)."""
    return {"quant_method": QUANT_METHOD, "bits": BITS, "group_size": group_size, "sym": sym, "desc_act": desc_act,
            "checkpoint_format": checkpoint_format, "pack_dtype": "int32", "lm_head": False, "damp_percent": 0.01,
            "true_sequential": True, "static_groups": False}


def write_gptq_checkpoint(model: transformers.PreTrainedModel, directory: str | Path, group_size: int = 128,
                          sym: bool = True, desc_act: bool = False, checkpoint_format: str = "gptq") -> Path:
    """Write `model` to `directory` as a GPTQ int4 checkpoint (see the module docstring), each
    linear quantized round-to-nearest (`zoo/int4.py`'s `quantize_groups`) on GPTQ's grid; with
    `desc_act`, the groups follow an act-order (`act_order_groups`) shared by the projections that
    read one input. A v1 (`checkpoint_format` "gptq") zero point is stored minus one, so 0 cannot
    be stored (AutoGPTQ's would wrap to 15): such zero points are raised to 1."""
    config = gptq_config(group_size, sym, desc_act, checkpoint_format)
    gptq_settings(config)
    offset = ZERO_OFFSETS[checkpoint_format]

    def quantize(name: str, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        weight = state[f"{name}.weight"]
        k = weight.shape[1]
        size = k if group_size == -1 else group_size
        g_idx = act_order_groups(_importance(state, name), size) if desc_act else (
            torch.arange(k, dtype=torch.int32) // size)
        codes, zeros, scales = quantize_groups(weight, size, sym, g_idx, min_zero=offset)
        return {"qweight": pack_rows(codes), "qzeros": pack_columns(zeros - offset), "scales": scales,
                "g_idx": g_idx}

    return write_checkpoint(model, directory, config, quantize)


def checked_int4(directory: Path, name: str, module: torch.nn.Linear, tensors: dict[str, torch.Tensor],
                 group_size: int, packed_shape: tuple[int, int]) -> int:
    """The number of groups of `name`'s int4 tensors after checking their dtypes and shapes
    (`qweight` int32 `packed_shape`, `qzeros` int32 [G, N / 8], `scales` float [G, N]); a
    ValueError naming the tensor."""
    n, k = module.out_features, module.in_features
    groups = -(-k // (k if group_size == -1 else group_size))
    expected = {"qweight": (torch.int32, packed_shape), "qzeros": (torch.int32, (groups, n // 8)),
                "scales": (None, (groups, n))}
    if k % 8 or n % 8:
        raise ValueError(f"'{directory}': {name} is [{n}, {k}]: 4-bit packing needs both a multiple of 8")
    for suffix, (dtype, shape) in expected.items():
        t = tensors.get(f"{name}.{suffix}")
        if t is None or tuple(t.shape) != shape or t.dtype != (dtype or t.dtype) or (
                dtype is None and t.dtype not in SCALE_DTYPES):
            got = "missing" if t is None else f"{t.dtype} {list(t.shape)}"
            raise ValueError(f"'{directory}': {name}.{suffix} is {got}, expected {dtype or 'float'} {list(shape)} "
                             f"for a [{n}, {k}] linear in groups of {group_size}")
    return groups


def _is_trivial(g_idx: torch.Tensor, group_size: int) -> bool:
    return torch.equal(g_idx.to(torch.int64), torch.arange(g_idx.numel()) // group_size)


def share_equal_g_idx(model: torch.nn.Module) -> None:
    """Linears whose `g_idx` are equal hold one tensor (see the module docstring)."""
    seen: list[torch.nn.Parameter] = []
    for module in model.modules():
        if isinstance(module, Int4Linear) and module.g_idx is not None:
            same = next((p for p in seen if torch.equal(p, module.g_idx)), None)
            if same is None:
                seen.append(module.g_idx)
            else:
                module.g_idx = same


def load_gptq_checkpoint(directory: Path, config: transformers.PretrainedConfig, group_size: int,
                         zero_offset: int) -> transformers.PreTrainedModel:
    """The model of `config` (its quantization_config dropped: no transformers quantizer runs)
    with the checkpoint's tensors: each linear that has a `qweight` becomes an `Int4Linear`
    keeping the packed words and the scales, its `g_idx` dropped where it is the trivial `k // g`
    (and the equal ones shared); every other tensor loads as it is (cast by the caller). A tensor
    of the wrong dtype or shape, a `g_idx` out of range or a tensor the model lacks is a
    ValueError naming it."""
    def replace(name: str, module: torch.nn.Linear) -> torch.nn.Module:
        k, n = module.in_features, module.out_features
        groups = checked_int4(directory, name, module, tensors, group_size, (k // 8, n))
        size = k if group_size == -1 else group_size
        g_idx = tensors.pop(f"{name}.g_idx", None)
        if g_idx is not None and (tuple(g_idx.shape) != (k,) or g_idx.dtype not in (torch.int32, torch.int64)
                                  or int(g_idx.min()) < 0 or int(g_idx.max()) >= groups):
            raise ValueError(f"'{directory}': {name}.g_idx must be int32 [{k}] of groups 0..{groups - 1}")
        act_order = g_idx is not None and not _is_trivial(g_idx, size)
        if act_order:
            tensors[f"{name}.g_idx"] = g_idx.to(torch.int32)
        return Int4Linear(k, n, size, zero_offset, act_order, module.bias is not None,
                          tensors[f"{name}.scales"].dtype)

    tensors = read_safetensors(directory)
    model = load_with_quantized_linears(directory, config, tensors, PACKED_SUFFIX, replace, "GPTQ int4")
    share_equal_g_idx(model)
    return model


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m ad_mlir.zoo.gptq MODEL DIRECTORY [--group-size G] [--asym] [--desc-act]
    [--checkpoint-format gptq|gptq_v2] [--layers N] [--dtype D]`: a built-in tiny family or a
    transformers model type (random weights, as `--model` builds them) written to DIRECTORY as a
    GPTQ int4 checkpoint."""
    import argparse

    from ad_mlir.zoo.checkpoints import named_model
    from ad_mlir.zoo.tiny import DTYPES

    parser = argparse.ArgumentParser(prog="python -m ad_mlir.zoo.gptq", description=main.__doc__)
    parser.add_argument("model", help="a built-in tiny family (llama, qwen2, ...) or a transformers model type")
    parser.add_argument("directory")
    parser.add_argument("--group-size", type=int, default=128, help="-1: one group over K (default: 128)")
    parser.add_argument("--asym", action="store_true", help="zero points per group (default: symmetric, sym=true)")
    parser.add_argument("--desc-act", action="store_true", help="act-order groups (g_idx)")
    parser.add_argument("--checkpoint-format", choices=tuple(ZERO_OFFSETS), default="gptq")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--dtype", choices=DTYPES, default="float16",
                        help="of the tensors left unquantized (default: float16, as released checkpoints)")
    args = parser.parse_args(argv)
    model = named_model(args.model, args.dtype, args.layers)
    print(write_gptq_checkpoint(model, args.directory, args.group_size, not args.asym, args.desc_act,
                                args.checkpoint_format))


if __name__ == "__main__":
    main()
