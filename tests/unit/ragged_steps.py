"""Flattened steps of the paged form for the per-sequence state kernels' tests: each step's
sequences (their token counts, cache starts and state slots), the metadata tensors the op takes,
and the state pool's stale contents.

The state pool has `POOL_SLOTS` slots holding random values (a finished sequence's), so a
sequence that starts at 0 and read its slot, or a kernel that wrote another sequence's slot, shows."""

from __future__ import annotations

from dataclasses import dataclass

import torch

POOL_SLOTS = 5


@dataclass(frozen=True)
class Step:
    lengths: tuple[int, ...]
    starts: tuple[int, ...]
    slots: tuple[int, ...]

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    def metadata(self, device: str) -> list[torch.Tensor]:
        """`slots`, `starts`, `query_starts` as the op takes them (int64, on `device`)."""
        bounds = torch.tensor([0, *self.lengths]).cumsum(0)
        return [torch.tensor(v, dtype=torch.int64, device=device) for v in (self.slots, self.starts)] + [
            bounds.to(device)]


# Starts are 0 or at least 3: a convolution's slot holds zeros for the positions before its
# sequence's first token, which the kernel reads as zeros and the reference reads from the slot,
# so on this random pool a start of 1 or 2 would differ where a real slot cannot.
STEPS = {
    # a decode, a first chunk (start 0: a fresh state) and a chunk that continues, slots unsorted
    "mixed": Step((1, 5, 3), (7, 0, 4), (3, 0, 2)),
    # a decode-only step of four sequences (one of them a one-token prompt)
    "decodes": Step((1, 1, 1, 1), (5, 9, 0, 3), (4, 1, 0, 2)),
    "single": Step((6,), (3,), (1,)),
}
