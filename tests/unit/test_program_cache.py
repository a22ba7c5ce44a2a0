"""The compiled-program cache (`runtime/program_cache.py`): a second compile of the same program,
in a new process, skips the passes and gives eager's results; the weights of each compile are
used (the fused GEMMs' concatenation is redone on them); a buffer value, a constant, the pipeline
or the rank changes the key; a damaged entry is compiled again and rewritten; concurrent writers
leave one whole entry."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ad_mlir
from ad_mlir.codegen.cache import KernelCache
from ad_mlir.frontends.export import export_model
from ad_mlir.frontends.fx_import import import_program
from ad_mlir.passes.fuse_elementwise import FuseElementwisePass
from ad_mlir.passes.pipeline import PipelineConfig, load_pipeline
from ad_mlir.runtime.program_cache import PROGRAM_CACHE_VARIABLE, ProgramCache, checksum, program_key
from ad_mlir.semantics.weights import Rank
from ad_mlir.zoo.tiny import TinyConfig, build_model, example_input_ids

CFG = TinyConfig(layers=1)
"""One Llama layer: RMSNorms, fused Q/K/V and gate/up GEMMs, RoPE attention, SiLU * up."""
ROOT = Path(__file__).parents[2]
SKIPPED = "the pass pipeline skipped"


@pytest.fixture(autouse=True)
def _program_cache_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PROGRAM_CACHE_VARIABLE, "1")  # the suite turns it off (tests/conftest.py)


def _model(seed: int = 0) -> torch.nn.Module:
    return build_model(TinyConfig(layers=1, seed=seed))


def _logits(model: torch.nn.Module, gm: torch.fx.GraphModule, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        return gm(ids)[0], model(input_ids=ids).logits


def _entries(directory: Path) -> list[Path]:
    return sorted((directory / "programs").glob("*.mlir"))


NEW_PROCESS = """
import sys
from pathlib import Path
import torch
import ad_mlir
from ad_mlir import compiler
from ad_mlir.codegen.cache import KernelCache
from ad_mlir.frontends.export import export_model
from ad_mlir.zoo.tiny import TinyConfig, build_model, example_input_ids

def no_passes(*args, **kwargs):
    raise AssertionError("the passes ran: the program was not read from the cache")

compiler.run_pipeline = no_passes
cfg = TinyConfig(layers=1)
model = build_model(cfg)
cache = KernelCache(Path(sys.argv[1]))
gm = ad_mlir.compile(export_model(model), cache=cache)
ids = example_input_ids(cfg, 11, seed=3)
with torch.no_grad():
    torch.testing.assert_close(gm(ids)[0], model(input_ids=ids).logits)
print("generated", cache.generated, "hits", cache.hits)
"""


def test_the_counters_count_the_programs_stored_and_read(tmp_path: Path) -> None:
    """`stored` counts the programs written, `hits` those read from a valid entry (none for a
    missing or a damaged one), both from 0."""
    from xdsl.parser import Parser

    from ad_mlir.passes.pipeline import make_context

    module = Parser(make_context(), "func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> {\n"
                                    "  func.return %x : tensor<2xf32>\n}\n").parse_module()
    writer, reader = ProgramCache(tmp_path), ProgramCache(tmp_path)
    assert (writer.stored, writer.hits, reader.hits) == (0, 0, 0)
    writer.store("a" * 64, module)
    writer.store("b" * 64, module)
    assert writer.stored == 2 and writer.hits == 0
    assert reader.load("a" * 64) is not None and reader.load("c" * 64) is None
    assert reader.hits == 1
    reader.path("b" * 64).write_text("damaged\n")
    assert reader.load("b" * 64) is None and reader.hits == 1


def test_a_new_process_reads_the_program_and_matches_eager(tmp_path: Path) -> None:
    """The second compile runs in a fresh process whose pass pipeline raises: it can only
    succeed from the stored program; its kernels all come from the kernel cache."""
    model = _model()
    got, expected = _logits(model, ad_mlir.compile(export_model(model), cache=KernelCache(tmp_path)),
                            example_input_ids(CFG, 11, seed=3))
    torch.testing.assert_close(got, expected)
    assert len(_entries(tmp_path)) == 1
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", NEW_PROCESS, str(tmp_path)], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    generated, hits = run.stdout.split()[1::2]
    assert generated == "0" and int(hits) >= 1, run.stdout


def test_weights_are_those_of_each_compile(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Another model of the same shapes reads the stored program, and its compiled graph holds
    its own weights: the fused Q/K/V and gate/up weights are concatenated from them again."""
    first, second = _model(seed=0), _model(seed=1)
    ids = example_input_ids(CFG, 9, seed=2)
    ad_mlir.compile(export_model(first), cache=KernelCache(tmp_path))
    with caplog.at_level(logging.INFO, logger="ad_mlir.runtime.program_cache"):
        gm = ad_mlir.compile(export_model(second), cache=KernelCache(tmp_path))
    assert SKIPPED in caplog.text and len(_entries(tmp_path)) == 1
    got, expected = _logits(second, gm, ids)
    torch.testing.assert_close(got, expected)
    assert not torch.allclose(expected, _logits(first, gm, ids)[1]), "the two models must differ"


def test_a_changed_buffer_value_misses(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """RoPE's inverse frequencies are a buffer: the same graph with other frequencies is not
    served the first model's program (a pass could have read them), and compiles right."""
    model = _model()
    ad_mlir.compile(export_model(model), cache=KernelCache(tmp_path))
    with torch.no_grad():
        model.model.rotary_emb.inv_freq.mul_(1.5)
    with caplog.at_level(logging.INFO, logger="ad_mlir.runtime.program_cache"):
        gm = ad_mlir.compile(export_model(model), cache=KernelCache(tmp_path))
    assert SKIPPED not in caplog.text and len(_entries(tmp_path)) == 2
    torch.testing.assert_close(*_logits(model, gm, example_input_ids(CFG, 9, seed=2)))


def test_key_changes_with_what_the_pipeline_result_depends_on() -> None:
    """Parameter values do not change the key; a buffer value, a constant of the graph (the
    RMSNorm epsilon), the pipeline, a failing pass's handling and the rank do."""
    passes = load_pipeline("default").passes
    pipeline, rank = PipelineConfig(passes, skip_on_error=False), Rank()

    def key(model: torch.nn.Module, pipeline=pipeline, rank=rank) -> str:  # noqa: ANN001
        return program_key(import_program(export_model(model)), pipeline, rank)

    base = key(_model())
    assert key(_model(seed=1)) == base
    rope = _model()
    rope.model.rotary_emb.inv_freq += 1e-3
    eps = build_model(TinyConfig(layers=1, hf_overrides=(("rms_norm_eps", 1e-5),)))
    others = {key(rope), key(eps), key(_model(), pipeline=PipelineConfig(passes[:1], skip_on_error=False)),
              key(_model(), pipeline=PipelineConfig(passes, skip_on_error=True)),
              key(_model(), rank=Rank(1, 2)),
              key(_model(), pipeline=PipelineConfig((*passes, FuseElementwisePass(max_ops=8)), skip_on_error=False)),
              key(_model(), pipeline=PipelineConfig((*passes, FuseElementwisePass(max_ops=9)), skip_on_error=False))}
    assert base not in others and len(others) == 7


def test_a_damaged_entry_is_compiled_again_and_rewritten(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model = _model()
    ep = export_model(model)
    ids = example_input_ids(CFG, 7, seed=4)
    ad_mlir.compile(ep, cache=KernelCache(tmp_path))
    (path,) = _entries(tmp_path)
    good = path.read_text()
    body, _, _ = good.rstrip("\n").rpartition("\n")
    unparsable = body.replace('"ad.', '"ad.no_such_op_', 1)
    checksummed = unparsable + "\n// checksum: " + checksum(unparsable + "\n") + "\n"
    for damaged, said in ((good[: len(good) // 2], "corrupt"), (good.replace("ad.linear", "ad.lienar", 1), "corrupt"),
                          ("", "corrupt"), (checksummed, "does not parse")):
        path.write_text(damaged)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="ad_mlir.runtime.program_cache"):
            gm = ad_mlir.compile(ep, cache=KernelCache(tmp_path))
        assert said in caplog.text and path.name in caplog.text and SKIPPED not in caplog.text, caplog.text
        assert path.read_text() == good
        torch.testing.assert_close(*_logits(model, gm, ids))
    assert not list((tmp_path / "programs").glob(".*.tmp")), "atomic writes leave no temp files"


WRITER = """
import sys
from pathlib import Path
import ad_mlir
from ad_mlir.codegen.cache import KernelCache
from ad_mlir.frontends.export import export_model
from ad_mlir.zoo.tiny import TinyConfig, build_model

cfg = TinyConfig(layers=1)
ep = export_model(build_model(cfg))
print("ready", flush=True)
sys.stdin.readline()  # all writers start compiling together
ad_mlir.compile(ep, cache=KernelCache(Path(sys.argv[1])))
"""


def test_concurrent_writers_leave_one_whole_entry(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Three processes compile the same program into one empty cache at once: each writes the
    entry or reads a whole one another wrote, and what is left is a whole entry a fourth
    compile reads."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
               for _ in range(3)]
    for w in writers:
        assert w.stdout is not None and w.stdout.readline().strip() == "ready"
    for w in writers:
        assert w.stdin is not None
        w.stdin.write("go\n")
        w.stdin.flush()
    for w in writers:
        _, err = w.communicate(timeout=600)
        assert w.returncode == 0, err[-3000:]
    assert len(_entries(tmp_path)) == 1 and not list((tmp_path / "programs").glob(".*.tmp"))
    model = _model()
    with caplog.at_level(logging.INFO, logger="ad_mlir.runtime.program_cache"):
        gm = ad_mlir.compile(export_model(model), cache=KernelCache(tmp_path))
    assert SKIPPED in caplog.text
    torch.testing.assert_close(*_logits(model, gm, example_input_ids(CFG, 5, seed=6)))


def test_llm_from_a_stored_program_generates_hf_tokens(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """`LLM` (the cache-inserting pipeline, K/V caches as the function's arguments) built again
    reads the stored program, the same module the passes made, and generates HF's greedy tokens."""
    from ad_mlir.llm.llm import LLM
    from ad_mlir.runtime.program_cache import module_text

    model = build_model(TinyConfig(layers=2, hf_overrides=(("initializer_range", 0.5),)))
    prompts = [[5, 9, 3], [7, 1, 2, 8, 4], [11, 6]]  # more prompts than slots
    first = LLM(model, max_batch=2, max_seq_len=32, cache=KernelCache(tmp_path))
    with caplog.at_level(logging.INFO, logger="ad_mlir.runtime.program_cache"):
        second = LLM(model, max_batch=2, max_seq_len=32, cache=KernelCache(tmp_path))
    assert SKIPPED in caplog.text
    assert module_text(second.program.module) == module_text(first.program.module)
    outputs = second.generate(prompts, max_new_tokens=6, ignore_eos=True)
    expected = [model.generate(torch.tensor([p]), max_new_tokens=6, min_new_tokens=6, do_sample=False)[0, len(p):].tolist()
                for p in prompts]
    assert len({tuple(e) for e in expected}) > 1, "HF's tokens must vary for the comparison to mean something"
    assert [o.token_ids for o in outputs] == expected


def test_the_passes_warnings_are_said_again(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass skipped on error when the program was stored is named again when it is read:
    the reused program lacks that pass's rewrite, and says so."""
    monkeypatch.setenv("AD_MLIR_SKIP_ON_ERROR", "1")
    pipeline = 'canonicalize,quantize-linear-fp8{scheme="static"},fuse-elementwise'  # static needs a scale
    model = _model()
    ep = export_model(model)
    with caplog.at_level(logging.WARNING):
        ad_mlir.compile(ep, pipeline=pipeline, cache=KernelCache(tmp_path))
    (skipped,) = [" ".join(r.getMessage().split()) for r in caplog.records if "skipped (skip_on_error)" in r.getMessage()]
    caplog.clear()
    with caplog.at_level(logging.INFO):
        gm = ad_mlir.compile(ep, pipeline=pipeline, cache=KernelCache(tmp_path))
    assert SKIPPED in caplog.text
    assert [r.getMessage() for r in caplog.records if "logged when the stored program" in r.getMessage()] == [
        f"{skipped} (logged when the stored program {_entries(tmp_path)[0].name} was compiled)"]
    torch.testing.assert_close(*_logits(model, gm, example_input_ids(CFG, 7, seed=8)))
