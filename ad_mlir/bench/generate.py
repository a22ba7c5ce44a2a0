"""ad-bench's generate part: tokens per second of `ad_mlir.LLM` against HF eager `generate`
(its own DynamicCache, greedy, SDPA) on the same model, prompts and number of new tokens, EOS
ignored so that both produce every token.

The model is the packaged SmolLM2-135M-Instruct when its package is installed, else a model of
its shape (Llama, 30 layers, hidden 576, 9 heads / 3 K/V heads) with random weights: speed does
not depend on the weights. bf16 on CUDA, fp32 on the CPU. Prefill and decode are separated by
timing a run that generates 1 token: decode tok/s = batch x (new - 1) / (t(new) - t(1)).
Before timing, ad-mlir's tokens are checked against HF's (`same_tokens`): a wrong run is not
timed. Also the modelled HBM bytes of one decode step against its ideal (`bench/decode_traffic.py`)."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from typing import Any

import torch

PROMPT_TOKENS = 32


def smollm2_or_its_shape(layers: int | None = None) -> tuple[torch.nn.Module, str]:
    """The packaged checkpoint, or (not installed, or `layers` given: a quick run) its shape with
    random weights and `layers` decoder layers (default 30, as the checkpoint)."""
    from ad_mlir.zoo.checkpoints import SMOLLM2, load_causal_lm

    if layers is None and importlib.util.find_spec(SMOLLM2[0]) is not None:
        return load_causal_lm("smollm2")[0], "SmolLM2-135M-Instruct"
    import transformers

    layers = layers or 30
    config = transformers.LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                      num_hidden_layers=layers, num_attention_heads=9, num_key_value_heads=3,
                                      max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
                                      tie_word_embeddings=True)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval(), f"SmolLM2-135M shape ({layers} layers), random weights"


def seconds(run: Callable[[], Any], device: torch.device) -> float:
    """Wall seconds of `run`'s second call (the first warms up)."""
    run()  # warm-up: kernels compiled, allocator primed
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    run()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def _runners(llm: Any, model: torch.nn.Module, prompts: list[list[int]]) -> dict[str, Callable[[int], Any]]:
    """Per implementation: generate `n` new tokens for every prompt, EOS ignored."""
    ids = torch.tensor(prompts, device=llm.device)
    return {
        "ad-mlir": lambda n: llm.generate(prompts, max_new_tokens=n, ignore_eos=True),
        "HF eager": lambda n: model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                             attention_mask=torch.ones_like(ids)),
    }


def run_generate(quick: bool, progress: Callable[[str], None] = lambda _: None) -> list[dict[str, Any]]:
    """One row per implementation and batch size. On the CPU the kernels run as their torch
    reference even where `ad-bench` loaded them for the Triton interpreter (minutes a token)."""
    import ad_mlir
    from ad_mlir.runtime.kernels import reference_kernels

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model, name = smollm2_or_its_shape(4 if quick else None)
    model = model.to(device=device, dtype=dtype)
    batches, new = ((1,), 16) if quick or device.type == "cpu" else ((1, 4, 16), 128)
    llm = ad_mlir.LLM(model, max_batch=max(batches), max_seq_len=PROMPT_TOKENS + new)
    rows = []
    for batch in batches:
        prompts = [[(7 * b + i) % 1000 + 100 for i in range(PROMPT_TOKENS)] for b in range(batch)]
        runners = _runners(llm, model, prompts)
        with torch.no_grad(), reference_kernels():
            same = same_tokens(runners["ad-mlir"](new), runners["HF eager"](new), exact=dtype == torch.float32)
        for impl, run in runners.items():
            progress(f"{impl}, batch {batch}")
            with torch.no_grad(), reference_kernels():
                total, prefill = seconds(lambda r=run: r(new), device), seconds(lambda r=run: r(1), device)
            decode = max(total - prefill, 1e-9)
            rows.append({"kind": "speed", "model": name, "impl": impl, "device": device.type, "dtype": str(dtype).removeprefix("torch."),
                         "batch": batch, "prompt_tokens": PROMPT_TOKENS, "new_tokens": new, "seconds": total,
                         "tok_per_s": batch * new / total, "prefill_s": prefill,
                         "decode_ms_per_step": decode / (new - 1) * 1e3,
                         "decode_tok_per_s": batch * (new - 1) / decode,
                         "compile_s": llm.compile_seconds if impl == "ad-mlir" else None,
                         "same_tokens_as_hf": same if impl == "ad-mlir" else None})
    return rows + decode_traffic_rows(llm, name, batches)


def same_tokens(ours: list[Any], hf: torch.Tensor, exact: bool) -> int:
    """The number of leading new tokens (over all prompts, the fewest) that ad-mlir's outputs
    share with HF's (`hf` holds prompt and new tokens). A run whose tokens are not HF's is not
    timed: fp32 must give every token (the same ops on the same values), bf16 at least the first
    (later ones may part at a near tie, as bf16 rounds differently in each)."""
    from ad_mlir.bench.kernels import BenchmarkError

    expected = hf[:, PROMPT_TOKENS:].tolist()
    leading = []
    for i, (got, want) in enumerate(zip((o.token_ids for o in ours), expected, strict=True)):
        n = next((k for k, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), len(want))
        if n < (len(want) if exact else 1):
            raise BenchmarkError(f"prompt {i}: ad-mlir's tokens {got} are not HF eager's {want} (from token {n})")
        leading.append(n)
    return min(leading)


def decode_traffic_rows(llm: Any, model: str, batches: tuple[int, ...]) -> list[dict[str, Any]]:
    """The modelled HBM bytes of one decode step of `llm`'s compiled graph against its ideal, per
    batch and cached length (a short and a full slot)."""
    from ad_mlir.bench.decode_traffic import decode_step_traffic

    return [{"kind": "decode traffic", "model": model, **decode_step_traffic(llm.program, batch, cached)}
            for batch in batches for cached in (PROMPT_TOKENS, llm.max_seq_len)]
