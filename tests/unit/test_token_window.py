"""`ad.cached_token_window`'s torch meaning (`torch_ops.cached_token_window`, what every device
runs: the op has no kernel) against the whole sequence it stands for: the W rows a model puts
before its first token (zeros, or its start rows) followed by all its tokens. Pure copies, so
exact. The paged form (`query_starts`) against each sequence fed on its own in the slot form."""

from __future__ import annotations

import pytest
import torch

from ad_mlir.semantics import torch_ops

WIDTH = 2


def _padded(tokens: torch.Tensor, initial: torch.Tensor | None) -> torch.Tensor:
    """[batch, WIDTH + seq, 4]: the rows before the first token, then the tokens."""
    before = initial if initial is not None else torch.zeros(tokens.shape[0], WIDTH, tokens.shape[2])
    return torch.cat([before, tokens], dim=1)


def test_a_sequence_fed_in_chunks_sees_the_rows_before_each_chunk() -> None:
    """Two rows in slots 2 and 0 of a dirty state, fed 3, 1, 2 and 1 tokens (chunks shorter than
    the window among them): each step's window is the whole padded sequence's rows from W before
    its first token, the first step's from the start rows and not from what the slots held."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randn(2, 7, 4, generator=generator)
    initial = torch.randn(2, WIDTH, 4, generator=generator)
    state = torch.randn(3, WIDTH, 4, generator=generator)
    slots = torch.tensor([2, 0])
    padded, start = _padded(tokens, initial), 0
    for n in (3, 1, 2, 1):
        window = torch_ops.cached_token_window(tokens[:, start:start + n], initial, state, slots,
                                               torch.full((2,), start), 1)
        assert torch.equal(window, padded[:, start:start + WIDTH + n])
        start += n


def test_without_start_rows_a_sequence_starts_from_zeros_along_its_token_axis() -> None:
    """Tokens on the last axis ([batch, channels, seq], ZAYA's q/k before its convolutions), no
    start rows: a new sequence in a used slot starts from zeros."""
    tokens = torch.randn(1, 4, 5, generator=torch.Generator().manual_seed(1))
    state = torch.ones(2, 4, WIDTH)
    slot = torch.tensor([1])
    first = torch_ops.cached_token_window(tokens[..., :3], None, state, slot, torch.tensor([0]), 2)
    second = torch_ops.cached_token_window(tokens[..., 3:], None, state, slot, torch.tensor([3]), 2)
    whole = _padded(tokens.transpose(1, 2), None).transpose(1, 2)
    assert torch.equal(first, whole[..., :WIDTH + 3]) and torch.equal(second, whole[..., 3:])
    assert torch.equal(state[0], torch.ones(4, WIDTH))  # the other slot is left alone


@pytest.mark.parametrize("width", [1, 2])
@pytest.mark.parametrize("with_initial", [False, True], ids=["zeros", "start_rows"])
def test_a_flattened_step_equals_each_sequence_fed_on_its_own(width: int, with_initial: bool) -> None:
    """The paged form (`query_starts`): four sequences of 3, 1, 1 and 5 tokens (shorter than the
    window among them) in state slots 2, 0, 3, 1 of a dirty state, two new (start 0) and two
    continuing, tokens on the last axis: each token's row is the slot form's window row of its
    own sequence fed alone, and the slots end as the slot form leaves them."""
    generator = torch.Generator().manual_seed(width)
    state = torch.randn(4, 3, width, generator=generator)
    initial = torch.randn(1, 3, width, generator=generator) if with_initial else None
    lengths, starts, slots = [3, 1, 1, 5], [0, 4, 0, 2], [2, 0, 3, 1]
    tokens = torch.randn(1, 3, sum(lengths), generator=generator)
    bounds = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    flat_state, alone_state = state.clone(), state.clone()
    out = torch_ops.cached_token_window(tokens, initial, flat_state, torch.tensor(slots), torch.tensor(starts), 2,
                                        bounds)
    assert out.shape == tokens.shape
    for s, n in enumerate(lengths):
        window = torch_ops.cached_token_window(tokens[..., bounds[s]:bounds[s + 1]], initial, alone_state,
                                               torch.tensor([slots[s]]), torch.tensor([starts[s]]), 2)
        assert torch.equal(out[..., bounds[s]:bounds[s + 1]], window[..., :n]), s
    assert torch.equal(flat_state, alone_state)
