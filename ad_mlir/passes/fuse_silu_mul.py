"""`fuse-silu-mul`: `silu(gate) * up` -> `ad.silu_and_mul(gate, up)` (HF's gated MLP).

silu is `ad.silu` or, in a core-ATen graph, `x * sigmoid(x)` (for bf16/f16 `x`, between a
cast to f32 and one back: what torch's silu computes; `passes/patterns/activations.py`).

Gate and up may be two linears, or two last-dim slices of one linear (after `fuse-gemms`):
the kernel reads either through its runtime strides, so the slices cost no copy. The silu
must have no other user, and gate, up and the product must share one type (the op computes
each step in that dtype, as HF's module does).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.pattern_rewriter import RewritePattern

from ad_mlir.dialects import ad
from ad_mlir.passes.patterns.activations import FuseGatedProduct, silu_of
from ad_mlir.passes.patterns.pattern_pass import PatternPass


@dataclass(frozen=True)
class FuseSiluMulPass(PatternPass):
    """silu(gate) * up -> `ad.silu_and_mul` (see the module docstring)."""

    name = "fuse-silu-mul"
    summary = "%d silu * up fused"

    def patterns(self) -> list[RewritePattern]:
        return [FuseGatedProduct(silu_of, ad.SiluAndMulOp, self.name)]
