"""ad-bench's speculative part: SmolLM2-135M-Instruct (the packaged checkpoint: drafts are
accepted only where a real model copies its context) on a task that copies its prompt (correct
a text's spelling, return it in full), decoded greedily by the paged engine plainly and with
n-gram prompt lookup (`ad_mlir.llm.speculative.NgramProposer`), on one compiled model, in one
run: output tokens per second, engine steps, drafted and accepted tokens, and whether the
speculative tokens are the plain ones (they must be, up to a near tie: the verification step
computes a position's logits in a larger batch of rows, which may round differently)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

TEXTS = (
    "The quick brown fox jumps over the lazy dog. It was a brigt cold day in April, and the clocks were "
    "striking thirteen. Winston Smith, his chin nuzzled into his breast in an effort to escape the vile wind, "
    "slipped quickly through the glass doors of Victory Mansions.",
    "Python is a high-level, general-purpose programming langauge. Its design philosophy emphasizes code "
    "readability with the use of significant indentation. Python is dynamically typed and garbage-collected. "
    "It supports multiple programming paradigms, including structured, object-oriented and functional programming.",
    "A compiler is a computer program that translates computer code written in one programming language into "
    "another language. The name compiler is primarily used for programs that translate source code from a "
    "high-level programming language to a lower level language, such as assembly langauge or machine code.",
    "The mitochondrion is an organelle found in the cells of most eukaryotes. Mitochondria use aerobic "
    "respiration to generate adenosine triphosphate, which is used throughout the cell as a source of "
    "chemical energy. They were discovered by Albert von Kolliker in 1857 in the voluntary muscles of insects.",
)
TASK = "Correct the spelling mistakes in the following text and write out the whole corrected text:\n\n"
NEW_TOKENS = 96
DRAFT_TOKENS = (2, 4)


def run_speculative(quick: bool, progress: Callable[[str], None] = lambda _: None) -> list[dict[str, Any]]:
    """One row per way of decoding (plain, n-gram with each draft length) and batch size."""
    import ad_mlir
    from ad_mlir.llm.speculative import NgramProposer
    from ad_mlir.runtime.kernels import reference_kernels
    from ad_mlir.zoo.checkpoints import load_causal_lm

    model, tokenizer = load_causal_lm("smollm2")
    texts = TEXTS[:1] if quick else TEXTS
    new = 32 if quick else NEW_TOKENS
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": TASK + t}], add_generation_prompt=True,
                                             tokenize=True, return_dict=False) for t in texts]
    llm = ad_mlir.LLM(model, tokenizer=tokenizer, max_batch=len(prompts),
                      max_seq_len=max(len(p) for p in prompts) + new, page_size=16)
    rows: list[dict[str, Any]] = []
    for batch in sorted({1, len(prompts)}):
        plain = None
        for k in (0, *DRAFT_TOKENS):
            progress(f"batch {batch}, {'plain' if not k else f'n-gram k={k}'}")
            with torch.no_grad(), reference_kernels():
                row, tokens = _decode(llm, prompts[:batch], new, NgramProposer(k) if k else None)
            plain = plain or tokens
            rows.append({"kind": "speculative", "model": "SmolLM2-135M-Instruct", "batch": batch,
                         "impl": "plain" if not k else f"n-gram k={k}", "new_tokens": new, **row,
                         "same_tokens_as_plain": _same_prefix(tokens, plain)})
    return rows


def _decode(llm: Any, prompts: Sequence[list[int]], new: int, proposer: Any) -> tuple[dict[str, Any], list[list[int]]]:
    """Greedy decoding of `prompts` by the paged engine (drafting with `proposer`), timed on its
    second run (the first warms the allocator and the kernels); its measures and each prompt's
    tokens."""
    _engine_run(llm, prompts, new, proposer)
    start = time.perf_counter()
    engine, tokens, steps = _engine_run(llm, prompts, new, proposer)
    seconds = time.perf_counter() - start
    generated = sum(len(t) for t in tokens)
    return {"seconds": seconds, "output_tokens": generated, "output_tok_per_s": generated / seconds, "steps": steps,
            "drafted_tokens": engine.drafted_tokens, "accepted_tokens": engine.accepted_tokens,
            "acceptance_rate": engine.acceptance_rate, "tokens_per_draft_step": engine.tokens_per_draft_step}, tokens


def _engine_run(llm: Any, prompts: Sequence[list[int]], new: int,
                proposer: Any) -> tuple[Any, list[list[int]], int]:
    """The engine after decoding `prompts` (at most `new` tokens each, to EOS), each prompt's
    tokens, and the engine's steps."""
    from ad_mlir.llm.engine import SamplingParams, make_engine

    engine = make_engine(llm, max_step_tokens=llm.max_seq_len * len(prompts), speculative=proposer)
    requests = [engine.add(p, SamplingParams(max_tokens=new)) for p in prompts]
    steps = 0
    while engine.has_work:
        engine.step()
        steps += 1
    return engine, [r.output.token_ids for r in requests], steps


def _same_prefix(tokens: list[list[int]], plain: list[list[int]]) -> str:
    """'all' when every prompt's tokens are the plain ones, else the fewest leading tokens shared."""
    shared = [next((i for i, (a, b) in enumerate(zip(t, p, strict=False)) if a != b), min(len(t), len(p)))
              for t, p in zip(tokens, plain, strict=True)]
    return "all" if all(t == p for t, p in zip(tokens, plain, strict=True)) else str(min(shared))
