"""Generate text with a model compiled by ad-mlir with K/V caches (`ad_mlir.LLM`).

    python -m ad_mlir.generate                                    # SmolLM2-135M-Instruct, a default question
    python -m ad_mlir.generate --model smollm2 --prompt "What is the capital of France?"
    python -m ad_mlir.generate --model path/to/model.gguf --prompt "..." --max-new-tokens 64
    python -m ad_mlir.generate --model llama --prompt-ids 5 9 13  # a tiny built-in family (random weights)
    python -m ad_mlir.generate --benchmark                        # also HF eager generate, same prompt
    python -m ad_mlir.generate --kv-cache-budget 100000000         # caches sized to 100 MB (CUDA: or 0.9)

Where a GPU is visible the model runs there in bfloat16 (`--device`, `--dtype`). On the CPU it
runs in float32 and the kernels as their torch reference (`--interpret`: in the Triton
interpreter, slow: minutes for SmolLM2). The answer is greedy unless `--temperature` is above 0.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ad_mlir.zoo.tiny import DTYPES

if TYPE_CHECKING:  # torch loads after the arguments are parsed: --help stays fast
    from ad_mlir.llm.engine import GenerationOutput
    from ad_mlir.llm.llm import LLM

DEFAULT_PROMPT = "What is the capital of France?"
BENCHMARK_REPEATS = 5


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ad_mlir.generate", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--model", default="smollm2", help="smollm2, a tiny family (llama, qwen2, mistral, gemma), a "
                   "checkpoint directory or a .gguf file (default: smollm2)")
    p.add_argument("--prompt", action="append", help=f"a prompt (repeat for a batch; default: '{DEFAULT_PROMPT}')")
    p.add_argument("--prompt-ids", type=int, nargs="+", action="append",
                   help="a prompt as token ids (models without a tokenizer; repeat for a batch)")
    p.add_argument("--no-chat", action="store_true", help="do not apply the model's chat template to --prompt")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-batch", type=int, default=4, help="cache slots (sequences in flight)")
    p.add_argument("--max-seq-len", type=int, default=None, help="tokens a cache slot holds (default 512; with "
                   "--kv-cache-budget the most a slot may hold, default the model's max_position_embeddings)")
    p.add_argument("--kv-cache-budget", type=_budget, default=None, metavar="BYTES|FRACTION",
                   help="size the caches from a memory budget instead: bytes (an integer), or on CUDA a fraction in "
                   "(0, 1] of the device memory free after one forward pass; --max-batch slots share it")
    p.add_argument("--page-size", type=int, default=16, help="tokens per page of the paged K/V cache (a power "
                   "of two; 0: the slot form, each sequence reserving --max-seq-len tokens). States kept per "
                   "sequence (convolutions, scans) sit beside the pages in --max-batch state slots; a model the "
                   "paged form refuses (states without attention, DeepSeek sparse attention) gets the slot form, "
                   "with a warning")
    p.add_argument("--kv-cache-dtype", default="auto", help="what attention's K/V cache "
                   "holds: auto (the model's dtype) or fp8 / fp8_e4m3 (float8_e4m3fn with per-tensor scales of 1.0, "
                   "half the bytes of bf16)")
    p.add_argument("--speculative-ngram", type=int, default=0, metavar="K", help="speculative decoding by prompt "
                   "lookup: draft up to K tokens per decode, verified in the same step (the paged form; the tokens "
                   "are those of plain decoding; default 0: off)")
    p.add_argument("--no-cuda-graphs", action="store_true", help="on CUDA, run decode steps without CUDA graphs")
    p.add_argument("--device", default=None, help="where the model runs: cpu, cuda, cuda:1 ... (default: cuda "
                   "where a GPU is visible, else cpu)")
    p.add_argument("--dtype", default="auto", choices=("auto", *DTYPES), help="the weights' dtype (default auto: "
                   "bfloat16 on CUDA, float32 on the CPU)")
    p.add_argument("--pipeline", default="default")
    p.add_argument("--interpret", action="store_true", help="without CUDA, run the kernels in the Triton "
                   "interpreter instead of their torch reference")
    p.add_argument("--benchmark", action="store_true", help="time prefill and decode, and HF eager generate on the "
                   "same prompts")
    p.add_argument("-v", "--verbose", action="store_true", help="log the compilation")
    return p.parse_args(argv)


def _budget(text: str) -> int | float:
    """Bytes when `text` is an integer, else a fraction (checked by `LLM`)."""
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is neither bytes (an integer) nor a fraction") from None


def main(argv: Sequence[str] | None = None) -> None:
    args = _parse(argv)
    if args.interpret:
        from ad_mlir.codegen.interpreter import use_interpreter

        use_interpreter()  # before the import below: it imports triton
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    from ad_mlir.llm.llm import cache_layout, paged_where_possible
    from ad_mlir.llm.speculative import NgramProposer
    from ad_mlir.zoo.checkpoints import load_causal_lm

    start = time.perf_counter()
    try:
        model, tokenizer = load_causal_lm(args.model, args.device, args.dtype)
        llm = paged_where_possible(model, args.page_size or None, tokenizer=tokenizer, max_batch=args.max_batch,
                                   max_seq_len=args.max_seq_len, pipeline=args.pipeline,
                                   kv_cache_budget=args.kv_cache_budget, kv_cache_dtype=args.kv_cache_dtype,
                                   cuda_graphs=False if args.no_cuda_graphs else None,
                                   speculative=NgramProposer(args.speculative_ngram) if args.speculative_ngram else None)
    except ValueError as e:
        sys.exit(f"error: {e}")
    print(f"{args.model}: loaded and compiled in {time.perf_counter() - start:.1f} s "
          f"(compile {llm.compile_seconds:.1f} s); the caches hold {llm.cache_tokens} tokens ({cache_layout(llm)}, "
          f"{llm.cache_bytes / 2**20:.1f} MiB)", file=sys.stderr)
    prompts: list[str | list[int]] = args.prompt_ids or args.prompt or [DEFAULT_PROMPT]
    chat = not args.no_chat and llm.tokenizer is not None and llm.tokenizer.chat_template is not None
    try:
        start = time.perf_counter()
        outputs = llm.generate(prompts, args.max_new_tokens, args.temperature, args.top_p, args.seed, chat=chat)
        seconds = time.perf_counter() - start
    except ValueError as e:
        sys.exit(f"error: {e}")
    for prompt, out in zip(prompts, outputs, strict=True):
        print(f"> {prompt}")
        print(out.text if out.text is not None else out.token_ids)
    tokens = sum(len(o.token_ids) for o in outputs)
    print(f"{tokens} tokens in {seconds:.2f} s ({tokens / seconds:.1f} tokens/s)", file=sys.stderr)
    if args.benchmark:
        _benchmark(llm, outputs)


def _benchmark(llm: LLM, outputs: list[GenerationOutput]) -> None:
    """Prefill time, time per decode token and tokens/s of ad-mlir and of HF eager `generate`
    (greedy, HF's dynamic cache) on the same prompts, one prompt at a time. Each time is the
    fastest of `BENCHMARK_REPEATS` runs, the three runs taken in turn in each round: a decode step
    of a tiny model is below the noise of one run on a loaded machine, and the prefill (a
    one-token generation) subtracted from the whole generation must not take its samples in a
    slower stretch than it."""
    import torch

    def timed(run: Callable[..., object], *args: object, **kwargs: object) -> float:
        start = time.perf_counter()
        run(*args, **kwargs)
        return time.perf_counter() - start

    for out in outputs:
        ids = out.prompt_token_ids
        n = len(out.token_ids)
        rounds = []
        with torch.no_grad():
            for _ in range(BENCHMARK_REPEATS):
                rounds.append((timed(llm.generate, [ids], max_new_tokens=1),
                               timed(llm.generate, [ids], max_new_tokens=n),
                               timed(llm.model.generate, torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n,
                                     do_sample=False, use_cache=True)))
        prefill, ours, hf = (min(times) for times in zip(*rounds, strict=True))
        per_token = (ours - prefill) / max(n - 1, 1)
        print(f"prompt of {len(ids)} tokens, {n} new: ad-mlir prefill {prefill * 1e3:.0f} ms, "
              f"{per_token * 1e3:.0f} ms per decode token, {n / ours:.1f} tokens/s; "
              f"HF eager {n / hf:.1f} tokens/s ({hf * 1e3 / n:.0f} ms per token)")


if __name__ == "__main__":
    main()
