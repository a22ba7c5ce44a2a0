"""Speculative decoding: a proposer drafts the next tokens of a sequence, the model checks them all
in one step (each drafted token is fed as an input and its position's logits say whether it is
the token the model would have chosen), and every accepted token costs no step of its own.

`NgramProposer` drafts by prompt lookup (vLLM's `ngram`): where the sequence's last n tokens
appeared before, the tokens that followed them then are the draft. It costs no model and pays
where the output copies its context (editing, summarizing, code). `DraftModelProposer` drafts
with a smaller model of the same tokenizer, greedily, compiled by ad-mlir with a paged cache of
its own.

`verify` chooses the token at a drafted position so that what comes out is exactly what plain
decoding gives: greedy, the model's argmax (the draft is kept when it is that token); sampled,
rejection sampling (Leviathan et al., 2023) with the proposer's distribution a point mass on its
draft: the draft is kept with the model's probability of it, else a token is drawn from the
model's distribution with the draft taken out. Either way the token's distribution is the
model's, whatever the proposer drafted.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from ad_mlir.llm.pages import BlockManager, pages_for
from ad_mlir.llm.sampling import sampling_probs

if TYPE_CHECKING:
    from ad_mlir.llm.engine import PagedModel


class Proposer(Protocol):
    """What drafts tokens for `PagedEngine` to verify."""

    def propose(self, sequences: Sequence[Sequence[int]], limits: Sequence[int]) -> list[list[int]]:
        """For each sequence (a request's prompt and generated tokens), at most its limit of
        tokens to follow it: all of a step's decodes at once (a draft model batches them)."""
        ...


@runtime_checkable
class ReadsHiddenStates(Protocol):
    """A proposer that drafts from the model's hidden states (EAGLE-3: `ad_mlir.llm.eagle3`).
    `LLM` compiles the model to return the states after `layers` layers for every token
    (`capture-hidden-states`) once `attach` has seen the model; after each step `PagedEngine`
    hands each running request's states of the positions its cache now holds (`observe`: a
    rejected draft's are not), asks for drafts by request (`propose_for`), and says when a
    request's cache is gone (`forget`: finished, aborted or preempted)."""

    layers: tuple[int, ...]

    def attach(self, model: torch.nn.Module) -> None: ...

    def observe(self, request_id: str, start: int, hidden: torch.Tensor) -> None:
        """`hidden` [n, len(layers) * hidden]: the states of positions `start` .. `start + n - 1`."""
        ...

    def propose_for(self, request_ids: Sequence[str], sequences: Sequence[Sequence[int]],
                    limits: Sequence[int]) -> list[list[int]]: ...

    def forget(self, request_id: str) -> None: ...


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

    def propose(self, sequences: Sequence[Sequence[int]], limits: Sequence[int]) -> list[list[int]]:
        return [self.lookup(tokens, limit) for tokens, limit in zip(sequences, limits, strict=True)]

    def lookup(self, tokens: Sequence[int], limit: int) -> list[int]:
        """At most `min(limit, num_tokens)` drafted tokens to follow `tokens` (none where no n-gram
        of the tail appeared before). Compared as tensors: a step looks up every decoding
        sequence, each possibly thousands of tokens long."""
        limit = min(limit, self.num_tokens)
        if limit <= 0:
            return []
        sequence = torch.frombuffer(array("q", tokens), dtype=torch.int64)  # 4x faster than from a list
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            earlier = sequence[:-1].unfold(0, n, 1)  # every n-gram that ends before the last token
            found = (earlier == sequence[-n:]).all(dim=1).nonzero()
            if len(found):
                start = int(found[-1]) + n  # the latest occurrence
                return list(tokens[start:start + limit])
        return []


class DraftModelProposer:
    """Drafts greedily with a smaller model of the same tokenizer, compiled by ad-mlir in the paged
    form (`LLM(draft, page_size=...)`, or any `PagedModel`) with a cache of its own. It keeps no
    state per request, so nothing is rolled back after a rejection: each step, each sequence
    starts in the draft's pool after the pages of it that the draft's prefix cache holds (keyed by
    their tokens, so what it computed in earlier steps is found again), feeds the rest of its
    tokens and then its own drafted tokens one by one, all sequences in one `forward_flat` call
    per drafted token, and lets its pages go (kept cached for the next step). A sequence the pool
    or the draft's context cannot hold gets no draft."""

    def __init__(self, model: PagedModel, num_tokens: int = 4) -> None:
        if num_tokens < 1:
            raise ValueError(f"speculative num_tokens must be at least 1, got {num_tokens}")
        if model.num_state_slots:
            raise ValueError("a draft model needs every cache paged: this one keeps per-sequence states")
        self.model, self.num_tokens = model, num_tokens
        self.blocks = BlockManager(model.num_pages, model.page_size, prefix_caching=True)
        self.width = pages_for(model.max_seq_len, model.page_size)

    @property
    def vocab_size(self) -> int | None:
        return self.model.vocab_size

    def propose(self, sequences: Sequence[Sequence[int]], limits: Sequence[int]) -> list[list[int]]:
        drafts: list[list[int]] = [[] for _ in sequences]
        feeds, lengths = self._start(sequences, limits)
        try:
            while feeds:
                rows = self._forward(feeds)
                for (i, start, fed), row in zip(feeds, rows, strict=True):
                    drafts[i].append(int(row.argmax()))
                    self.blocks.written(f"draft-{i}", [*sequences[i], *drafts[i]], start + len(fed))
                feeds = [(i, start + len(fed), drafts[i][-1:]) for i, start, fed in feeds
                         if len(drafts[i]) < lengths[i]]
        finally:
            for i in range(len(sequences)):
                self.blocks.free(f"draft-{i}")
        return drafts

    def _start(self, sequences: Sequence[Sequence[int]],
               limits: Sequence[int]) -> tuple[list[tuple[int, int, list[int]]], dict[int, int]]:
        """(sequence index, tokens the draft's pages hold, tokens to feed) of each sequence that
        gets a draft, its pages taken; and the length of each one's draft: its limit, within the
        draft model's own context (its last drafted token is never fed)."""
        feeds, lengths = [], {}
        for i, (tokens, limit) in enumerate(zip(sequences, limits, strict=True)):
            length = min(limit, self.num_tokens, self.model.max_seq_len - len(tokens) + 1)
            shared = self.blocks.cached_prefix(tokens)
            if length > 0 and self.blocks.start(f"draft-{i}", tokens, shared, len(tokens) + length - 1):
                start = len(shared) * self.model.page_size
                feeds.append((i, start, list(tokens[start:])))
                lengths[i] = length
        return feeds, lengths

    def _forward(self, feeds: Sequence[tuple[int, int, list[int]]]) -> torch.Tensor:
        """One `forward_flat` of every sequence's fed tokens: the logits of each one's last token."""
        ids: list[int] = []
        positions: list[int] = []
        query_starts, tables = [0], []
        for i, start, fed in feeds:
            ids += fed
            positions += range(start, start + len(fed))
            query_starts.append(len(ids))
            pages = self.blocks.block_table(f"draft-{i}")
            tables.append(pages + [0] * (self.width - len(pages)))

        def tensor(values: list[int] | list[list[int]]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64)

        return self.model.forward_flat(tensor([ids]), tensor([positions]), tensor(query_starts),
                                       tensor([start for _, start, _ in feeds]), tensor(tables),
                                       tensor([q - 1 for q in query_starts[1:]]))


def verify(logits: torch.Tensor, draft: int, temperature: float, top_p: float,
           generator: torch.Generator | None, top_k: int = 0) -> int:
    """The token at a drafted position (`logits` are that position's): `draft` when accepted,
    else the model's choice without it (module docstring). It draws other random numbers from
    the request's generator than `sample` does, so a seeded request's tokens differ from its
    unspeculated ones (their distribution does not)."""
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
