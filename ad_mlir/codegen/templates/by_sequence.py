"""The paged form of the per-sequence state ops' kernels: the slot form's kernel launched once
per sequence (`ad.cached_causal_conv1d`, `ad.cached_ssm_scan`, `ad.cached_selective_scan`,
`ad.cached_gated_delta_rule` with `query_starts`).

In the paged form such an op's batch is 1 and holds every sequence's new tokens one after
another; sequence s is a batch row of its own (its tokens `query_starts[s]` ..
`query_starts[s + 1] - 1`, its slot `slots[s]`, its start `starts[s]`). So the slot kernel, run
on sequence s's tokens as a batch of one with `slots[s:s + 1]` and `starts[s:s + 1]`, computes
exactly what the op means for it; the results are joined along the token axis. The launcher
reads `query_starts` on the host (one sync per op and step; the paged form with these states
runs without CUDA graphs) and launches the kernel once per sequence: a step of n decodes is n
launches per op, where a varlen kernel would be one.
"""

from __future__ import annotations

from collections.abc import Sequence

_LAUNCH = '''
_launch_rows = launch


def launch(kernel, tensors, scalars):
    *rows, query_starts = tensors
    bounds = query_starts.tolist()
    outs = []
    for s, (first, last) in enumerate(zip(bounds[:-1], bounds[1:])):
        sequence = [t.narrow({axis}, first, last - first) if i in {token_inputs} else t for i, t in enumerate(rows)]
        sequence[-2:] = rows[-2][s:s + 1], rows[-1][s:s + 1]
        outs.append(_launch_rows(kernel, sequence, scalars)[0])
    return [torch.cat(outs, {axis})]
'''


def by_sequence_source(source: str, token_inputs: Sequence[int], axis: int) -> str:
    """`source` (a slot kernel's module, whose launcher takes the op's operands ending in
    `slots`, `starts`) with its `launch` run once per sequence of `query_starts` (one more
    tensor, last): the tensors at `token_inputs` cut to the sequence's tokens along `axis`, the
    slots and starts to its own; the outputs joined along `axis`."""
    return source + "\n" + _LAUNCH.format(axis=axis, token_inputs=tuple(token_inputs))
