"""Run-time helpers of the generated launchers: grid arithmetic, and sizes and strides under
broadcasting.

`cdiv` and `next_power_of_2` compute what Triton's do, in plain Python: Triton's are
`ConstexprFunction`s, which cost a launcher about 4 us a call against 0.03 us (measured on
this 2-core CPU under load), on every launch outside a CUDA graph.

An input's IR type may say `?` where its size is 1 at run time (a slice of a size-1 dim:
MPT's ALiBi bias `tensor<4x?x?xf32>` is `4 x 1 x seq`). It broadcasts there like a static 1:
it is read with stride 0 and does not set the kernel's size, whatever its static type says.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def cdiv(x: int, div: int) -> int:
    """`ceil(x / div)` for ints (`triton.cdiv`)."""
    return (x + div - 1) // div


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= `n` (`triton.next_power_of_2`, bit for bit: 0 for 0)."""
    n -= 1
    for shift in (1, 2, 4, 8, 16, 32):
        n |= n >> shift
    return n + 1


def broadcast_size(*sizes: int) -> int:
    """The size where these meet under broadcasting: the first that is not 1, else 1."""
    return next((s for s in sizes if s != 1), 1)


def broadcast_stride(t: torch.Tensor, dim: int) -> int:
    """`t`'s stride along `dim`, 0 where it has size 1 there (it broadcasts)."""
    return 0 if t.shape[dim] == 1 else t.stride(dim)


def narrowed(t: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """`t` (written over the kernel's whole domain) cut to `shape` where that is 1: the output
    does not vary along such a dim, so its first index holds it. A copy, not a view."""
    if tuple(t.shape) == tuple(shape):
        return t
    for d, n in enumerate(shape):
        if n != t.shape[d]:
            t = t.narrow(d, 0, n)
    return t.clone()
