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

from collections.abc import Callable, Sequence

from xdsl.ir import SSAValue

from ad_mlir.codegen.emitters import KernelEmitter, OpT, operand_indices

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


def state_emitter(emit_slot: Callable[[OpT, str, str], str],
                  token_inputs: Callable[[OpT], Sequence[SSAValue]], axis: int) -> KernelEmitter[OpT]:
    """The emitter of a per-sequence state op (its `state` written in place): `emit_slot`'s slot
    kernel, in the paged form (`query_starts`) launched once per sequence, the operands
    `token_inputs` holding a value per token along `axis`."""
    def emit(op: OpT, name: str, header: str) -> str:
        source = emit_slot(op, name, header)
        if op.query_starts is None:
            return source
        tokens = token_inputs(op)
        return by_sequence_source(source, [i for i, v in enumerate(op.operands) if v in tokens], axis)

    return KernelEmitter(emit, written=lambda op: operand_indices(op, (op.state,)))
