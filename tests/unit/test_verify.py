"""Numeric verification of every pass (`ad-opt --verify-each`, `compile(verify=True)`) and the
fallback for passes that fail (`skip_on_error`)."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
import torch
from kernel_guard import graph_kernels, no_dropped_ops
from xdsl.context import Context
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, TensorType, f64, i64
from xdsl.parser import Parser
from xdsl.passes import ModulePass
from xdsl.rewriter import Rewriter

import ad_mlir
from ad_mlir import passes
from ad_mlir.codegen import cache
from ad_mlir.dialects import ad
from ad_mlir.frontends.export import export_model
from ad_mlir.frontends.fx_import import import_program
from ad_mlir.passes.pipeline import (
    PipelineConfig,
    PipelineConfigError,
    load_pipeline,
    make_context,
    run_pipeline,
)
from ad_mlir.passes.verify import NumericMismatch, NumericVerifier, mismatch
from ad_mlir.tools import ad_opt
from ad_mlir.zoo.tiny import FAMILIES, TinyConfig, build_model


@dataclass(frozen=True)
class SiluAsSigmoid(ModulePass):
    """Test-only wrong rewrite: silu(x) -> sigmoid(x)."""

    name = "test-silu-as-sigmoid"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for silu in [o for o in op.walk() if isinstance(o, ad.SiluOp)]:
            wrong = ad.SigmoidOp.build(operands=[silu.input], result_types=[silu.result.type])
            wrong.location = silu.location
            Rewriter.replace_op(silu, wrong)


@dataclass(frozen=True)
class RaiseOnExp(ModulePass):
    """Test-only pass that fails halfway: it rewrites the first ad.neg, then raises on ad.exp."""

    name = "test-raise-on-exp"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for target in [o for o in op.walk() if isinstance(o, ad.NegOp | ad.ExpOp)]:
            if isinstance(target, ad.ExpOp):
                raise RuntimeError("cannot handle this exp")
            Rewriter.replace_op(target, ad.AbsOp.build(operands=[target.input], result_types=[target.result.type]))


@dataclass(frozen=True)
class RetypeNeg(ModulePass):
    """Test-only pass that leaves invalid IR: every ad.neg's result becomes f64 (its input f32)."""

    name = "test-retype-neg"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for neg in [o for o in op.walk() if isinstance(o, ad.NegOp)]:
            shape = neg.result.type.get_shape()
            Rewriter.replace_op(neg, ad.NegOp.build(operands=[neg.input], result_types=[TensorType(f64, shape)]))


@dataclass(frozen=True)
class NarrowCachedWindow(ModulePass):
    """Test-only wrong rewrite: every cached attention sees only the last 2 positions."""

    name = "test-narrow-cached-window"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for attention in [o for o in op.walk() if isinstance(o, ad.CachedAttentionOp)]:
            attention.window = IntegerAttr(2, i64)


@pytest.fixture
def test_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    for p in (SiluAsSigmoid, RaiseOnExp, RetypeNeg, NarrowCachedWindow):
        monkeypatch.setitem(passes._AD_PASSES, p.name, lambda p=p: p)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_verify_each_passes_the_default_pipeline_on_every_family(family: str, capsys: pytest.CaptureFixture) -> None:
    ad_opt.main(["--model", family, "--verify-each", "-p", "default"])
    assert "ad.fused" in capsys.readouterr().out


@pytest.mark.usefixtures("test_passes")
def test_verify_each_names_a_wrong_rewrite_and_the_first_op_it_breaks(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        ad_opt.main(["--model", "llama", "--verify-each", "-p", "canonicalize,test-silu-as-sigmoid,default"])
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: pass 'test-silu-as-sigmoid' changed the results: first differing op "
                          "%mul = ad.mul at model.layers.0.mlp: max |error| "), err
    assert err.endswith("it reads what the pass made: %silu = ad.sigmoid at model.layers.0.mlp.act_fn"), err
    assert "\n" not in err


CACHED = "default,insert-cached-attention{max-batch=4 max-seq-len=32}"


@pytest.mark.usefixtures("test_passes")
def test_verify_each_checks_the_cached_pipeline(capsys: pytest.CaptureFixture) -> None:
    """insert-cached-attention changes the function's arguments: the cached function runs on
    empty caches at start 0 (a prefill), which must compute what the uncached one did; a wrong
    window is caught and named."""
    ad_opt.main(["--model", "llama", "--for-generation", "--verify-each", "-p", CACHED])
    assert "ad.cached_attention" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        ad_opt.main(["--model", "llama", "--for-generation", "--verify-each", "-p",
                     CACHED + ",test-narrow-cached-window"])
    assert re.match(r"error: pass 'test-narrow-cached-window' changed the results: first differing op "
                    r"%\S+ = ad.cached_attention at model.layers.0.self_attn", capsys.readouterr().err)


FILECHECK = Path(__file__).parents[1] / "filecheck"
PAGED = "default,insert-cached-attention{max-seq-len=32 paged=true page-size=4 num-pages=8}"


@pytest.mark.usefixtures("test_passes")
def test_verify_each_checks_the_paged_pipeline(capsys: pytest.CaptureFixture) -> None:
    """The paged function runs one sequence of every token over empty pages with the logits of
    every token (a prefill), which must compute what the flattened uncached one did; a wrong
    window is caught and named."""
    ad_opt.main(["--model", "llama", "--for-generation", "--flat", "--verify-each", "-p", PAGED])
    assert "query_starts %query_starts" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        ad_opt.main(["--model", "llama", "--for-generation", "--flat", "--verify-each", "-p",
                     PAGED + ",test-narrow-cached-window"])
    assert re.match(r"error: pass 'test-narrow-cached-window' changed the results: first differing op "
                    r"%\S+ = ad.cached_attention at model.layers.0.self_attn", capsys.readouterr().err)


def test_verify_each_checks_the_paged_states(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The paged form with a convolution and a gated delta rule beside the attention (the
    FileCheck test's function): its example inputs take the page size from the page pools (the
    state pools come first) and state slot 0, and the paged function computes what the uncached
    one did (HF's chunked delta rule, the whole-sequence conv)."""
    chunks = (FILECHECK / "transforms" / "insert-cached-attention-paged.mlir").read_text().split("// -----")
    source = tmp_path / "hybrid.mlir"
    source.write_text(next(c for c in chunks if "func.func @hybrid" in c))
    ad_opt.main([str(source), "--verify-each", "-p",
                 "insert-cached-attention{max-batch=2 max-seq-len=16 paged=true page-size=4 num-pages=8}"])
    out = capsys.readouterr().out
    assert "ad.cached_gated_delta_rule" in out and "query_starts %query_starts" in out


def test_compile_verify_checks_the_paged_attention_kernel() -> None:
    """The compiled paged graph (the paged-attention kernel in the interpreter) against its IR."""
    from ad_mlir.llm.cache_export import export_for_cache
    from ad_mlir.llm.pipelines import paged_pipeline

    ep = export_for_cache(build_model(TinyConfig(layers=1)), 1, 32, flat=True)
    with no_dropped_ops():
        gm = ad_mlir.compile(ep, pipeline=paged_pipeline("default", 4, 8, 32), verify=True)
    assert any(k.startswith("cached_attention_") for k in graph_kernels(gm))


def test_compile_verify_checks_the_cached_attention_kernel() -> None:
    """The compiled cached graph (the cached-attention kernel in the interpreter) against its IR."""
    from ad_mlir.llm.cache_export import export_for_cache
    from ad_mlir.llm.pipelines import cached_pipeline

    ep = export_for_cache(build_model(TinyConfig(layers=1)), max_batch=4, max_seq_len=32)
    with no_dropped_ops():  # every op got its kernel: the check covers them all
        gm = ad_mlir.compile(ep, pipeline=cached_pipeline("default", 4, 32), verify=True)
    assert any(k.startswith("cached_attention_") for k in graph_kernels(gm))


@pytest.mark.usefixtures("test_passes")
def test_compile_verify_catches_the_wrong_rewrite_and_passes_the_right_pipeline() -> None:
    cfg = TinyConfig(layers=1, dtype="bfloat16")
    ep = export_model(build_model(cfg))
    with pytest.raises(NumericMismatch, match="pass 'test-silu-as-sigmoid' changed the results"):
        ad_mlir.compile(ep, pipeline="canonicalize,test-silu-as-sigmoid,default", verify=True)
    ad_mlir.compile(ep, verify=True)  # the kernels (interpreter) against the final IR, too


@pytest.mark.usefixtures("test_passes")
def test_wide_activations_let_rounding_through_but_not_a_wrong_rewrite() -> None:
    """A wide-init model (weights of std 0.5) amplifies fp32 rounding past the fixed tolerance
    (the nudged run accepts what the default pipeline's reordering does), yet a wrong rewrite
    there moves values far more than a nudge of one rounding does, and is caught: here a decode
    window of 2 (the cached function is a prefill: its attention sees too few keys)."""
    from ad_mlir.llm.cache_export import export_for_cache
    from ad_mlir.llm.pipelines import cached_pipeline
    from ad_mlir.zoo.small import model_from_config, small_config

    config = small_config("bloom", layers=1, hidden_size=64)
    config.initializer_range = 0.5
    ep = export_for_cache(model_from_config(config), 2, 16)
    pipeline = cached_pipeline("default", 2, 16)
    ad_mlir.compile(ep, pipeline=pipeline, verify=True)
    with pytest.raises(NumericMismatch, match=r"pass 'test-narrow-cached-window' changed the results: .*"
                                              r"\(a rounding of the inputs moves it "):
        ad_mlir.compile(ep, pipeline=PipelineConfig((*pipeline.passes, NarrowCachedWindow())), verify=True)


def test_compile_verify_names_the_wrong_kernel_and_its_input_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    """One kernel (add + RMSNorm) made wrong on its Triton path only: the check of the compiled
    graph finds the result that moved, then the kernel whose outputs differ from its region's
    reference on the same inputs."""
    ep = export_model(build_model(TinyConfig(layers=1)))
    real_import = cache._import

    def wrong_import(path: Path, name: str) -> ModuleType:
        module = real_import(path, name)
        if name.startswith("add_rms_norm"):
            launch = module.launch
            monkeypatch.setattr(module, "launch", lambda *a: [t + 1 for t in launch(*a)])
        return module

    monkeypatch.setattr(cache, "_import", wrong_import)
    with pytest.raises(NumericMismatch) as caught:
        ad_mlir.compile(ep, verify=True)
    message = str(caught.value)
    assert re.search(r"the compiled graph's kernels differ from the IR the pipeline made, result 0: max .error. "
                     r".*; the first kernel that differs: add_rms_norm_[0-9a-f]+ \(inputs torch.float32\[1, 7, 64\], "
                     r"torch.float32\[1, 7, 64\], torch.float32\[64\]\), output 0: max .error. ", message), message


def test_tolerances_by_dtype() -> None:
    x = torch.randn(64)
    assert mismatch(x + 1e-6, x) is None  # fp32: a reordered sum
    assert "max |error|" in mismatch(x + 1e-3, x)
    b = x.bfloat16()
    assert mismatch((b.float() * (1 + 2**-8)).bfloat16(), b) is None  # one bf16 ulp
    assert mismatch(b + 0.1, b) is not None
    h = x.half()
    assert mismatch((h.float() * (1 + 2**-10)).half(), h) is None  # one fp16 ulp
    assert mismatch((h.float() * 1.05).half(), h) is not None  # 5%: far past fp16's two ulps
    assert mismatch(torch.tensor([1, 2]), torch.tensor([1, 3])) == "values differ (exact dtype)"
    assert mismatch(torch.tensor([float("nan")]), torch.tensor([1.0])).startswith("NaN/inf")
    assert mismatch(x[:3], x) == "torch.float32[3] instead of torch.float32[64]"


def _exp_and_neg_module() -> tuple[torch.export.ExportedProgram, torch.Tensor]:
    class ExpNeg(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.exp(-x) * 2

    x = torch.randn(3, 5)
    return torch.export.export(ExpNeg(), (x,)), x


@pytest.mark.usefixtures("test_passes")
def test_a_failing_pass_is_skipped_with_skip_on_error_and_the_graph_stays_correct(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "p.yaml"
    config.write_text("skip_on_error: true\ntransforms:\n  test_raise_on_exp: {}\n  fuse_elementwise: {}\n")
    ep, x = _exp_and_neg_module()
    with caplog.at_level(logging.WARNING, logger="ad_mlir.passes.pipeline"):
        gm = ad_mlir.compile(ep, pipeline=config)
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "ad_mlir.passes.pipeline"]
    assert warning.startswith("test-raise-on-exp: skipped (skip_on_error), the graph is left as before it: on ")
    assert "= ad.exp" in warning and warning.endswith("RuntimeError: cannot handle this exp")
    torch.testing.assert_close(gm(x)[0], ep.module()(x))  # the neg the pass rewrote before failing is back


@pytest.mark.usefixtures("test_passes")
def test_a_failing_pass_raises_when_skipping_is_off() -> None:
    ep, _ = _exp_and_neg_module()
    with pytest.raises(RuntimeError, match="cannot handle this exp"):  # the test suite sets AD_MLIR_SKIP_ON_ERROR=0
        ad_mlir.compile(ep, pipeline="test-raise-on-exp")


@pytest.mark.usefixtures("test_passes")
def test_a_wrong_rewrite_is_undone_with_skip_on_error() -> None:
    cfg = TinyConfig(layers=1)
    program = import_program(export_model(build_model(cfg)))
    records = run_pipeline(program.module, "canonicalize,test-silu-as-sigmoid,default",
                           numeric=NumericVerifier(program.weights), skip_on_error=True)
    assert [r.name for r in records][:3] == ["canonicalize", "test-silu-as-sigmoid", "canonicalize"]
    names = {op.name for op in program.module.walk()}
    assert "ad.sigmoid" not in names and "ad.silu_and_mul" in names


@pytest.mark.usefixtures("test_passes")
def test_a_pass_that_leaves_invalid_ir_is_named_or_skipped(caplog: pytest.LogCaptureFixture) -> None:
    """The passes run straight through and the IR is verified once at the end; invalid IR there
    runs the pipeline again pass by pass, which names the pass that left it (or skips it)."""
    ep, _ = _exp_and_neg_module()
    program = import_program(ep)
    with pytest.raises(Exception, match="result element type f64 differs from the input's f32"):
        run_pipeline(program.module, "canonicalize,test-retype-neg,fuse-elementwise", skip_on_error=False)
    program = import_program(ep)
    with caplog.at_level(logging.WARNING, logger="ad_mlir.passes.pipeline"):
        records = run_pipeline(program.module, "canonicalize,test-retype-neg,fuse-elementwise", skip_on_error=True)
    assert [r.name for r in records] == ["canonicalize", "test-retype-neg", "fuse-elementwise"]
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "ad_mlir.passes.pipeline"]
    assert warning.startswith("test-retype-neg: skipped (skip_on_error)"), warning
    program.module.verify()


def test_a_valid_pipeline_verifies_the_module_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """No copy of the module per pass and no verification per pass where nothing fails."""
    ep, _ = _exp_and_neg_module()
    program = import_program(ep)
    calls = {"verify": 0, "clone": 0}
    for name in calls:
        real = getattr(ModuleOp, name)
        monkeypatch.setattr(ModuleOp, name, lambda self, *a, _real=real, _name=name, **k:
                            (calls.__setitem__(_name, calls[_name] + 1), _real(self, *a, **k))[1])
    run_pipeline(program.module, "default", skip_on_error=True)
    assert calls == {"verify": 1, "clone": 1}


def test_skip_on_error_in_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "p.yaml"
    config.write_text("skip_on_error: maybe\ntransforms:\n  canonicalize: {}\n")
    with pytest.raises(PipelineConfigError, match="skip_on_error must be true or false, got 'maybe'"):
        load_pipeline(config)
    config.write_text("transforms:\n  canonicalize: {}\n")
    assert load_pipeline(config).skip_on_error is None
    monkeypatch.delenv("AD_MLIR_SKIP_ON_ERROR")
    from ad_mlir.passes.pipeline import default_skip_on_error

    assert default_skip_on_error()


def test_passes_after_sharding_are_not_checked_and_say_so(caplog: pytest.LogCaptureFixture) -> None:
    cfg = TinyConfig(layers=1, hidden_size=128)
    program = import_program(export_model(build_model(cfg)))
    numeric = NumericVerifier(program.weights)
    with caplog.at_level(logging.WARNING, logger="ad_mlir.passes.verify"):
        run_pipeline(program.module, "canonicalize,shard{world-size=2},fuse-silu-mul", numeric=numeric)
    assert numeric.skipped == ["shard", "fuse-silu-mul"]
    assert "verify: shard not checked numerically: the module holds collectives, which one process cannot run" in [
        r.getMessage() for r in caplog.records if r.name == "ad_mlir.passes.verify"]


EMBED = """
func.func @forward(%table: tensor<4x8xf32> {{ad.param = "embed.weight"}}, %ids: tensor<1x?xi64> {{ad.input = "input_ids"}}) -> tensor<1x?x8xf32> {{
  {ids}
  %e = ad.embedding %table, %looked : (tensor<4x8xf32>, tensor<1x?xi64>) -> tensor<1x?x8xf32>
  func.return %e : tensor<1x?x8xf32>
}}
"""


def test_verify_feeds_token_zero_so_a_rewrite_wrong_only_there_is_caught() -> None:
    """The verifier's token ids cover the whole table, row 0 included: a rewrite that sends token
    0 to row 1 (and leaves every other token alone) is a mismatch, not a pass."""
    same = "%looked = ad.alias %ids : tensor<1x?xi64> -> tensor<1x?xi64>"
    wrong_at_zero = ("%zero = ad.constant 0 : i64\n  %one = ad.constant 1 : i64\n"
                     "  %is0 = ad.eq %ids, %zero : tensor<1x?xi64>, i64 -> tensor<1x?xi1>\n"
                     "  %looked = ad.where %is0, %one, %ids : tensor<1x?xi1>, i64, tensor<1x?xi64> -> tensor<1x?xi64>")
    verifier = NumericVerifier({"embed.weight": torch.randn(4, 8, generator=torch.Generator().manual_seed(1))})
    verifier.before_pass(Parser(make_context(), EMBED.format(ids=same)).parse_module())
    with pytest.raises(NumericMismatch, match="test-token-0-to-row-1"):
        verifier.check_pass("test-token-0-to-row-1", Parser(make_context(), EMBED.format(ids=wrong_at_zero)).parse_module())
