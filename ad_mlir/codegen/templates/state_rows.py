"""What the per-sequence state ops' templates share (`ad.cached_causal_conv1d`,
`ad.cached_ssm_scan`, `ad.cached_selective_scan`, `ad.cached_gated_delta_rule`): how a program
finds its sequence's tokens, slot and start, in either form, and their emitter.

In the slot form, batch row b holds one sequence's new tokens (0 .. seq_len - 1 of the seq
axis). In the paged form (`query_starts`) the batch is 1 and its one row holds every sequence's
new tokens, sequence s the tokens `query_starts[s]` .. `query_starts[s + 1] - 1`, read by the
kernel itself: one launch per op and step over all sequences, no host read and no allocation
that depends on the values, so a decode step of a hybrid model can be captured in a CUDA graph.
Either way program s along the grid's first axis (`slots.shape[0]` of them) runs sequence s:
`SEQUENCE` binds `row` (the batch row its tokens are in), `first` .. `last` (its tokens on the
seq axis), `slot` and `start`; the kernel indexes tokens as (row, t) and writes its output at
the same places, so the output has the input's tokens, flat in the paged form.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ad_mlir.codegen.emitters import KernelEmitter, OpT, operand_indices

SEQUENCE = '''    seq = tl.program_id(0).to(tl.int64)
    if VARLEN:  # the paged form: sequence seq's tokens of the one flattened row
        row, first, last = 0, tl.load(query_starts + seq), tl.load(query_starts + seq + 1)
    else:
        row, first, last = seq, 0, seq_len
    slot = tl.load(slots + seq)
    start = tl.load(starts + seq)'''
"""The kernel's first lines: its sequence's tokens, slot and start (the kernel takes `slots`,
`starts`, `query_starts`, `seq_len` and the constexpr `VARLEN`). The paged form's token indices
are int64, as the slot form's row is: offsets over a long flat step do not overflow."""


def unpack_tensors(operands: Sequence[str], stand_ins: Mapping[str, str], varlen: bool) -> str:
    """The launcher's unpacking of its tensors: `operands` (the op's, in order, before the state)
    then `state`, `slots`, `starts` and in the paged form `query_starts`; each absent name of
    `stand_ins` bound to a tensor it stands in for (the kernel takes it but never reads it)."""
    names = [*operands, "state", "slots", "starts", *(["query_starts"] if varlen else [])]
    absent = {**stand_ins, **({} if varlen else {"query_starts": "slots"})}
    return ", ".join(names) + " = tensors" + "".join(f"\n    {name} = {tensor}" for name, tensor in absent.items())


def state_emitter(emit: Callable[[OpT, bool, str, str], str]) -> KernelEmitter[OpT]:
    """The emitter of a per-sequence state op: `emit(op, varlen, name, header)`, `varlen` in the
    paged form (the op has `query_starts`); the kernel writes the `state` operand in place."""
    return KernelEmitter(lambda op, name, header: emit(op, op.query_starts is not None, name, header),
                         written=lambda op: operand_indices(op, (op.state,)))
