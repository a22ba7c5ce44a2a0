"""`optimize-rope`: RoPE on a query and a key that does not feed an SDPA -> one `ad.rope`.

After `fuse-rope-attention` took the RoPE that feeds attention, the HF `apply_rotary_pos_emb`
pattern may remain where attention is spelled otherwise (Gemma2 soft-caps its logits with
matmul/tanh/softmax). Left to `fuse-elementwise`, Q and K each get a kernel (their head
counts differ, so they are two domains); `ad.rope` rotates both in one launch that reads the
cos/sin row once per token. Ropes are paired in program order among those sharing cos/sin
(every layer shares the tables: a layer's query then its key), and only when the first
result has no user before the second rope is computed (the op takes the second one's place).
Both must be rotated in their own dtype (no promotion) with a power-of-two head_dim.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from ad_mlir.dialects import ad
from ad_mlir.passes.fuse_rope_attention import Rope, match_rope
from ad_mlir.passes.matching import erase_dead

log = logging.getLogger(__name__)


def _rotatable(rope: Rope, result: SSAValue) -> bool:
    d = rope.x.type.get_shape()[-1]
    return len(rope.x.type.get_shape()) == 4 and result.type == rope.x.type and d >= 2 and not d & (d - 1)


def _first_use_after(value: SSAValue, op) -> bool:  # noqa: ANN001 (an Operation)
    return all(op.is_before_in_block(use.operation) for use in value.uses)


def ropes_in(block: Block) -> list[tuple[SSAValue, Rope]]:
    """Every rope result of `block` (the add that ends the pattern), in program order."""
    found = []
    for op in block.ops:
        if isinstance(op, ad.AddOp) and (rope := match_rope(op.result)) is not None and _rotatable(rope, op.result):
            found.append((op.result, rope))
    return found


def pair_ropes(block: Block) -> list[tuple[tuple[SSAValue, Rope], tuple[SSAValue, Rope]]]:
    by_tables: dict[tuple[SSAValue, SSAValue], list[tuple[SSAValue, Rope]]] = {}
    for value, rope in ropes_in(block):
        by_tables.setdefault((rope.cos, rope.sin), []).append((value, rope))
    pairs = []
    for found in by_tables.values():
        pairs += [(found[i], found[i + 1]) for i in range(0, len(found) - 1, 2)]
    return pairs


def fuse_pair(first: tuple[SSAValue, Rope], second: tuple[SSAValue, Rope]) -> bool:
    (q_value, q), (k_value, k) = first, second
    if q.x.type.get_shape()[-1] != k.x.type.get_shape()[-1] or not _first_use_after(q_value, k_value.owner):
        return False
    op = ad.RopeOp.build(operands=[q.x, k.x, q.cos, q.sin], result_types=[q_value.type, k_value.type])
    op.location = q_value.owner.location
    Rewriter.insert_op(op, InsertPoint.before(k_value.owner))
    q_value.replace_all_uses_with(op.query_out)
    k_value.replace_all_uses_with(op.key_out)
    erase_dead(Rewriter.erase_op, [*q.chain, *k.chain])
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
