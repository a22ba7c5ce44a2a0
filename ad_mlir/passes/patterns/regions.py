"""Outlining ops into an `ad.fused` region, shared by `fuse-elementwise` and
`fuse-rmsnorm-quant`."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from xdsl.ir import Block, Operation, Region, SSAValue

from ad_mlir.dialects import ad


def outline(members: Sequence[Operation], order: dict[Operation, int]) -> ad.FusedOp:
    """Replace `members` (ops of one block) by one `ad.fused` whose body holds copies of
    them; scalar constants are copied in, other outside values become inputs."""
    members = sorted(members, key=order.__getitem__)
    member_set = set(members)
    inputs: list[SSAValue] = []
    constants: list[ad.ConstantOp] = []
    for m in members:
        for v in m.operands:
            owner = v.owner
            if owner in member_set or v in inputs or owner in constants:
                continue
            if isinstance(owner, ad.ConstantOp):
                constants.append(owner)
            else:
                inputs.append(v)
    outputs = [r for m in members for r in m.results if any(u.operation not in member_set for u in r.uses)]

    block = Block(arg_types=[v.type for v in inputs])
    mapping: dict[SSAValue, SSAValue] = {}
    for v, arg in zip(inputs, block.args, strict=True):
        mapping[v] = arg
        arg.name_hint = v.name_hint
    for c in constants:
        clone = c.clone(value_mapper=mapping)
        block.add_op(clone)
        mapping[c.result] = clone.result
    for m in members:
        block.add_op(m.clone(value_mapper=mapping))
    block.add_op(ad.YieldOp(*(mapping[r] for r in outputs)))

    fused = ad.FusedOp.build(operands=[inputs], result_types=[[r.type for r in outputs]], regions=[Region(block)])
    fused.location = members[0].location
    last = members[-1]
    last.parent_block().insert_op_after(fused, last)
    for old, new in zip(outputs, fused.outputs, strict=True):
        new.name_hint = old.name_hint
        old.replace_uses_with_if(new, lambda use: use.operation not in member_set)
    for m in reversed(members):
        m.detach()
        m.erase()
    for c in constants:  # copied into the region; drop the outside one if nothing else uses it
        if not c.result.uses:
            c.detach()
            c.erase()
    return fused


def sort_topologically(block: Block) -> None:
    """Stable topological order (outlining at the last member can put a user of an early
    member's value before the fused op)."""
    ops = list(block.ops)
    index = {op: i for i, op in enumerate(ops)}
    users: dict[Operation, list[Operation]] = {op: [] for op in ops}
    waiting = dict.fromkeys(ops, 0)
    for op in ops:
        for p in {v.owner for v in op.operands if v.owner in index}:
            users[p].append(op)
            waiting[op] += 1
    ready = [index[op] for op in ops if waiting[op] == 0]
    heapq.heapify(ready)
    ordered: list[Operation] = []
    while ready:
        op = ops[heapq.heappop(ready)]
        ordered.append(op)
        for u in users[op]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, index[u])
    if ordered == ops:
        return
    for op in ops:
        op.detach()
    for op in ordered:
        block.add_op(op)
