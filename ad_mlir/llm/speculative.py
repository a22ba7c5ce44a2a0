"""Speculative decoding: a proposer drafts the next tokens of a sequence, the model checks them all
in one step (each drafted token is fed as an input and its position's logits say whether it is
the token the model would have chosen), and every accepted token costs no step of its own.

`NgramProposer` drafts by prompt lookup (vLLM's `ngram`): where the sequence's last n tokens
appeared before, the tokens that followed them then are the draft. It costs no model and pays
where the output copies its context (editing, summarizing, code).

`verify` chooses the token at a drafted position so that what comes out is exactly what plain
decoding gives: greedy, the model's argmax (the draft is kept when it is that token); sampled,
rejection sampling (Leviathan et al., 2023) with the proposer's distribution a point mass on its
draft: the draft is kept with the model's probability of it, else a token is drawn from the
model's distribution with the draft taken out. Either way the token's distribution is the
model's, whatever the proposer drafted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from ad_mlir.llm.sampling import sampling_probs


class Proposer(Protocol):
    """What drafts tokens for `PagedEngine` to verify."""

    def propose(self, tokens: Sequence[int], limit: int) -> list[int]:
        """At most `limit` tokens to follow `tokens` (a sequence's prompt and generated tokens)."""
        ...


@dataclass(frozen=True)
class NgramProposer:
    """Drafts up to `num_tokens` tokens: the tokens after the latest earlier occurrence of the
    sequence's last n tokens, n from `max_ngram` down to `min_ngram` (the longest match first)."""

    num_tokens: int = 4
    max_ngram: int = 3
    min_ngram: int = 1

    def __post_init__(self) -> None:
        if self.num_tokens < 1:
            raise ValueError(f"speculative num_tokens must be at least 1, got {self.num_tokens}")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"speculative n-gram sizes need 1 <= min_ngram <= max_ngram, got {self.min_ngram} and "
                             f"{self.max_ngram}")

    def propose(self, tokens: Sequence[int], limit: int) -> list[int]:
        """At most `min(limit, num_tokens)` drafted tokens to follow `tokens` (none where no n-gram
        of the tail appeared before)."""
        limit = min(limit, self.num_tokens)
        if limit <= 0:
            return []
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            tail = list(tokens[-n:])
            for start in range(len(tokens) - n - 1, -1, -1):  # the latest occurrence before the tail itself
                if list(tokens[start:start + n]) == tail:
                    return list(tokens[start + n:start + n + limit])
        return []


def verify(logits: torch.Tensor, draft: int, temperature: float, top_p: float,
           generator: torch.Generator | None, top_k: int = 0) -> int:
    """The token at a drafted position (`logits` are that position's): `draft` when accepted,
    else the model's choice without it (module docstring). Consumes the request's generator as
    plain sampling does not, so a seeded request's tokens differ from its unspeculated ones
    (their distribution does not)."""
    logits = logits.cpu()
    if temperature <= 0:
        return int(logits.argmax())
    probs = sampling_probs(logits, temperature, top_p, top_k)
    probs = probs / probs.sum()  # top-p leaves the kept weights as they were: the acceptance needs probabilities
    if float(torch.rand((), generator=generator)) < float(probs[draft]):
        return draft
    residual = probs.clone()
    residual[draft] = 0.0
    return int(torch.multinomial(residual, 1, generator=generator))
