"""AWQ int4 checkpoints (as AutoAWQ and GPTQModel write them in AWQ's "gemm" layout, the Hub's
`*-AWQ` models): a writer that makes one from a small model, and the loader
`checkpoints.load_checkpoint` calls.

The format: config.json holds `quantization_config = {"quant_method": "awq", "bits": 4,
"group_size": g, "zero_point": true, "version": "gemm", "modules_to_not_convert": ...}`; in the
safetensors each quantized linear `<name>` has `qweight` int32 [K, N / 8] (packed along N),
`qzeros` int32 [ceil(K / g), N / 8] and `scales` float16 [ceil(K / g), N], both packed words in
AWQ's interleaved nibble order (`zoo/int4.py`'s `AWQ_ORDER`), zero points stored as they are
(`w = (code - zero) * scale`), no `g_idx`; the bias if the linear has one. Linears named in
`modules_to_not_convert`, and the LM head, stay in the model's dtype.

Loaded here, a quantized linear is `zoo/gptq.py`'s `Int4Linear` (zero offset 0, no g_idx): its
`qweight` and `qzeros` repacked into `ad.linear_int4`'s layout (along K, the plain nibble order),
the same codes, so the same arithmetic. transformers' loader for this format needs the `gptqmodel`
package, which ad-mlir does not install. Imports nothing of the compiler.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import transformers

from ad_mlir.zoo.gptq import (
    PACKED_SUFFIX,
    Int4Linear,
    checked_int4,
    group_size_of,
    refuse,
    write_checkpoint,
)
from ad_mlir.zoo.int4 import AWQ_ORDER, BITS, awq_to_rows, pack_columns, quantize_groups
from ad_mlir.zoo.quantized import load_with_quantized_linears, read_safetensors

QUANT_METHOD = "awq"
VERSIONS = ("gemm",)


def awq_group_size(quantization_config: dict[str, Any]) -> int:
    """The group size of a config.json's AWQ `quantization_config` as we load it; a ValueError
    naming the field and its value for anything else: bits other than 4 (`bits` or AutoAWQ's
    `w_bit`), a version other than "gemm" ("gemv", "gemv_fast", "exllama", "ipex", "marlin" pack
    their words otherwise), no zero points."""
    if quantization_config.get("quant_method") != QUANT_METHOD:
        raise refuse(quantization_config, "quant_method", f"not a {QUANT_METHOD} checkpoint")
    bits = "bits" if "bits" in quantization_config else "w_bit"
    if quantization_config.get(bits) != BITS:
        raise refuse(quantization_config, bits, "not supported; ad-mlir loads 4-bit AWQ checkpoints")
    version = quantization_config.get("version", "gemm")
    if not isinstance(version, str) or version.lower() not in VERSIONS:
        raise refuse(quantization_config, "version", "not supported; ad-mlir loads AWQ's \"gemm\" layout")
    if quantization_config.get("zero_point", True) is not True:
        raise refuse(quantization_config, "zero_point", "not supported; ad-mlir loads AWQ with zero points")
    return group_size_of(quantization_config, "group_size" if "group_size" in quantization_config else "q_group_size")


def awq_config(group_size: int, modules_to_not_convert: Sequence[str] = ()) -> dict[str, Any]:
    """The `quantization_config` AutoAWQ writes for its GEMM version."""
    return {"quant_method": QUANT_METHOD, "bits": BITS, "group_size": group_size, "zero_point": True,
            "version": "gemm", "modules_to_not_convert": list(modules_to_not_convert) or None}


def write_awq_checkpoint(model: transformers.PreTrainedModel, directory: str | Path, group_size: int = 128,
                         modules_to_not_convert: Sequence[str] = ()) -> Path:
    """Write `model` to `directory` as an AWQ GEMM checkpoint (see the module docstring), each
    linear quantized round-to-nearest with zero points (`zoo/int4.py`'s `quantize_groups`, AWQ's
    asymmetric grid, without AWQ's activation-aware scaling search: the layout is the format's)."""
    config = awq_config(group_size, modules_to_not_convert)
    awq_group_size(config)

    def quantize(name: str, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        weight = state[f"{name}.weight"]
        codes, zeros, scales = quantize_groups(weight, weight.shape[1] if group_size == -1 else group_size, False)
        return {"qweight": pack_columns(codes, AWQ_ORDER), "qzeros": pack_columns(zeros, AWQ_ORDER),
                "scales": scales}

    return write_checkpoint(model, directory, config, quantize, modules_to_not_convert)


def load_awq_checkpoint(directory: Path, config: transformers.PretrainedConfig,
                        group_size: int) -> transformers.PreTrainedModel:
    """The model of `config` (its quantization_config dropped) with the checkpoint's tensors:
    each linear that has a `qweight` becomes an `Int4Linear`, its words repacked
    (`zoo/int4.py`'s `awq_to_rows`, lossless), the scales kept as they are; every other tensor
    loads as it is. A tensor of the wrong dtype or shape, or one the model lacks, is a ValueError
    naming it."""
    def replace(name: str, module: torch.nn.Linear) -> torch.nn.Module:
        k, n = module.in_features, module.out_features
        checked_int4(directory, name, module, tensors, group_size, (k, n // 8))
        if f"{name}.g_idx" in tensors:
            raise ValueError(f"'{directory}': {name}.g_idx: AWQ has no act-order")
        tensors[f"{name}.qweight"], tensors[f"{name}.qzeros"] = awq_to_rows(tensors[f"{name}.qweight"],
                                                                            tensors[f"{name}.qzeros"])
        return Int4Linear(k, n, k if group_size == -1 else group_size, 0, False, module.bias is not None,
                          tensors[f"{name}.scales"].dtype)

    tensors = read_safetensors(directory)
    return load_with_quantized_linears(directory, config, tensors, PACKED_SUFFIX, replace, "AWQ int4")


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m ad_mlir.zoo.awq MODEL DIRECTORY [--group-size G] [--layers N] [--dtype D]`: a
    built-in tiny family or a transformers model type (random weights, as `--model` builds them)
    written to DIRECTORY as an AWQ GEMM int4 checkpoint."""
    import argparse

    from ad_mlir.zoo.checkpoints import named_model
    from ad_mlir.zoo.tiny import DTYPES

    parser = argparse.ArgumentParser(prog="python -m ad_mlir.zoo.awq", description=main.__doc__)
    parser.add_argument("model", help="a built-in tiny family (llama, qwen2, ...) or a transformers model type")
    parser.add_argument("directory")
    parser.add_argument("--group-size", type=int, default=128, help="-1: one group over K (default: 128)")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--dtype", choices=DTYPES, default="float16",
                        help="of the tensors left unquantized (default: float16, as released checkpoints)")
    args = parser.parse_args(argv)
    model = named_model(args.model, args.dtype, args.layers)
    print(write_awq_checkpoint(model, args.directory, args.group_size))


if __name__ == "__main__":
    main()
