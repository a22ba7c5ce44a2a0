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


def assert_logits_follow(model: torch.nn.Module, prompts: list[list[int]], forced: list[list[int]],
                         logits: list[torch.Tensor], bound: float, what: str) -> list[float]:
    """Each prompt's step logits `logits[i]` (its prefill's last row, then one row per forced
    token) within `bound` of `model`'s eager logits over prompt + forced tokens, as
    `fp8_logits_error` measures (relative L2 over the vocabulary, the worst row); returns the
    errors, one per prompt. `what` names `model` in the messages."""
    from ad_mlir.tools.report import fp8_logits_error

    errors = []
    for i, (prompt, tokens, got) in enumerate(zip(prompts, forced, logits, strict=True)):
        error = fp8_logits_error(eager_logits(model, prompt + tokens)[len(prompt) - 1:], got)
        print(f"prompt {i}: {error:.3g} from {what}")
        assert error <= bound, f"prompt {i}: {error:.3g} from {what}"
        errors.append(error)
    return errors
