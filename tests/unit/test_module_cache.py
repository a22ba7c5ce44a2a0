"""The program cache's module entries (`runtime/program_cache.py`, keyed by
`frontends/export_key.py`): compiling an `nn.Module` (`ad_mlir.compile(model, inputs)`, `LLM`)
again, in a new process, runs neither torch.export nor the passes and gives the cold compile's
outputs exactly; another model of the same shapes gets its own weights; whatever decides the
export changes the key; what the fingerprint cannot describe is not cached; a damaged entry, or
a missing program behind it, is exported and compiled again."""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers.models.llama import modeling_llama

import ad_mlir
from ad_mlir.codegen.cache import KernelCache
from ad_mlir.compiler import CompileOptions, module_entry_key
from ad_mlir.frontends.export_key import Unkeyable, export_fingerprint
from ad_mlir.frontends.graph_sources import module_export
from ad_mlir.passes.pipeline import load_pipeline
from ad_mlir.runtime.program_cache import PROGRAM_CACHE_VARIABLE, module_key
from ad_mlir.semantics.weights import Rank
from ad_mlir.zoo.tiny import TinyConfig, build_model

ROOT = Path(__file__).parents[2]
LLM_CFG = TinyConfig(layers=6, hf_overrides=(("initializer_range", 0.5),))
"""Weights large enough that greedy tokens vary; six layers, so that `LLM`'s program with its
per-layer caches is shortened and lengthened too."""
IDS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
PROMPTS = [[5, 9, 3], [7, 1, 2, 8, 4], [11, 6]]  # more prompts than slots
READ = "torch.export skipped"


@pytest.fixture(autouse=True)
def _program_cache_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PROGRAM_CACHE_VARIABLE, "1")  # the suite turns it off (tests/conftest.py)


class _Exports:
    """Counts torch.export.export calls (and still exports)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls, self._export = 0, torch.export.export
        monkeypatch.setattr(torch.export, "export", self)

    def __call__(self, *args: Any, **kwargs: Any) -> torch.export.ExportedProgram:
        self.calls += 1
        return self._export(*args, **kwargs)


def _compile(model: torch.nn.Module, cache: Path, **kwargs: Any) -> torch.fx.GraphModule:
    seq = torch.export.Dim("seq", min=2, max=64)
    return ad_mlir.compile(model, {"input_ids": IDS}, dynamic_shapes={"input_ids": {1: seq}},
                           cache=KernelCache(cache), **kwargs)


def _run(gm: torch.fx.GraphModule) -> torch.Tensor:
    with torch.no_grad():
        return gm(IDS)[0]


NEW_PROCESS = """
import json, logging, sys
from pathlib import Path
import torch
import ad_mlir
from ad_mlir import compiler
from ad_mlir.codegen.cache import KernelCache
from ad_mlir.llm.llm import LLM
from ad_mlir.zoo.tiny import TinyConfig, build_model

def refused(*args, **kwargs):
    raise AssertionError("torch.export or the passes ran: the compile was not read from the cache")

cache, prompts, mode = Path(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
if mode == "warm":
    torch.export.export = refused
    compiler.run_pipeline = refused
logging.basicConfig(level=logging.INFO)
ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
seq = torch.export.Dim("seq", min=2, max=64)
gm = ad_mlir.compile(build_model(TinyConfig(layers=6)), {"input_ids": ids}, dynamic_shapes={"input_ids": {1: seq}},
                     cache=KernelCache(cache))
with torch.no_grad():
    torch.save(gm(ids)[0], cache / f"{mode}.pt")
llm = LLM(build_model(TinyConfig(layers=6, hf_overrides=(("initializer_range", 0.5),))), max_batch=2, max_seq_len=32,
          cache=KernelCache(cache))
tokens = [o.token_ids for o in llm.generate(prompts, max_new_tokens=4, ignore_eos=True)]
print(json.dumps(tokens))
"""


def _in_a_new_process(cache: Path, mode: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", NEW_PROCESS, str(cache), json.dumps(PROMPTS), mode],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def test_a_new_process_compiles_without_exporting(tmp_path: Path) -> None:
    """Both compiles run in fresh processes (the key covers the state of the Python modules the
    model's code comes from, which tests run before in this one may have changed), the second
    with torch.export and the pass pipeline raising: `compile(nn.Module)` of a six-layer Llama
    (a shortened program, lengthened) gives the cold compile's logits bit for bit, and `LLM` of
    another (its caches lengthened too) the cold one's tokens, which are HF's."""
    cold = _in_a_new_process(tmp_path, "cold")
    assert cold.stderr.count("6 layers of period 1, compiled 5 and instantiated the other 1") == 2, cold.stderr[-3000:]
    assert len(list((tmp_path / "programs").glob("*.export"))) == 2
    warm = _in_a_new_process(tmp_path, "warm")
    assert torch.equal(torch.load(tmp_path / "warm.pt"), torch.load(tmp_path / "cold.pt"))
    tokens = json.loads(cold.stdout.splitlines()[-1])
    assert json.loads(warm.stdout.splitlines()[-1]) == tokens
    model = build_model(LLM_CFG)
    expected = [model.generate(torch.tensor([p]), max_new_tokens=4, min_new_tokens=4, do_sample=False)[0, len(p):].tolist()
                for p in PROMPTS]
    assert len({tuple(e) for e in expected}) > 1, "HF's tokens must vary for the comparison to mean something"
    assert tokens == expected


def test_another_models_weights_are_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          caplog: pytest.LogCaptureFixture) -> None:
    """A model of the same config with other weights is served the stored compile without an
    export, and its compiled graph computes with its own weights (bound by name)."""
    first, second = build_model(TinyConfig(layers=1)), build_model(TinyConfig(layers=1, seed=1))
    _compile(first, tmp_path)
    exports = _Exports(monkeypatch)
    with caplog.at_level(logging.INFO):
        got = _run(_compile(second, tmp_path))
    assert exports.calls == 0 and READ in caplog.text
    with torch.no_grad():
        expected, other = second(input_ids=IDS).logits, first(input_ids=IDS).logits
    # fp32 in the interpreter: only the fused ops' order of summation differs from eager
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(expected, other), "the two models must differ"


def _key(model: torch.nn.Module, inputs: dict[str, torch.Tensor] | None = None, dynamic_shapes: Any = "seq",
         pipeline: str = "default", rank: Rank | None = None, layers_once: bool = True) -> str:
    seq = torch.export.Dim("seq", min=2, max=64)
    shapes = {"input_ids": {1: seq}} if dynamic_shapes == "seq" else dynamic_shapes
    fingerprint = export_fingerprint(module_export(model, inputs or {"input_ids": IDS}, shapes))
    return module_key(fingerprint, load_pipeline(pipeline), rank or Rank(), layers_once)


def _patched_mlp_forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return self.down_proj(self.up_proj(x))


def test_the_key_changes_with_what_decides_the_export(monkeypatch: pytest.MonkeyPatch) -> None:
    """Other parameter values keep the key; a config field, a private config attribute, a
    weight's dtype or shape, a buffer's value, a forward set on an instance, a method (decorated
    or not) or a modeling file's function replaced at run time, the example input's shape, the
    dynamic_shapes, grad mode, the pipeline, the rank and `layers_once` each change it."""
    base = _key(build_model(TinyConfig(layers=1)))
    assert _key(build_model(TinyConfig(layers=1, seed=1))) == base

    def changed(change: Any) -> torch.nn.Module:
        model = build_model(TinyConfig(layers=1))
        change(model)
        return model

    def set_forward(m: torch.nn.Module) -> None:
        mlp = m.model.layers[0].mlp
        mlp.forward = types.MethodType(_patched_mlp_forward, mlp)

    keys = {
        "config field": _key(changed(lambda m: setattr(m.config, "max_position_embeddings", 99))),
        "attention implementation": _key(changed(lambda m: setattr(m.config, "_attn_implementation", "eager"))),
        "weight dtype": _key(changed(lambda m: m.lm_head.to(torch.float64))),
        "weight shape": _key(changed(lambda m: setattr(m.model.norm, "weight", torch.nn.Parameter(torch.ones(65))))),
        "buffer value": _key(changed(lambda m: m.model.rotary_emb.inv_freq.mul_(1.5))),
        "instance forward": _key(changed(set_forward)),
        "input shape": _key(build_model(TinyConfig(layers=1)), {"input_ids": IDS[:, :5]}),
        "dynamic shapes": _key(build_model(TinyConfig(layers=1)), dynamic_shapes=None),
        "pipeline": _key(build_model(TinyConfig(layers=1)), pipeline="canonicalize"),
        "rank": _key(build_model(TinyConfig(layers=1)), rank=Rank(1, 2)),
        "layers once": _key(build_model(TinyConfig(layers=1)), layers_once=False),
    }
    with torch.no_grad():
        keys["grad mode"] = _key(build_model(TinyConfig(layers=1)))
    with monkeypatch.context() as patch:
        patch.setattr(modeling_llama.LlamaMLP, "forward", _patched_mlp_forward)
        keys["class method"] = _key(build_model(TinyConfig(layers=1)))
    with monkeypatch.context() as patch:
        patch.setattr(modeling_llama, "apply_rotary_pos_emb", lambda q, k, cos, sin, *a: (q, k))
        keys["modeling function"] = _key(build_model(TinyConfig(layers=1)))
    assert [name for name, key in keys.items() if key == base] == []
    assert len(set(keys.values())) == len(keys)
    decorated = {}
    for name, forward in (("original", modeling_llama.LlamaMLP.forward), ("patched", _patched_mlp_forward)):
        with monkeypatch.context() as patch:
            patch.setattr(modeling_llama.LlamaMLP, "forward", _decorated(forward))
            decorated[name] = _key(build_model(TinyConfig(layers=1)))
    assert decorated["original"] != decorated["patched"], "the decorator's code is the same: what it wraps differs"


def test_a_generation_configs_hash_of_itself_keeps_the_key() -> None:
    """A GenerationConfig keeps `hash(self)` in `_original_object_hash`: a str's hash, another in
    each process (PYTHONHASHSEED), not what the config configures: the same model keys the same."""
    base = _key(build_model(TinyConfig(layers=1)))
    model = build_model(TinyConfig(layers=1))
    model.generation_config._original_object_hash += 1
    assert _key(model) == base


def _decorated(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


def test_what_the_fingerprint_cannot_describe_is_not_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """A forward hook, an attribute of a kind the fingerprint does not know or a derived dim:
    no fingerprint, so no module entry (said in the log); `verify` and AD_MLIR_PROGRAM_CACHE=0
    never look one up."""
    hooked = build_model(TinyConfig(layers=1))
    hooked.model.layers[0].register_forward_hook(lambda *args: None)
    odd = build_model(TinyConfig(layers=1))
    odd.model.state = object()
    seq = torch.export.Dim("seq", min=2, max=32)
    for model, shapes, said in ((hooked, "seq", "forward hooks"), (odd, "seq", "model.state is a object"),
                                (build_model(TinyConfig(layers=1)), {"input_ids": {1: 2 * seq}}, "dynamic_shapes")):
        with pytest.raises(Unkeyable, match=said):
            _key(model, dynamic_shapes=shapes)
    source = module_export(build_model(TinyConfig(layers=1)), {"input_ids": IDS}, None)
    assert module_entry_key(source, CompileOptions(), Rank()) is not None
    assert module_entry_key(source, CompileOptions(verify=True), Rank()) is None
    with monkeypatch.context() as patch:
        patch.setenv(PROGRAM_CACHE_VARIABLE, "0")
        assert module_entry_key(source, CompileOptions(), Rank()) is None
    with caplog.at_level(logging.INFO, logger="ad_mlir.compiler"):
        torch.testing.assert_close(_run(_compile(hooked, tmp_path)), hooked(input_ids=IDS).logits, rtol=1e-4, atol=1e-4)
    assert "the export is not keyed, torch.export runs" in caplog.text
    assert not list((tmp_path / "programs").glob("*.export"))


def test_a_damaged_entry_is_exported_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           caplog: pytest.LogCaptureFixture) -> None:
    """A truncated, altered or empty module entry, or one whose program entry is gone, is a
    miss: the model is exported and compiled again, to the same outputs, and the entry
    rewritten (the next compile reads it)."""
    model = build_model(TinyConfig(layers=1))
    cold = _run(_compile(model, tmp_path))
    (path,) = (tmp_path / "programs").glob("*.export")
    (program,) = (tmp_path / "programs").glob("*.mlir")
    good = path.read_bytes()
    altered = bytearray(good)
    altered[len(good) // 2] ^= 1
    exports = _Exports(monkeypatch)
    for damage, said in ((lambda: path.write_bytes(good[: len(good) // 2]), "corrupt or stale"),
                         (lambda: path.write_bytes(bytes(altered)), "corrupt or stale"),
                         (lambda: path.write_bytes(b""), "corrupt or stale"), (program.unlink, "")):
        damage()
        caplog.clear()
        before = exports.calls
        with caplog.at_level(logging.INFO):
            assert torch.equal(_run(_compile(model, tmp_path)), cold)
        assert exports.calls == before + 1 and READ not in caplog.text and said in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert torch.equal(_run(_compile(model, tmp_path)), cold)
    assert READ in caplog.text and exports.calls == 4
    assert not list((tmp_path / "programs").glob(".*.tmp")), "atomic writes leave no temp files"
