"""The evaluated attention masks the passes classify (`passes/patterns/attention_masks.py`):
causal, causal within a sliding window, or neither (a `MaskError` the pass reports)."""

from __future__ import annotations

import pytest
import torch

from ad_mlir.passes.patterns.attention_masks import NotCausalWindow, causal_window


def _window(n: int, w: int) -> torch.Tensor:
    rows, cols = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return (cols <= rows) & (cols > rows - w)


def test_causal_and_sliding_window_masks_are_told_apart() -> None:
    assert causal_window(_window(6, 6)[None, None]) is None
    assert causal_window(_window(6, 3).expand(2, 4, 6, 6)) == 3
    lowest = torch.finfo(torch.float32).min
    additive = torch.where(_window(6, 2), 0.0, lowest)
    assert causal_window(additive[None]) == 2


def test_a_mask_of_keys_broadcast_over_the_queries_is_no_causal_window() -> None:
    """[batch, 1, 1, keys] (a padding mask): every query sees every key, not a causal mask."""
    with pytest.raises(NotCausalWindow):
        causal_window(torch.ones(1, 1, 1, 6, dtype=torch.bool))
