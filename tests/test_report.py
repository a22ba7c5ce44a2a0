"""The README's main job (`python -m ad_mlir`): SmolLM2 answers through the compiled, cached
graph; and the tiny-model report (`python -m ad_mlir --report`) runs end to end: Triton kernels
generated and run (in the interpreter), at most 5 kernels per Llama decoder layer, the second
compile served by the kernel cache, results within tolerance of the original graph."""

import os
import re
import subprocess
import sys


def test_main_job_compiles_and_runs_kernels() -> None:
    """The README's command as written (its defaults: two layers, two sequence lengths)."""
    proc = subprocess.run(
        [sys.executable, "-m", "ad_mlir", "--report"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "pass canonicalize:" in out and "Triton codegen" in out
    assert "ad.attention" in out and "ad.linear" in out and "ad.fused" in out
    assert "kernels run in the Triton interpreter" in out
    assert len(re.findall(r"\((bit-exact|within tolerance)\)", out)) == 2, out
    assert "OUT OF TOLERANCE" not in out
    per_layer = dict(re.findall(r"layer (\d+):\s+\d+ imported ->\s+(\d+) compiled", out))
    assert int(per_layer["1"]) <= 5, out  # layer 0 also holds the first input norm
    assert "compiled again: 0 kernels generated" in out


def test_main_job_rejects_bad_config() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ad_mlir", "--report", "--hidden-size", "48"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "hidden_size 48 must be a multiple of 2 * head_dim (64)" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_main_job_answers_with_smollm2() -> None:
    """The README's `make run`, as written: no TRITON_INTERPRET (which this suite sets for its own
    kernels), so the kernels run their torch reference (the interpreter path has its own test in
    test_generate.py)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(["make", "run"], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    answer = [line for line in proc.stdout.splitlines() if not line.startswith("make")]  # make's own lines
    assert answer[-2:] == ["> What is the capital of France?", "The capital of France is Paris."]
    assert re.search(r"smollm2: loaded and compiled in [\d.]+ s", proc.stderr), proc.stderr
    assert "(128 pages x 16 tokens, sequences up to 512" in proc.stderr, proc.stderr  # the paged engine's cache


def test_generate_cli_rejects_a_prompt_longer_than_the_cache() -> None:
    proc = subprocess.run([sys.executable, "-m", "ad_mlir.generate", "--model", "llama", "--prompt-ids", *["3"] * 20,
                           "--max-seq-len", "16"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.strip().endswith("error: prompt 0 has 20 tokens: with max_new_tokens=32 it needs 52 > "
                                        "max_seq_len=16 cache positions"), proc.stderr
    assert "Traceback" not in proc.stderr
