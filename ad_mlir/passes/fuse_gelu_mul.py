"""`fuse-gelu-mul`: `gelu(gate) * up` -> `ad.gelu_and_mul(gate, up)` (HF's gated GELU MLP:
Gemma's and Gemma 3's `gelu_pytorch_tanh`, any gated MLP configured with a GELU).

gelu is `ad.gelu` with either approximation (the op keeps it), or in f32 the tanh formula
spelled out as HF's `NewGELUActivation` writes it (`passes/patterns/activations.py` says why only
in f32). Gate and up may be two linears, two last-dim slices of one (after `fuse-gemms`), or
the two halves of a fused `gate_up_proj` chunked (Phi-3's shape): the kernel reads each
through its runtime strides. The gelu must have no other user, and gate, up and the product
must share one type (the op computes each step in that dtype, as HF's module does); the log
says which products stay and why.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.pattern_rewriter import RewritePattern

from ad_mlir.dialects import ad
from ad_mlir.passes.patterns.activations import FuseGatedProduct, gelu_of
from ad_mlir.passes.patterns.pattern_pass import PatternPass


@dataclass(frozen=True)
class FuseGeluMulPass(PatternPass):
    """gelu(gate) * up -> `ad.gelu_and_mul` (see the module docstring)."""

    name = "fuse-gelu-mul"
    summary = "%d gelu * up fused"

    def patterns(self) -> list[RewritePattern]:
        return [FuseGatedProduct(gelu_of, ad.GeluAndMulOp, self.name)]
