"""ad-bench's quantized part: one model written as a checkpoint in each quantized format the
loader takes for a dense model (fine-grained FP8, compressed-tensors FP8, GPTQ and AWQ int4,
NVFP4) and as a plain bf16 checkpoint, each loaded by `ad_mlir.LLM(path)` in bf16, in one run:

- the compiled graph's weight bytes, and the modelled HBM bytes of one decode step at batch 1
  (`bench/decode_traffic.py`: every kernel reads its operands and writes its results once)
  against the bf16 checkpoint's: what a memory-bound decode step would read on a GPU;
- the quantized ops the graph holds (`ad.linear_fp8_block` ...: the format was understood, not
  dequantized at load);
- CPU decode speed with the kernels as their torch reference (which dequantizes a weight at each
  call: on the CPU a quantized model is not faster; it shows what the reference path costs), after
  checking its greedy tokens against the loaded model's eager `generate` (a wrong run is not timed).

The model is SmolLM2-135M's shape (Llama: hidden 576, 9 query / 3 key-value heads, intermediate
1536, tied embeddings) with random weights, `LAYERS` decoder layers (`QUICK_LAYERS` with --quick).
The int4 formats use groups of 64 (576 is not a multiple of 128). MXFP4 quantizes MoE experts
only (gpt-oss), so a dense model has no MXFP4 form: not in this part."""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

LAYERS = 30
QUICK_LAYERS = 2
NEW_TOKENS = 16
INT4_GROUP = 64


def _writers() -> dict[str, Callable[[Any, Path], Path]]:
    """Format name -> a writer of a model to a checkpoint directory in that format."""
    from ad_mlir.zoo.awq import write_awq_checkpoint
    from ad_mlir.zoo.ct_fp8 import write_fp8_dynamic_checkpoint
    from ad_mlir.zoo.gptq import write_gptq_checkpoint
    from ad_mlir.zoo.modelopt import write_nvfp4_checkpoint
    from ad_mlir.zoo.quantized import write_fp8_block_checkpoint

    def plain(model: Any, directory: Path) -> Path:
        model.save_pretrained(directory)
        return directory

    return {
        "bf16": plain,
        "FP8 blocks 128x128": write_fp8_block_checkpoint,
        "compressed-tensors FP8 (channel)": write_fp8_dynamic_checkpoint,
        "GPTQ int4 (g64)": lambda m, d: write_gptq_checkpoint(m, d, group_size=INT4_GROUP),
        "AWQ int4 (g64)": lambda m, d: write_awq_checkpoint(m, d, group_size=INT4_GROUP),
        "NVFP4": write_nvfp4_checkpoint,
    }


def smollm2_shape(layers: int) -> torch.nn.Module:
    """SmolLM2-135M's shape with `layers` decoder layers, random weights, in bf16."""
    from ad_mlir.bench.generate import smollm2_or_its_shape

    return smollm2_or_its_shape(layers)[0].to(torch.bfloat16)


def run_quantized(quick: bool, progress: Callable[[str], None] = lambda _: None,
                  model: torch.nn.Module | None = None, new_tokens: int = NEW_TOKENS,
                  formats: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """One row per format (the bf16 checkpoint first; `formats` names some of `_writers()`'s);
    `model` (bf16) replaces SmolLM2's shape."""
    model = model if model is not None else smollm2_shape(QUICK_LAYERS if quick else LAYERS)
    name = f"{type(model).__name__}, {model.config.num_hidden_layers} layers, hidden {model.config.hidden_size}"
    writers = _writers()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ad_mlir_quantized_") as scratch:
        for fmt in ["bf16", *[f for f in formats or writers if f != "bf16"]]:
            write = writers[fmt]
            progress(f"quantized: {fmt}")
            path = write(model, Path(scratch) / fmt.split()[0].lower())
            rows.append({"kind": "quantized", "model": name, "format": fmt, **_measure(path, new_tokens)})
    base = rows[0]
    for row in rows:
        row["decode_bytes_vs_bf16"] = row["decode_bytes"] / base["decode_bytes"]
        row["decode_speed_vs_bf16"] = row["decode_tok_per_s"] / base["decode_tok_per_s"]
    return rows


def _measure(path: Path, new_tokens: int) -> dict[str, Any]:
    """A checkpoint's weight bytes, modelled decode bytes, quantized ops and CPU decode speed."""
    import ad_mlir
    from ad_mlir.bench.decode_traffic import decode_step_traffic
    from ad_mlir.bench.generate import PROMPT_TOKENS, same_tokens, seconds
    from ad_mlir.runtime.kernels import reference_kernels
    from ad_mlir.zoo.checkpoints import load_causal_lm

    model, _ = load_causal_lm(str(path), dtype="bfloat16")
    llm = ad_mlir.LLM(model, max_batch=1, max_seq_len=PROMPT_TOKENS + new_tokens)
    prompt = [[(7 * i) % 1000 + 100 for i in range(PROMPT_TOKENS)]]
    ids = torch.tensor(prompt)

    def ours(n: int) -> Any:
        return llm.generate(prompt, max_new_tokens=n, ignore_eos=True)

    with torch.no_grad(), reference_kernels():
        eager = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                               attention_mask=torch.ones_like(ids))
        same = same_tokens(ours(new_tokens), eager, exact=False)
        total, prefill = seconds(lambda: ours(new_tokens), llm.device), seconds(lambda: ours(1), llm.device)
    decode = max(total - prefill, 1e-9)
    traffic = decode_step_traffic(llm.program, 1, PROMPT_TOKENS)
    ops = Counter(op.name for op in llm.program.function.body.block.ops if op.name.startswith("ad.linear_"))
    return {"weight_bytes": traffic["ideal_weights_bytes"], "decode_bytes": traffic["modelled_bytes"],
            "quantized_ops": dict(sorted(ops.items())), "decode_ms_per_step": decode / (new_tokens - 1) * 1e3,
            "decode_tok_per_s": (new_tokens - 1) / decode, "same_tokens_as_eager": same}
