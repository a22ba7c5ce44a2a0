"""The command lines users run, run as they run them: a subprocess each, tiny models, seconds.
The family sweep (`python -m ad_mlir.bench.families`: statuses, the timeout, the results table and its
JSON), the generate CLI's flags (`python -m ad_mlir.generate`: a batch of token-id prompts in
fewer slots, `--interpret`, sampling, `--benchmark`), the TP example under torchrun (gloo on
loopback, two ranks; its `--generate`, which exits 1 unless every rank's tokens equal one unsharded
process's, runs as the docs write it in tests/test_doc_commands.py) and `ad-bench`'s generate and PTX parts.

Each run gets this environment without TRITON_INTERPRET (the suite sets it for itself): a flag
(`--interpret`) or the test sets it where the run should interpret kernels."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ad_mlir.bench.generate import same_tokens
from ad_mlir.bench.kernels import BenchmarkError
from ad_mlir.llm.engine import GenerationOutput
from ad_mlir.zoo.checkpoints import named_model

BIN = Path(sys.executable).parent


def _run(args: list[str], interpret: bool = False, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)


def _python(*args: str, interpret: bool = False) -> subprocess.CompletedProcess[str]:
    return _run([sys.executable, "-m", *args], interpret)


# -- the family sweep ------------------------------------------------------------------------


def test_family_sweep_prints_a_row_per_family_and_writes_json(tmp_path: Path) -> None:
    rows_file = tmp_path / "rows.json"
    proc = _python("ad_mlir.bench.families", "llama", "--jobs", "1", "--json", str(rows_file))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "### Family sweep: 1 causal-LM families (1 ok)" in proc.stdout
    row = re.search(r"^\| llama \| ok \|.*\| (\d+) -> (\d+) \| (\d+) \| ([^|]+) \|", proc.stdout, re.M)
    assert row, proc.stdout
    assert int(row[2]) < int(row[1]) and row[4].strip() == "add_rms_norm 1, rms_norm 1, rope_attention 1, silu_and_mul 1"
    (saved,) = json.loads(rows_file.read_text())
    assert (saved["family"], saved["status"], saved["kernel_calls"]) == ("llama", "ok", int(row[3]))
    assert saved["kernel_calls"] > 0 and sorted(saved["interpreter_error"]) == sorted(saved["reference_error"])
    assert saved["generation"] == "equal"
    # the quantized column: Llama written as GPTQ int4, its 7 projections 4 int4 GEMMs (Q/K/V and
    # gate/up fused); the eager model dequantizes as the reference op does, so only fp32 sums differ
    assert (saved["quantized"], saved["quantized_ops"]) == ("ok", {"ad.linear_int4": 4})
    assert sorted(saved["quantized_error"]) == ["interpreter", "reference"]
    assert max(saved["quantized_error"].values()) < 1e-5
    assert re.search(r"^\| llama \| ok \|.*\| GPTQ int4 g32 act-order: ok; [^|]*linear_int4 4 \|", proc.stdout, re.M)


def test_family_sweep_reports_a_timeout_as_a_failure() -> None:
    proc = _python("ad_mlir.bench.families", "llama", "--timeout", "1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(r"^\| llama \| timeout \|.*did not finish in 1 s", proc.stdout, re.M), proc.stdout


def test_family_sweep_names_an_unknown_family() -> None:
    proc = _python("ad_mlir.bench.families", "no_such_family")
    assert proc.returncode == 2
    assert "not causal-LM model types of transformers: no_such_family" in proc.stderr


# -- the generate CLI ------------------------------------------------------------------------

PROMPTS = [[5, 9, 13, 3, 7, 40, 41], [3, 4], [11, 12, 13, 14, 15, 16]]
NEW = 6


def _hf_tokens(family: str, prompt: list[int], n: int = NEW) -> list[int]:
    model = named_model(family)
    with torch.no_grad():
        return model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)[0, len(prompt):].tolist()


def _generated(stdout: str) -> list[tuple[list[int], list[int]]]:
    """(prompt, tokens) per prompt, from the CLI's "> prompt" and tokens lines."""
    lines = stdout.splitlines()
    return [(json.loads(lines[i][2:]), json.loads(lines[i + 1])) for i in range(0, len(lines), 2)]


def _prompt_args(prompts: list[list[int]]) -> list[str]:
    return [a for p in prompts for a in ("--prompt-ids", *map(str, p))]


def test_generate_cli_batch_in_fewer_slots_gives_hf_tokens_and_benchmarks() -> None:
    proc = _python("ad_mlir.generate", "--model", "qwen2", *_prompt_args(PROMPTS), "--max-batch", "2",
                   "--max-seq-len", "32", "--max-new-tokens", str(NEW), "--benchmark")
    assert proc.returncode == 0, proc.stderr
    benchmark = [line for line in proc.stdout.splitlines() if line.startswith("prompt of ")]
    generated = _generated("\n".join(line for line in proc.stdout.splitlines() if not line.startswith("prompt of ")))
    assert [p for p, _ in generated] == PROMPTS
    assert [t for _, t in generated] == [_hf_tokens("qwen2", p) for p in PROMPTS]
    # paged by default: a pool of 2 x 32 tokens, in 4 pages of 16, shared by 3 prompts
    assert re.search(r"qwen2: loaded and compiled in [\d.]+ s .*the caches hold 64 tokens \(4 pages x 16 tokens, "
                     r"sequences up to 32", proc.stderr), proc.stderr
    assert f"{NEW * len(PROMPTS)} tokens in" in proc.stderr
    assert len(benchmark) == len(PROMPTS), proc.stdout
    for line, prompt in zip(benchmark, PROMPTS, strict=True):
        assert re.fullmatch(rf"prompt of {len(prompt)} tokens, {NEW} new: ad-mlir prefill \d+ ms, \d+ ms per decode "
                            r"token, [\d.]+ tokens/s; HF eager [\d.]+ tokens/s \(\d+ ms per token\)", line), line


def test_generate_cli_interpret_runs_the_kernels_and_gives_hf_tokens() -> None:
    """`--interpret` sets TRITON_INTERPRET before any kernel loads (the environment here has
    none): the verbose log names the interpreter, and the tokens are HF's."""
    proc = _python("ad_mlir.generate", "--model", "llama", *_prompt_args(PROMPTS[:1]), "--max-batch", "1",
                   "--max-seq-len", "16", "--max-new-tokens", "3", "--interpret")
    assert proc.returncode == 0, proc.stderr
    assert _generated(proc.stdout) == [(PROMPTS[0], _hf_tokens("llama", PROMPTS[0], 3))]


def test_generate_cli_sampling_is_seeded() -> None:
    """The same seed samples the same tokens in two processes, and they are not the greedy ones
    (HF's, which temperature 0 gives: the test above)."""
    def sampled(seed: str) -> list[list[int]]:
        proc = _python("ad_mlir.generate", "--model", "qwen2", *_prompt_args(PROMPTS), "--max-batch", "2",
                       "--max-seq-len", "32", "--max-new-tokens", "8", "--temperature", "1.5", "--seed", seed,
                       "--page-size", "0")
        assert proc.returncode == 0, proc.stderr
        assert "(2 slots x 32" in proc.stderr, proc.stderr  # --page-size 0: the slot form
        return [t for _, t in _generated(proc.stdout)]

    first = sampled("7")
    assert sampled("7") == first
    assert first != [_hf_tokens("qwen2", p, 8) for p in PROMPTS]


# -- the TP example --------------------------------------------------------------------------


def _torchrun(*args: str, interpret: bool) -> subprocess.CompletedProcess[str]:
    return _run([str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "-m", "ad_mlir.examples.tp", *args],
                interpret)


def test_tp_example_ranks_match_the_unsharded_model() -> None:
    """The README's command as written (the example turns the Triton interpreter on itself):
    both ranks, their fused regions as kernels, within tolerance of the unsharded model at both
    default sequence lengths."""
    proc = _torchrun("--model", "llama", interpret=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in (0, 1):
        assert re.search(rf"^rank {rank}/2: llama float32, 2 layers, 4 all_reduce, [1-9]\d* kernel calls; max \|error\| "
                         r"vs unsharded seq 7: \S+, seq 19: \S+ \(within tolerance\)$", proc.stdout, re.M), proc.stdout


def test_tp_example_outside_torchrun_says_how_to_run_it() -> None:
    proc = _python("ad_mlir.examples.tp")
    assert proc.returncode == 2 and "run under torchrun" in proc.stderr


# -- ad-bench's generate and PTX parts -------------------------------------------------------


def test_bench_generate_part_checks_tokens_before_timing(tmp_path: Path) -> None:
    proc = _run([str(BIN / "ad-bench"), "--quick", "--parts", "generate", "--out", str(tmp_path)], timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads((tmp_path / "results.json").read_text())["parts"]["generate"]
    speed = {r["impl"]: r for r in rows if r["kind"] == "speed"}
    assert set(speed) == {"ad-mlir", "HF eager"}
    assert speed["ad-mlir"]["same_tokens_as_hf"] == speed["ad-mlir"]["new_tokens"] == 16  # fp32: every token
    assert {r["kind"] for r in rows} == {"speed", "decode traffic"}


def test_bench_generate_refuses_to_time_other_tokens() -> None:
    hf = torch.tensor([[1] * 32 + [5, 6, 7]])
    assert same_tokens([GenerationOutput([1] * 32, [5, 6, 7])], hf, exact=True) == 3
    assert same_tokens([GenerationOutput([1] * 32, [5, 6, 8])], hf, exact=False) == 2
    with pytest.raises(BenchmarkError, match=r"prompt 0: ad-mlir's tokens \[5, 9, 7\] are not HF eager's .* token 1"):
        same_tokens([GenerationOutput([1] * 32, [5, 9, 7])], hf, exact=True)
    with pytest.raises(BenchmarkError, match="from token 0"):
        same_tokens([GenerationOutput([1] * 32, [4, 6, 7])], hf, exact=False)


def test_bench_ptx_part_tabulates_every_kernel(tmp_path: Path) -> None:
    """`--quick`: Llama and Gemma2 at Llama-3-8B's sizes, compiled for sm_90 on the CPU."""
    proc = _run([str(BIN / "ad-bench"), "--quick", "--parts", "ptx", "--out", str(tmp_path)], timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads((tmp_path / "results.json").read_text())["parts"]["ptx"]
    families = {r["family"] for r in rows}
    assert families == {"llama", "gemma2", "generation: prefill", "generation: decode", "generation: decode (reduce)"}
    names = {r["name"].rsplit("_", 1)[0] for r in rows if r["family"] == "llama"}
    assert {"rms_norm", "add_rms_norm", "rope_attention", "silu_and_mul"} <= names, names
    assert all(r["registers"] > 0 and r["spills"] >= 0 and r["num_warps"] in (1, 2, 4, 8, 16) for r in rows), rows
    assert any(r["vectorized_loads"] for r in rows), "no kernel reads with vector loads"
    table = (tmp_path / "results.md").read_text()
    assert all(f"| {r['family']} | {r['name']} | {r['registers']} |" in table for r in rows)
