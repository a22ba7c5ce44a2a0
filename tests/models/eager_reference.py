"""The eager model's side of the generation tests: its logits over a whole sequence, and its greedy
tokens, each the argmax of a forward over the whole prefix (no cache to get wrong)."""

from __future__ import annotations

import torch


def eager_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab]: `model`'s logits at every position of `ids`."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def eager_greedy(model: torch.nn.Module, prompt: list[int], steps: int) -> list[int]:
    """`steps` greedy tokens after `prompt`, each from a full-prefix forward."""
    ids = list(prompt)
    for _ in range(steps):
        ids.append(int(eager_logits(model, ids)[-1].argmax()))
    return ids[len(prompt):]
