"""`ad-bench`: run the benchmarks this machine can run and write them under
`benchmarks/results/<machine>/` (`<machine>-quick/` with --quick): results.json, results.md
(also printed) and PNG plots.

- kernels (CUDA only): each fusion's kernel against eager and torch.compile, GB/s and % of the
  measured copy bandwidth (`bench/kernels.py`);
- launch: what a kernel call costs the host, the kernel itself stubbed (so measured on the CPU
  too): per kernel of a SmolLM2-shaped decode step, through its torch op, its direct Python
  entry (what `LLM` calls) and the generated launcher alone, and per whole step (`bench/launch.py`);
- generate: tokens per second of `ad_mlir.LLM` against HF eager `generate` on SmolLM2-135M
  (the packaged checkpoint, else its shape with random weights), prefill and decode apart
  (`bench/generate.py`);
- compile: ad-mlir's compile stages against Inductor on Llama-shaped graphs of growing depth,
  cold (empty caches) and warm (a new process with the caches the cold one left), and the
  `torch.compile` backend path's compile time (`bench/compile_time.py`; --quick: ad-mlir cold and
  warm, Inductor cold);
- traffic: modelled HBM bytes and launches of one decoder layer's non-GEMM part: eager, ad-mlir,
  ideal (`bench/traffic.py`);
- ptx: registers, spills, shared memory, vectorized access of every kernel, compiled for sm_90
  without a GPU (`bench/ptx_table.py`);
  traffic and ptx cover the family matrix (`families.MATRIX`): the five built-in families at
  Llama-3-8B's sizes, the others at their config class's default sizes (a released model's);
- matrix: the family sweep (below) over the family matrix only (`families.MATRIX`, ~5 minutes);
- serve (not run unless named: about 15 minutes on 2 CPU cores): `ad-mlir serve` against
  `transformers serve --continuous-batching` on SmolLM2, 1, 4, 16 and 64 concurrent streaming
  clients (output tokens/s, time to first token, inter-token latency), and `LLM.generate`
  against transformers' `generate_batch` offline (`bench/serve.py`);
- speculative (not run unless named): SmolLM2 on a prompt-copying task, decoded by the paged
  engine plainly and with n-gram prompt lookup, in one run: output tokens/s, steps, drafted and
  accepted tokens (`bench/speculative.py`);
- quantized (not run unless named): SmolLM2's shape written as a checkpoint in each quantized
  format the loader takes for a dense model and in bf16, each through `LLM(path)`: weight bytes,
  modelled decode-step bytes against bf16's, the quantized ops, CPU decode speed on the
  reference path (`bench/quantized.py`);
- families (not run unless named: about 1.5 hours on 2 CPU cores): every causal-LM family of
  transformers built small, exported, compiled and checked against eager with the kernels on
  the reference path and in the Triton interpreter (`ad_mlir/bench/families.py`).

A run of some parts keeps the other parts of the results already in the output directory.

Benchmarks are not tests: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PARTS = ("kernels", "launch", "generate", "compile", "traffic", "ptx", "matrix", "serve", "speculative", "quantized",
         "families")
DEFAULT_PARTS = ("kernels", "launch", "generate", "compile", "traffic", "ptx", "matrix")


def machine_name() -> str:
    """`cpu` without CUDA, else the GPU's name as a path (`nvidia-h100-80gb-hbm3`)."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name().lower()).strip("-")


def machine_info() -> dict[str, Any]:
    from importlib.metadata import version

    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    return {
        "machine": machine_name(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": version("torch"),
        "triton": version("triton"),
        "xdsl": version("xdsl"),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ad-bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--quick", action="store_true",
                   help="small sweeps (1 and 4 layers, fewer token counts, Llama and Gemma2 PTX): < 3 minutes on CPU")
    p.add_argument("--parts", default=",".join(DEFAULT_PARTS),
                   help=f"comma-separated subset of {', '.join(PARTS)} (default: {','.join(DEFAULT_PARTS)})")
    p.add_argument("--out", type=Path, default=None,
                   help="output directory (default: benchmarks/results/<machine>[-quick], <machine> = cpu or the "
                   "GPU's name)")
    p.add_argument("--no-inductor", action="store_true", help="compile part: do not time torch.compile")
    p.add_argument("--families", default=None, help="families part: only these model types (comma-separated); "
                   "their rows replace theirs in the table the output directory holds, the others are kept")
    args = p.parse_args(argv)
    unknown = set(args.parts.split(",")) - set(PARTS)
    if unknown:
        p.error(f"unknown parts {sorted(unknown)} (choose from {', '.join(PARTS)})")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = _parse(argv)
    import torch

    from ad_mlir.bench.report import write_results
    from ad_mlir.codegen.interpreter import default_to_interpreter

    cuda = torch.cuda.is_available()
    if not cuda:
        default_to_interpreter()  # PTX still compiles for sm_90 (in a child)
    parts = args.parts.split(",")
    name = machine_name() + ("-quick" if args.quick else "")
    args.out = args.out or Path("benchmarks") / "results" / name
    results: dict[str, Any] = {"machine": machine_info(), "quick": args.quick, "parts": {}, "skipped": {}}
    from tqdm import tqdm

    with tqdm(total=len(parts), desc="ad-bench", unit="part", file=sys.stderr) as bar:

        def progress(message: str) -> None:
            bar.set_postfix_str(message)

        for part in parts:
            bar.set_description(part)
            if part == "kernels" and not cuda:
                results["skipped"][part] = "no CUDA device: the kernel benchmarks time GPU kernels"
            else:
                results["parts"][part] = _run_part(part, args, progress)
            bar.update()
    if args.families and "families" in results["parts"]:  # rows merged into an earlier run's: say whose is whose
        results["row_runs"] = {"families": row_runs(args.out / "results.json", "families", args.families.split(","),
                                                     run_label(results["machine"]))}
    markdown = write_results(results, args.out)
    print(markdown)
    print(f"\nwritten to {args.out}/", file=sys.stderr)


def run_label(machine: dict[str, Any]) -> str:
    """A run, as a results file's machine line names it: its date and CPU."""
    return f"{machine['date']} ({machine['cpu']})"


def row_runs(earlier: Path, part: str, rerun: Sequence[str], now: str) -> dict[str, str]:
    """Which run each of `part`'s rows comes from once the families `rerun` have run again `now`
    and been merged into the rows in `earlier`: that file's record of its rows' runs, else its
    machine line for the part (one run)."""
    before = json.loads(earlier.read_text()) if earlier.exists() else {}
    machine = before.get("part_machines", {}).get(part, before.get("machine"))
    runs = before.get("row_runs", {}).get(part) or {r["family"]: run_label(machine)
                                                    for r in before.get("parts", {}).get(part, [])}
    return {**runs, **dict.fromkeys(rerun, now)}


def merged_rows(earlier: Path, part: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`part`'s rows of the results in `earlier` (if any), each family's row replaced by its row
    in `rows`; families new to the table are added at the end."""
    new = {r["family"]: r for r in rows}
    before = json.loads(earlier.read_text())["parts"].get(part, []) if earlier.exists() else []
    kept = [new.pop(r["family"], r) for r in before]
    return kept + list(new.values())


def _run_part(part: str, args: argparse.Namespace, progress: Any) -> list[dict[str, Any]]:
    if part == "kernels":
        import torch

        from ad_mlir.bench.kernels import run_kernel_benchmarks

        tokens = (1, 16, 128) if args.quick else (1, 16, 128, 1024, 4096, 16384)
        shapes = [(t, h) for h in (4096, 8192) for t in tokens]
        return run_kernel_benchmarks(torch.device("cuda"), shapes, torch.bfloat16, progress=progress)
    if part == "launch":
        from ad_mlir.bench.launch import run_launch

        return run_launch(progress)
    if part == "generate":
        from ad_mlir.bench.generate import run_generate

        return run_generate(args.quick, progress)
    if part == "compile":
        from ad_mlir.bench.compile_time import run_compile_time

        layers = (1, 4) if args.quick else (1, 4, 8, 16, 32)
        return run_compile_time(layers, inductor=not args.no_inductor, progress=progress,
                                torch_compile_warm_and_backend=not args.quick)
    if part == "traffic":
        from ad_mlir.bench.families import MATRIX
        from ad_mlir.bench.traffic import run_traffic

        return run_traffic((1, 128, 4096), ("llama", "gemma2") if args.quick else tuple(MATRIX))
    if part == "serve":
        from ad_mlir.bench.serve import run_serve

        return run_serve(args.quick, progress)
    if part == "speculative":
        from ad_mlir.bench.speculative import run_speculative

        return run_speculative(args.quick, progress)
    if part == "quantized":
        from ad_mlir.bench.quantized import run_quantized

        return run_quantized(args.quick, progress)
    if part in ("matrix", "families"):
        from dataclasses import asdict

        from ad_mlir.bench.families import MATRIX, run_sweep
        from ad_mlir.zoo.small import causal_lm_families

        subset = tuple(args.families.split(",")) if args.families and part == "families" else ()
        if subset:
            families = subset
        elif args.quick:
            families = ("llama", "mpt", "glm", "gpt2")
        else:
            families = tuple(MATRIX) if part == "matrix" else causal_lm_families()
        rows = [asdict(r) for r in run_sweep(families, progress=lambda r: progress(f"{r.family}: {r.status}"))]
        return merged_rows(args.out / "results.json", part, rows) if subset else rows
    from ad_mlir.bench.families import MATRIX
    from ad_mlir.bench.ptx_table import run_ptx

    return run_ptx(("llama", "gemma2") if args.quick else tuple(MATRIX), progress=progress)


if __name__ == "__main__":
    main()
