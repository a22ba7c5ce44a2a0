"""Stepping an engine in tests: the engine ends a request whose forward or sampling failed with
finish reason "error" and goes on (one request never fails another), which in a test of tokens
would only show as a request cut short. `checked_step` raises that error instead. Also the
inputs of two flattened steps of a paged model, for tests that record a step's kernel calls."""

from __future__ import annotations

import torch

from ad_mlir.llm.engine import BaseEngine, RequestUpdate


def checked_step(engine: BaseEngine) -> list[RequestUpdate]:
    """`engine.step()`, raising the error of a request it ended with one."""
    updates = engine.step()
    for update in updates:
        if update.error is not None:
            raise update.error
    return updates


def two_sequence_flat_steps() -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """`forward_flat`'s inputs (ids, positions, query starts, cache starts, block tables, logits
    rows) of a paged model with pages of 4 tokens, two sequences of 4 pages each: a decode step of
    two sequences with 5 and 9 cached tokens, and a prefill step of two prompts of 3 and 2 tokens."""
    tables = torch.arange(8).view(2, 4)
    decode = (torch.tensor([[3, 4]]), torch.tensor([[5, 9]]), torch.arange(3), torch.tensor([5, 9]), tables,
              torch.arange(2))
    prefill = (torch.tensor([[3, 4, 5, 6, 7]]), torch.tensor([[0, 1, 2, 0, 1]]), torch.tensor([0, 3, 5]),
               torch.tensor([0, 0]), tables, torch.tensor([2, 4]))
    return decode, prefill
