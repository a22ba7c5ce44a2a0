"""Region kernels as torch ops on the shapes models hand them: operands whose type says `?`
where they are 1 at run time (MPT's ALiBi bias), and results that would alias an input
(GLM's rotary slices) on the reference path.

The kernels run in the Triton interpreter (tests/conftest.py) and are compared with eager
torch on the same inputs, fp32 at torch.testing's defaults: the kernel computes each
element in fp32 as eager does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from xdsl.parser import Parser

from ad_mlir.codegen.cache import KernelCache
from ad_mlir.codegen.lowering import kernel_ops
from ad_mlir.passes.pipeline import make_context
from ad_mlir.runtime import kernels
from ad_mlir.runtime.kernels import reference_kernels, region_kernel

ALIBI = """
func.func @f(%scores: tensor<1x4x?x?xf32>, %bias: tensor<4x?x?xf32>) -> (tensor<1x4x?x?xf32>, tensor<4x?x?xf32>) {
  %r:2 = ad.fused(%scores, %bias) : (tensor<1x4x?x?xf32>, tensor<4x?x?xf32>) -> (tensor<1x4x?x?xf32>, tensor<4x?x?xf32>) {
  ^bb0(%s: tensor<1x4x?x?xf32>, %b: tensor<4x?x?xf32>):
    %h = ad.constant 5.000000e-01 : f64
    %m = ad.mul %s, %h : tensor<1x4x?x?xf32>, f64 -> tensor<1x4x?x?xf32>
    %a = ad.add %m, %b : tensor<1x4x?x?xf32>, tensor<4x?x?xf32> -> tensor<1x4x?x?xf32>
    %e = ad.exp %b : tensor<4x?x?xf32> -> tensor<4x?x?xf32>
    ad.yield %a, %e : tensor<1x4x?x?xf32>, tensor<4x?x?xf32>
  }
  func.return %r#0, %r#1 : tensor<1x4x?x?xf32>, tensor<4x?x?xf32>
}
"""

SLICES = """
func.func @f(%x: tensor<3x8xf32>) -> (tensor<3x4xf32>, tensor<3x4xf32>) {
  %r:2 = ad.fused(%x) : (tensor<3x8xf32>) -> (tensor<3x4xf32>, tensor<3x4xf32>) {
  ^bb0(%y: tensor<3x8xf32>):
    %s = ad.slice %y dim 1 [0, 4, 1] : tensor<3x8xf32> -> tensor<3x4xf32>
    %t = ad.slice %y dim 1 [4, 8, 1] : tensor<3x8xf32> -> tensor<3x4xf32>
    %n = ad.neg %t : tensor<3x4xf32> -> tensor<3x4xf32>
    %m = ad.mul %n, %s : tensor<3x4xf32>, tensor<3x4xf32> -> tensor<3x4xf32>
    ad.yield %s, %m : tensor<3x4xf32>, tensor<3x4xf32>
  }
  func.return %r#0, %r#1 : tensor<3x4xf32>, tensor<3x4xf32>
}
"""


def _kernel(text: str, tmp_path: Path) -> kernels.RegionKernel:
    (op,) = kernel_ops(Parser(make_context(), text).parse_module())
    kernel = region_kernel(op, KernelCache(tmp_path))
    assert type(kernel.cached.jit_function).__name__ == "InterpretedFunction", "the real kernel must run"
    return kernel


@pytest.mark.parametrize("seq", [1, 5, 9])
def test_operand_typed_dynamic_that_is_one_at_run_time_broadcasts(seq: int, tmp_path: Path) -> None:
    """MPT: scores [1, 4, seq, seq] + bias [4, 1, seq] typed `4x?x?`. The bias must be read with
    stride 0 along its size-1 dim (it was read as if it had `seq` rows: out of bounds, errors
    of 1e26), and exp(bias), computed from the bias alone, keeps the bias's shape."""
    kernel = _kernel(ALIBI, tmp_path)
    full = torch.randn(4, 1, 64)
    scores, bias = torch.randn(1, 4, seq, seq), full[:, :, 64 - seq:]  # a strided slice, as in MPT
    got = kernel.op([scores, bias], [], [])
    expected = [scores * 0.5 + bias, bias.exp()]
    assert [g.shape for g in got] == [e.shape for e in expected]
    torch.testing.assert_close(got, expected)
    fake = kernel.fake([scores, bias], [], [])
    assert [f.shape for f in fake] == [e.shape for e in expected], "the fake must say what the kernel returns"


def test_operands_that_broadcast_each_other_at_run_time(tmp_path: Path) -> None:
    """The other way round: the scores are 1 where the bias is not."""
    kernel = _kernel(ALIBI, tmp_path)
    scores, bias = torch.randn(1, 4, 1, 6), torch.randn(4, 3, 6)
    got = kernel.op([scores, bias], [], [])
    torch.testing.assert_close(got, [scores * 0.5 + bias, bias.exp()])


@pytest.mark.parametrize("path", ["reference", "interpreter"])
def test_results_never_alias_an_input(path: str, tmp_path: Path) -> None:
    """GLM: a region yields a slice of its input. On the reference path that was a view of the
    input, which torch.library refuses at the first call."""
    kernel = _kernel(SLICES, tmp_path)
    x = torch.randn(3, 8)
    for call in (kernel.op, kernel.run):  # through torch's dispatch, and as `call_kernels_directly` calls it
        with reference_kernels() if path == "reference" else torch.no_grad():
            got = call([x], [], [])
        torch.testing.assert_close(got, [x[:, :4], -x[:, 4:] * x[:, :4]])
        storages = {t.untyped_storage().data_ptr() for t in (x, *got)}
        assert len(storages) == 3, "a result shares storage with the input or the other result"


PASSED_ON = """
func.func @f(%x: tensor<3x8xf32>) -> (tensor<3x8xf32>, tensor<3x8xf32>) {
  %r:2 = ad.fused(%x) : (tensor<3x8xf32>) -> (tensor<3x8xf32>, tensor<3x8xf32>) {
  ^bb0(%y: tensor<3x8xf32>):
    %n = ad.neg %y : tensor<3x8xf32> -> tensor<3x8xf32>
    ad.yield %y, %n : tensor<3x8xf32>, tensor<3x8xf32>
  }
  func.return %r#0, %r#1 : tensor<3x8xf32>, tensor<3x8xf32>
}
"""


@pytest.mark.parametrize("path", ["reference", "interpreter"])
def test_a_region_yielding_its_input_as_it_is_returns_a_copy(path: str, tmp_path: Path) -> None:
    """The input itself (contiguous: the results' `.contiguous()` copies nothing), yielded: on
    the reference path too, the result is a copy of the input, not the input."""
    kernel = _kernel(PASSED_ON, tmp_path)
    x = torch.randn(3, 8)
    for call in (kernel.op, kernel.run):
        with reference_kernels() if path == "reference" else torch.no_grad():
            got = call([x], [], [])
        torch.testing.assert_close(got, [x, -x])
        assert got[0].untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_only_regions_whose_results_are_new_tensors_skip_the_alias_check(tmp_path: Path) -> None:
    """The reference path skips `unaliased` where every result is made by an op that returns
    no alias (ALiBi's scores * 0.5 + bias and exp(bias)); a region that yields a slice of its
    input must not."""
    assert _kernel(ALIBI, tmp_path).fresh_outputs
    assert not _kernel(SLICES, tmp_path).fresh_outputs


def test_unaliased_copies_only_what_aliases() -> None:
    x, y = torch.randn(4), torch.randn(4)
    out = kernels.unaliased([x[:2], y, y], [x])
    assert out[1] is y
    assert out[0].untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert out[2].untyped_storage().data_ptr() != y.untyped_storage().data_ptr()
    assert all(torch.equal(a, b) for a, b in zip(out, [x[:2], y, y], strict=True))


CACHED = """
func.func @f(%q: tensor<?x4x?x16xf32>, %k: tensor<?x2x?x16xf32>, %v: tensor<?x2x?x16xf32>, %kc: tensor<2x8x2x16xf32>, %vc: tensor<2x8x2x16xf32>, %bt: tensor<?x1xi64>, %st: tensor<?xi64>) -> tensor<?x4x?x16xf32> {
  %0 = ad.cached_attention %q, %k, %v cache %kc, %vc block_tables %bt cache_starts %st scale 2.500000e-01 : (tensor<?x4x?x16xf32>, tensor<?x2x?x16xf32>, tensor<?x2x?x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x16xf32>
  func.return %0 : tensor<?x4x?x16xf32>
}
"""


@pytest.mark.parametrize("path", ["reference", "interpreter"])
def test_a_kernel_writing_its_caches_bumps_their_versions(path: str, tmp_path: Path) -> None:
    """Through its torch op, a cache-writing kernel writes the caches in place and bumps their
    version counters as an in-place torch op does (autograd checks saved tensors by them); the
    other inputs keep theirs."""
    kernel = _kernel(CACHED, tmp_path)
    assert kernel.written, "the caches are the op's written inputs"
    q, k, v = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16)
    k_cache, v_cache = torch.zeros(2, 8, 2, 16), torch.zeros(2, 8, 2, 16)
    block_tables, starts = torch.tensor([[1]]), torch.tensor([0])  # the slot form: slot 1 is one page
    before = [t._version for t in (q, k, v, k_cache, v_cache)]
    with reference_kernels() if path == "reference" else torch.no_grad():
        (out,) = kernel.op(*kernel.split_inputs([q, k, v, k_cache, v_cache, block_tables, starts]))
    assert out.shape == q.shape
    torch.testing.assert_close(k_cache[1, :3], k[0].transpose(0, 1))  # slot 1's first 3 positions
    torch.testing.assert_close(v_cache[1, :3], v[0].transpose(0, 1))
    assert not k_cache[0].any() and not k_cache[1, 3:].any(), "written where the slot and start say only"
    after = [t._version for t in (q, k, v, k_cache, v_cache)]
    assert after[:3] == before[:3] and all(a > b for a, b in zip(after[3:], before[3:], strict=True))


@pytest.mark.parametrize("path", ["reference", "interpreter"])
def test_backward_through_a_kernel_raises(path: str, tmp_path: Path) -> None:
    """Kernels have no autograd formula: a backward through one raises naming the op, on the
    reference path too (whose torch calls could differentiate), never gives no or partial
    gradients quietly."""
    kernel = _kernel(ALIBI, tmp_path)
    scores, bias = torch.randn(1, 4, 3, 3, requires_grad=True), torch.randn(4, 3, 3)
    with reference_kernels() if path == "reference" else torch.enable_grad():
        got = kernel.op([scores, bias], [], [])
    with pytest.raises(RuntimeError, match=rf"backward through ad_mlir.{kernel.name}.default but no autograd formula"):
        got[0].sum().backward()


STATE_OPS = """
func.func @f(%x: tensor<?x64x?xbf16>, %a: tensor<64x16xf32>, %b: tensor<?x16x?xbf16>, %d: tensor<64xf32>, %st: tensor<8x64x16xf32>, %s: tensor<?xi64>, %q: tensor<1x?x2x16xf32>, %v: tensor<1x?x4x8xf32>, %g: tensor<1x?x4xf32>, %rs: tensor<4x4x16x8xf32>) -> (tensor<?x64x?xf32>, tensor<1x?x4x8xf32>) {
  %0 = ad.cached_selective_scan %x, %x, %a, %b, %b d %d z %x dt_bias %d dt_softplus state %st slots %s starts %s : (tensor<?x64x?xbf16>, tensor<?x64x?xbf16>, tensor<64x16xf32>, tensor<?x16x?xbf16>, tensor<?x16x?xbf16>, tensor<8x64x16xf32>, tensor<?xi64>, tensor<?xi64>, d tensor<64xf32>, z tensor<?x64x?xbf16>, dt_bias tensor<64xf32>) -> tensor<?x64x?xf32>
  %1 = ad.cached_gated_delta_rule %q, %q, %v, %g, %g state %rs slots %s starts %s : (tensor<1x?x2x16xf32>, tensor<1x?x2x16xf32>, tensor<1x?x4x8xf32>, tensor<1x?x4xf32>, tensor<1x?x4xf32>, tensor<4x4x16x8xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<1x?x4x8xf32>
  func.return %0, %1 : tensor<?x64x?xf32>, tensor<1x?x4x8xf32>
}
"""


def test_each_recurrent_state_op_lowers_to_its_own_template() -> None:
    """Mamba1's selective scan (bf16 time steps, an fp32 output, with D, z, dt_bias and softplus)
    and the gated delta rule (fp32, key dim 16, no L2 norm) each get their template, with the
    options their IR states."""
    from ad_mlir.codegen.lowering import emit_kernel_source, kernel_region
    from ad_mlir.codegen.templates.gated_delta_rule_kernel import emit_gated_delta_rule_module
    from ad_mlir.codegen.templates.selective_scan_kernel import emit_selective_scan_module

    scan, rule = kernel_ops(Parser(make_context(), STATE_OPS).parse_module())
    assert emit_kernel_source(kernel_region(scan).region, "k", "") == emit_selective_scan_module(
        torch.bfloat16, torch.float32, True, True, True, True, False, "k", "")
    assert emit_kernel_source(kernel_region(rule).region, "k", "") == emit_gated_delta_rule_module(
        torch.float32, 16, False, False, "k", "")
