"""`optimize-rope`: RoPE on a query and a key that does not feed an SDPA -> one `ad.rope`.

After `fuse-rope-attention` took the RoPE that feeds attention, the HF `apply_rotary_pos_emb`
pattern may remain where attention is spelled otherwise (Gemma2 soft-caps its logits with
matmul/tanh/softmax). Left to `fuse-elementwise`, Q and K each get a kernel (their head
counts differ, so they are two domains); `ad.rope` rotates both in one launch that reads the
cos/sin row once per token. Ropes are paired in program order among those rotating alike
(the same tables, form and rotary dim: every layer shares the tables, a layer's query then its
key), and only when the first result has no user before the second rope is computed (the op
takes the second one's place). Every spelling `fuse-rope-attention` matches is matched (partial
rotary, interleaved pairs, GPT-J's rotation before the transpose); both must be rotated in their
own dtype (no promotion).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, UnitAttr
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from ad_mlir.dialects import ad
from ad_mlir.passes.patterns.matching import erase_dead
from ad_mlir.passes.patterns.rope import Rope, heads_first, match_rope, same_tables, table_ops, tables

log = logging.getLogger(__name__)

ROPE_RESULTS = (ad.AddOp, ad.CatOp, ad.TransposeOp)
"""Ops that may end a RoPE pattern (full, partial rotary, GPT-J's transposed)."""


def _rotatable(rope: Rope, result: SSAValue) -> bool:
    return tuple(result.type.get_shape()) == rope.heads_first_shape and result.type.element_type == rope.x.type.element_type


def _first_use_after(value: SSAValue, op) -> bool:  # noqa: ANN001 (an Operation)
    return all(op.is_before_in_block(use.operation) for use in value.uses)


def ropes_in(block: Block) -> list[tuple[SSAValue, Rope]]:
    """Every rope result of `block` (the op that ends the pattern), in program order; a rope
    inside a bigger one (the rotated part of a partial rotary) is not one of its own."""
    found = [(op.results[0], rope) for op in block.ops
             if isinstance(op, ROPE_RESULTS) and (rope := match_rope(op.results[0])) is not None
             and _rotatable(rope, op.results[0])]
    inner = {op for _, rope in found for op in rope.chain[1:]}
    return [(value, rope) for value, rope in found if value.owner not in inner]


def pair_ropes(block: Block) -> list[tuple[tuple[SSAValue, Rope], tuple[SSAValue, Rope]]]:
    """Each rope with the next unpaired one that rotates alike (a layer's query, then its key)."""
    pairs, waiting = [], []
    for found in ropes_in(block):
        partner = next((w for w in waiting if same_tables(w[1], found[1])), None)
        if partner is None:
            waiting.append(found)
        else:
            waiting.remove(partner)
            pairs.append((partner, found))
    return pairs


def fuse_pair(first: tuple[SSAValue, Rope], second: tuple[SSAValue, Rope]) -> bool:
    (q_value, q), (k_value, k) = first, second
    if q.x.type.get_shape()[-1] != k.x.type.get_shape()[-1] or not _first_use_after(q_value, k_value.owner):
        return False
    location = q_value.owner.location

    def insert(new: Operation) -> Operation:
        new.location = location
        Rewriter.insert_op(new, InsertPoint.before(k_value.owner))
        return new

    op = ad.RopeOp.build(operands=[heads_first(q, insert), heads_first(k, insert), *tables(q, insert)],
                         properties={"interleaved": UnitAttr()} if q.interleaved else {},
                         result_types=[q_value.type, k_value.type])
    insert(op)
    q_value.replace_all_uses_with(op.query_out)
    k_value.replace_all_uses_with(op.key_out)
    erase_dead(Rewriter.erase_op, [*q.chain, *k.chain, *table_ops(q, k)])
    return True


@dataclass(frozen=True)
class OptimizeRopePass(ModulePass):
    """Query and key RoPE outside attention -> one `ad.rope` (see the module docstring)."""

    name = "optimize-rope"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        fused = 0
        for fn in op.walk():
            if isinstance(fn, func.FuncOp) and fn.body.blocks:
                fused += sum(fuse_pair(a, b) for a, b in pair_ropes(fn.body.block))
        log.info("optimize-rope: %d query/key RoPE pairs fused", fused)
