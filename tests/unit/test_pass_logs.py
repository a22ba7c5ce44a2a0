"""The count a pattern pass logs at INFO (what `ad-opt` and `compile` tell a user a pass did)
is the number of rewrites it made, and zero on a second run over its own output."""

from __future__ import annotations

import logging

import pytest
from xdsl.parser import Parser

from ad_mlir.passes.pipeline import make_context, run_pipeline

FOUR_ACTIVATIONS = """
func.func @mlp(%x: tensor<1x?x64xbf16>, %w1: tensor<200x64xbf16>, %b1: tensor<200xbf16>, %w2: tensor<64x200xbf16>)
    -> (tensor<1x?x64xbf16>, tensor<1x?x64xbf16>, tensor<1x?x64xbf16>, tensor<1x?x64xbf16>) {
  %h = ad.linear %x, %w1 bias %b1 : (tensor<1x?x64xbf16>, tensor<200x64xbf16>, tensor<200xbf16>) -> tensor<1x?x200xbf16>
  %g = ad.gelu %h approximate "tanh" : tensor<1x?x200xbf16> -> tensor<1x?x200xbf16>
  %o1 = ad.linear %g, %w2 : (tensor<1x?x200xbf16>, tensor<64x200xbf16>) -> tensor<1x?x64xbf16>
  %e = ad.gelu %h : tensor<1x?x200xbf16> -> tensor<1x?x200xbf16>
  %o2 = ad.linear %e, %w2 : (tensor<1x?x200xbf16>, tensor<64x200xbf16>) -> tensor<1x?x64xbf16>
  %r = ad.relu %h : tensor<1x?x200xbf16> -> tensor<1x?x200xbf16>
  %o3 = ad.linear %r, %w2 : (tensor<1x?x200xbf16>, tensor<64x200xbf16>) -> tensor<1x?x64xbf16>
  %s = ad.silu %h : tensor<1x?x200xbf16> -> tensor<1x?x200xbf16>
  %o4 = ad.linear %s, %w2 : (tensor<1x?x200xbf16>, tensor<64x200xbf16>) -> tensor<1x?x64xbf16>
  func.return %o1, %o2, %o3, %o4 : tensor<1x?x64xbf16>, tensor<1x?x64xbf16>, tensor<1x?x64xbf16>, tensor<1x?x64xbf16>
}
"""


def test_fuse_activation_logs_the_activations_it_fused(caplog: pytest.LogCaptureFixture) -> None:
    module = Parser(make_context(), FOUR_ACTIVATIONS).parse_module()
    with caplog.at_level(logging.INFO, logger="ad_mlir.passes.fuse_activation"):
        run_pipeline(module, "fuse-activation")
        run_pipeline(module, "fuse-activation")
    assert str(module).count("ad.activation") == 4
    assert caplog.messages == ["fuse-activation: 4 activations fused", "fuse-activation: 0 activations fused"]
