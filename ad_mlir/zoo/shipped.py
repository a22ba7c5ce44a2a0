"""The quantized format each family's real checkpoints ship in most, and a writer that makes a
family's small model (`zoo/small.py`) a checkpoint in it: the family sweep's quantized column.

- qwen3: fine-grained FP8 (Qwen's own `Qwen3-*-FP8`, blocks [128, 128]);
- deepseek_v3: fine-grained FP8 (DeepSeek-V3/R1 ship only this, blocks [128, 128], the routed
  and shared experts quantized as every other linear); the small model's second layer is made a
  MoE layer (`first_k_dense_replace` 1: DeepSeek-V3's first 3 of 61 layers are dense), so that
  its experts are written as the checkpoint has them;
- gpt_oss: MXFP4 experts (OpenAI ships gpt-oss only this way);
- llama: GPTQ int4, symmetric, act-order (Meta ships bf16; the Hub's quantized Llamas are most
  often GPTQ or AWQ int4, e.g. hugging-quants' `Meta-Llama-3.1-*-GPTQ-INT4`, groups of 128).

The block and group sizes are scaled down from the checkpoints' 128 to 32, so that a weight of
the small model (hidden 128, intermediate 256) has several blocks along each side, as a real
one does. What the format leaves unquantized is written in the model's dtype (fp32 in the sweep;
released checkpoints hold bf16), which `load_causal_lm` casts to fp32 in either case. Imports
nothing of the compiler.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import transformers

from ad_mlir.zoo.gptq import write_gptq_checkpoint
from ad_mlir.zoo.mxfp4 import write_mxfp4_checkpoint
from ad_mlir.zoo.quantized import write_fp8_block_checkpoint

BLOCK = 32
"""The FP8 block side and the int4 group size at the small sizes (128 in real checkpoints)."""


@dataclass(frozen=True)
class ShippedFormat:
    label: str
    """The format as a table shows it."""
    write: Callable[[transformers.PreTrainedModel, Path], Path]
    """(model, directory) -> the checkpoint directory."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Settings of the small config that make the model's layers the kinds the checkpoint holds."""


def _fp8_blocks(model: transformers.PreTrainedModel, directory: Path) -> Path:
    return write_fp8_block_checkpoint(model, directory, (BLOCK, BLOCK))


def _gptq(model: transformers.PreTrainedModel, directory: Path) -> Path:
    return write_gptq_checkpoint(model, directory, BLOCK, sym=True, desc_act=True)


SHIPPED: dict[str, ShippedFormat] = {
    "qwen3": ShippedFormat(f"FP8 blocks {BLOCK}x{BLOCK}", _fp8_blocks),
    "deepseek_v3": ShippedFormat(f"FP8 blocks {BLOCK}x{BLOCK}", _fp8_blocks, {"first_k_dense_replace": 1}),
    "gpt_oss": ShippedFormat("MXFP4 experts", write_mxfp4_checkpoint),
    "llama": ShippedFormat(f"GPTQ int4 g{BLOCK} act-order", _gptq),
}
"""Family -> the format its real checkpoints ship quantized in (see the module docstring)."""
