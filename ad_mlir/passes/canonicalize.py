"""`canonicalize`: the `ad` canonicalization patterns, DCE and CSE of pure ops."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.transforms import canonicalize
from xdsl.transforms.common_subexpression_elimination import CommonSubexpressionElimination


@dataclass(frozen=True)
class CanonicalizePass(ModulePass):
    """xDSL's canonicalize (every op's canonicalization patterns, see
    `dialects/canonicalization_patterns.py`, and DCE), then CSE, then canonicalize again for
    what CSE exposes (a cast of a value that is now shared, a dead op)."""

    name = "canonicalize"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        canonicalize.CanonicalizePass().apply(ctx, op)
        CommonSubexpressionElimination().apply(ctx, op)
        canonicalize.CanonicalizePass().apply(ctx, op)
