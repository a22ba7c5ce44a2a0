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

import logging
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import PatternRewriteWalker

from ad_mlir.dialects import ad
from ad_mlir.passes.patterns.activations import FuseGatedProduct, gelu_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FuseGeluMulPass(ModulePass):
    """gelu(gate) * up -> `ad.gelu_and_mul` (see the module docstring)."""

    name = "fuse-gelu-mul"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        pattern = FuseGatedProduct(gelu_of, ad.GeluAndMulOp, self.name)
        PatternRewriteWalker(pattern, apply_recursively=False).rewrite_module(op)
        log.info("fuse-gelu-mul: %d gelu * up fused", pattern.matches)
