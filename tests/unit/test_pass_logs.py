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


SEQ_FIRST_KEY = """
func.func @seq_first_key_eager(%q: tensor<1x4x?x32xf32>, %k: tensor<1x?x4x32xf32>, %v: tensor<1x4x?x32xf32>, %cos: tensor<1x?x32xf32>, %sin: tensor<1x?x32xf32>, %mask: tensor<1x1x?x?xf32>) -> tensor<1x4x?x32xf32> {
  %cu = ad.unsqueeze %cos dim 1 : tensor<1x?x32xf32> -> tensor<1x1x?x32xf32>
  %su = ad.unsqueeze %sin dim 1 : tensor<1x?x32xf32> -> tensor<1x1x?x32xf32>
  %qc = ad.mul %q, %cu : tensor<1x4x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x4x?x32xf32>
  %q1 = ad.slice %q dim 3 [0, 16, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x16xf32>
  %q2 = ad.slice %q dim 3 [16, 32, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x16xf32>
  %qn = ad.neg %q2 : tensor<1x4x?x16xf32> -> tensor<1x4x?x16xf32>
  %qr = ad.cat %qn, %q1 dim -1 : (tensor<1x4x?x16xf32>, tensor<1x4x?x16xf32>) -> tensor<1x4x?x32xf32>
  %qs = ad.mul %qr, %su : tensor<1x4x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x4x?x32xf32>
  %qe = ad.add %qc, %qs : tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32> -> tensor<1x4x?x32xf32>
  %cu2 = ad.unsqueeze %cos dim 2 : tensor<1x?x32xf32> -> tensor<1x?x1x32xf32>
  %su2 = ad.unsqueeze %sin dim 2 : tensor<1x?x32xf32> -> tensor<1x?x1x32xf32>
  %kc = ad.mul %k, %cu2 : tensor<1x?x4x32xf32>, tensor<1x?x1x32xf32> -> tensor<1x?x4x32xf32>
  %k1 = ad.slice %k dim 3 [0, 16, 1] : tensor<1x?x4x32xf32> -> tensor<1x?x4x16xf32>
  %k2 = ad.slice %k dim 3 [16, 32, 1] : tensor<1x?x4x32xf32> -> tensor<1x?x4x16xf32>
  %kn = ad.neg %k2 : tensor<1x?x4x16xf32> -> tensor<1x?x4x16xf32>
  %kr = ad.cat %kn, %k1 dim -1 : (tensor<1x?x4x16xf32>, tensor<1x?x4x16xf32>) -> tensor<1x?x4x32xf32>
  %ks = ad.mul %kr, %su2 : tensor<1x?x4x32xf32>, tensor<1x?x1x32xf32> -> tensor<1x?x4x32xf32>
  %ke = ad.add %kc, %ks : tensor<1x?x4x32xf32>, tensor<1x?x4x32xf32> -> tensor<1x?x4x32xf32>
  %kt = ad.permute %ke [0, 2, 3, 1] : tensor<1x?x4x32xf32> -> tensor<1x4x32x?xf32>
  %s = ad.matmul %qe, %kt : (tensor<1x4x?x32xf32>, tensor<1x4x32x?xf32>) -> tensor<1x4x?x?xf32>
  %scaling = ad.constant 0.17677669529663687 : f64
  %scaled = ad.mul %s, %scaling : tensor<1x4x?x?xf32>, f64 -> tensor<1x4x?x?xf32>
  %masked = ad.add %scaled, %mask : tensor<1x4x?x?xf32>, tensor<1x1x?x?xf32> -> tensor<1x4x?x?xf32>
  %p = ad.softmax %masked dim -1 : tensor<1x4x?x?xf32> -> tensor<1x4x?x?xf32>
  %o = ad.matmul %p, %v : (tensor<1x4x?x?xf32>, tensor<1x4x?x32xf32>) -> tensor<1x4x?x32xf32>
  func.return %o : tensor<1x4x?x32xf32>
}
"""


def test_fuse_rope_attention_logs_why_an_eager_attention_on_a_seq_first_key_is_not_fused(caplog: pytest.LogCaptureFixture) -> None:
    """OpenAI-GPT's key, [batch, seq, heads, head_dim] read as permute(k, 0, 2, 3, 1): the op takes
    no seq-first key (insert-cached-attention caches it), and that is the reason logged."""
    module = Parser(make_context(), SEQ_FIRST_KEY).parse_module()
    with caplog.at_level(logging.INFO, logger="ad_mlir.passes.fuse_rope_attention"):
        run_pipeline(module, "fuse-rope-attention")
    assert "ad.rope_attention" not in str(module)
    assert any("not fused" in m and "seq-first key" in m for m in caplog.messages), caplog.messages
