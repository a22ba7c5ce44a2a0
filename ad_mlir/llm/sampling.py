"""Choosing a token from a position's logits: greedy, or sampled under temperature, top-k and
top-p. The engine samples every token with `sample`; speculative decoding's verification draws
from the same distribution (`sampling_probs`)."""

from __future__ import annotations

import torch


def sample(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None,
           top_k: int = 0) -> int:
    """Greedy (argmax) at temperature 0; else a draw from `sampling_probs`. Runs on the CPU (the
    generator is a CPU one; the token is read on the host anyway)."""
    logits = logits.cpu()
    if temperature <= 0:
        return int(logits.argmax())
    return int(torch.multinomial(sampling_probs(logits, temperature, top_p, top_k), 1, generator=generator))


def sampling_probs(logits: torch.Tensor, temperature: float, top_p: float, top_k: int = 0) -> torch.Tensor:
    """softmax(logits / temperature) over the `top_k` most likely tokens (0: all), keeping the
    smallest set of most likely tokens whose probability reaches `top_p` (the others 0, the
    kept ones not renormalized: `torch.multinomial` takes weights). `temperature` > 0."""
    logits = logits.cpu()
    if 0 < top_k < logits.numel():
        logits = logits.masked_fill(logits < logits.topk(top_k).values[-1], float("-inf"))
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        keep = sorted_probs.cumsum(0) - sorted_probs < top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    return probs
