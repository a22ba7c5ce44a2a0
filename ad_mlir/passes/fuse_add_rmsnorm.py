"""`fuse-add-rmsnorm`: `h = x + residual; y = rms_norm(h)` -> `y, h = add_rms_norm(x, residual)`.

The residual add of a decoder layer feeds the next norm and the next residual connection; one
kernel reads `x` and `residual` once and writes both the sum and the normalized value. The sum
keeps all its other users (they now read the op's second result). Only a plain add of two
tensors of the norm input's type qualifies (no alpha, no broadcast, no promotion). The new op
takes the add's place, so that users of the sum between the add and the norm still follow its
definition; with a weight computed after the add (Nemotron's `weight + 1`) it takes the
norm's place instead, when no other user of the sum comes before the norm (else the pair stays
unfused). A view that only regroups rows between the add and the norm (OPT reshapes to 2-D
before its norm) moves after the fused op: the norm of a view of rows is the view of their norm.
`FuseAddNorm` does the same for any norm and its add-and-norm op (`fuse-add-layernorm`).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.pattern_rewriter import RewritePattern

from ad_mlir.dialects import ad
from ad_mlir.passes.patterns.add_norm import FuseAddNorm
from ad_mlir.passes.patterns.pattern_pass import PatternPass


@dataclass(frozen=True)
class FuseAddRmsNormPass(PatternPass):
    """add + rms_norm -> `ad.add_rms_norm` (see the module docstring)."""

    name = "fuse-add-rmsnorm"
    summary = "%d add + RMSNorm pairs fused"

    def patterns(self) -> list[RewritePattern]:
        return [FuseAddNorm(ad.RmsNormOp, ad.AddRmsNormOp, self.name)]
