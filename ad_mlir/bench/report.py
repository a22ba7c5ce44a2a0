"""`ad-bench` results as files: results.json (everything), results.md (tables) and PNG plots."""

from __future__ import annotations

import collections
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MB = 1e6


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f}"


STAGE_GROUPS = {
    "module entry": lambda name: name.startswith("module entry "),
    "export": lambda name: name == "export",
    "import": lambda name: name == "import",
    "program cache": lambda name: name.startswith("program "),
    "passes": lambda name: name.startswith("pass ") or name == "pipeline checks",
    "codegen": lambda name: name == "Triton codegen",
    "PTX": lambda name: name == "PTX (sm_90)",
    "export back": lambda name: name == "export to FX",
}
"""The compile table's stage columns: which of `time_ad_mlir`'s stages each sums."""


def _stage_group(stages: dict[str, float] | None, group: str) -> float | None:
    if not stages:
        return None
    matched = [v for k, v in stages.items() if STAGE_GROUPS[group](k)]
    return sum(matched) if matched else None


def _cold_warm(cold: float | None, warm: float | None) -> str:
    return f"{_s(cold)} / {_s(warm)}"


def _ratio(num: float | None, den: float | None) -> str:
    return f"{num / den:.1f}x" if num and den else "-"


def compile_table(rows: Sequence[dict[str, Any]]) -> str:
    """Totals and ratios, then each stage, cold / warm (a warm compile: a fresh process with the
    caches a cold one left)."""
    header = ["layers", "ad-mlir s", "torch.compile (Inductor) s", "Inductor / ad-mlir",
              "torch.compile (ad-mlir backend) s"]
    body = [[r["layers"], _cold_warm(r["ad_mlir_s"], r.get("ad_mlir_warm_s")),
             _cold_warm(r["inductor_s"], r.get("inductor_warm_s")),
             " ".join(filter(None, [f"{_ratio(r['inductor_s'], r['ad_mlir_s'])} / "
                                    f"{_ratio(r.get('inductor_warm_s'), r.get('ad_mlir_warm_s'))}",
                                    r["inductor_note"]])),
             _cold_warm(r.get("backend_s"), r.get("backend_warm_s"))] for r in rows]
    stages = [[r["layers"], *(_cold_warm(_stage_group(r["stages"], g), _stage_group(r.get("warm_stages"), g))
                              for g in STAGE_GROUPS)] for r in rows]
    shape = f"Llama-shaped (hidden {rows[0]['hidden']}, {rows[0]['dtype']})" if rows else ""
    return (f"### Compile time, {shape}, seconds, cold / warm\n\n" + _table(header, body)
            + "\n\n#### ad-mlir's stages, seconds, cold / warm\n\n" + _table(["layers", *STAGE_GROUPS], stages))


def traffic_table(rows: Sequence[dict[str, Any]]) -> str:
    header = ["family", "hidden", "tokens", "eager launches", "eager MB", "ad-mlir launches", "ad-mlir MB", "ideal MB",
              "eager / ideal", "ad-mlir / ideal", "ad-mlir / its own ideal"]
    body = [[r["family"], r["hidden"], r["tokens"], r["eager_launches"], f"{r['eager_bytes'] / MB:.2f}", r["ad_mlir_launches"],
             f"{r['ad_mlir_bytes'] / MB:.2f}", f"{r['ideal_bytes'] / MB:.2f}", f"{r['eager_ratio']:.2f}",
             f"{r['ad_mlir_ratio']:.2f}", f"{r['ad_mlir_own_ratio']:.2f}"] for r in rows]
    return ("### Modelled HBM traffic of one decoder layer outside GEMMs and attention\n\n"
            "(see `ad_mlir/bench/traffic.py` for the model; ad-mlir runs RoPE inside its attention kernel)\n\n"
            + _table(header, body))


def ptx_table(rows: Sequence[dict[str, Any]]) -> str:
    header = ["family", "kernel", "regs", "spill B", "smem B", "ld.v", "st.v", "warps", "block"]
    body = [[r["family"], r["name"], r["registers"], r["spills"], r["shared_memory"],
             "yes" if r["vectorized_loads"] else "no", "yes" if r["vectorized_stores"] else "no", r["num_warps"],
             f"{r['block_r']}x{r['block_c']}"] for r in rows]
    return "### PTX for sm_90 (compiled on the CPU), at 256 tokens\n\n" + _table(header, body)


def kernel_table(rows: Sequence[dict[str, Any]]) -> str:
    header = ["case", "impl", "mode", "tokens", "hidden", "median ms (p20-p80)", "GB/s", "% of copy", "bytes"]
    body = [[r["case"], r["impl"], r["mode"], r["tokens"], r["hidden"],
             f"{r['median_ms']:.4f} ({r['p20_ms']:.4f}-{r['p80_ms']:.4f})", f"{r['gbps']:.1f}",
             f"{r['pct_of_copy']:.1f}", r["bytes_formula"]] for r in rows]
    return "### Kernels\n\n" + _table(header, body)


LAUNCH_PATHS = ("op", "direct", "launcher", "jit", "bound")
"""The launch part's paths, in its table's order (rows of earlier runs lack the later ones)."""


def launch_table(rows: Sequence[dict[str, Any]]) -> str:
    kernels = [r for r in rows if r["kind"] == "kernel"]
    steps = [r for r in rows if r["kind"] == "step"]
    body = [[r["kernel"], *(f"{r[f'{path}_us']:.1f}" if f"{path}_us" in r else "-" for path in LAUNCH_PATHS)]
            for r in kernels]
    step_body = [[r["sequences"], r["cached"], r["kernels"], f"{r['op_us']:.0f}", f"{r['direct_us']:.0f}"]
                 for r in steps]
    return ("### Launch cost on the host (kernels stubbed)\n\n(per call of each kernel of a one-layer SmolLM2-shaped "
            "decode step: through its torch op, its direct entry as `LLM` calls it, the generated launcher "
            "alone, and the launcher with the kernel launched through Triton's JIT and through its compiled kernel "
            "bound once, as a call on CUDA is, the compiled kernel's launcher stubbed; see "
            "`ad_mlir/bench/launch.py`)\n\n"
            + _table(["kernel", *(f"{path} us" for path in LAUNCH_PATHS)], body) + "\n\n"
            + _table(["sequences", "cached tokens", "kernel calls", "step through the ops us", "step direct us"],
                     step_body))


def generate_table(rows: Sequence[dict[str, Any]]) -> str:
    speed = [r for r in rows if r["kind"] == "speed"]
    header = ["impl", "batch", "prompt", "new", "seconds", "tok/s", "prefill s", "ms per decode step", "decode tok/s",
              "compile s"]
    body = [[r["impl"], r["batch"], r["prompt_tokens"], r["new_tokens"], f"{r['seconds']:.2f}", f"{r['tok_per_s']:.1f}",
             f"{r['prefill_s']:.3f}", f"{r['decode_ms_per_step']:.1f}", f"{r['decode_tok_per_s']:.1f}",
             _s(r["compile_s"])] for r in speed]
    what = f"{speed[0]['model']}, {speed[0]['dtype']} on {speed[0]['device']}, greedy, EOS ignored" if speed else ""
    return (f"### Generation ({what})\n\n(a decode step makes one token per sequence; prefill s: a run that "
            "generates one token)\n\n" + _table(header, body) + "\n\n" + decode_traffic_table(rows))


def decode_traffic_table(rows: Sequence[dict[str, Any]]) -> str:
    traffic = [r for r in rows if r["kind"] == "decode traffic"]
    header = ["batch", "cached tokens", "launches", "modelled MB", "ideal MB", "weights MB", "caches read MB",
              "new K/V MB", "modelled / ideal"]
    body = [[r["batch"], r["cached"], r["launches"], f"{r['modelled_bytes'] / MB:.2f}", f"{r['ideal_bytes'] / MB:.2f}",
             f"{r['ideal_weights_bytes'] / MB:.2f}", f"{r['ideal_caches_read_bytes'] / MB:.3f}",
             f"{r['ideal_new_kv_written_bytes'] / MB:.4f}", f"{r['ratio']:.3f}"] for r in traffic]
    return ("#### Modelled HBM bytes of one decode step of the compiled graph\n\n(see "
            "`ad_mlir/bench/decode_traffic.py`; ideal: weights, caches up to the cached tokens and new K/V, each "
            "moved once)\n\n" + _table(header, body))


def serve_table(rows: Sequence[dict[str, Any]]) -> str:
    online = [r for r in rows if r["kind"] == "online"]
    offline = [r for r in rows if r["kind"] == "offline"]
    ms = lambda s: "-" if s is None else f"{s * 1e3:.0f}"  # noqa: E731
    header = ["server", "clients", "requests", "output tokens", "seconds", "output tok/s", "TTFT p50 ms", "TTFT p99 ms",
              "ITL p50 ms", "ITL p99 ms", "answers as transformers'"]
    body = [[r["server"], r["clients"], r["requests"], r["output_tokens"], f"{r['seconds']:.1f}",
             f"{r['output_tok_per_s']:.1f}", ms(r["ttft_p50_s"]), ms(r["ttft_p99_s"]), ms(r["itl_p50_s"]),
             ms(r["itl_p99_s"]), r.get("same_answers", "-")] for r in online]
    off = [[r["impl"], r["batch"], r["output_tokens"], f"{r['seconds']:.1f}", f"{r['output_tok_per_s']:.1f}"]
           for r in offline]
    what = f"{rows[0]['model']}, greedy, at most {rows[0]['max_tokens']} new tokens" if rows else ""
    return (f"### Serving ({what})\n\n(streaming chat requests from N concurrent `openai` clients, one server at a "
            "time; ITL: a request's time between its first and last chunk over its tokens - 1)\n\n"
            + _table(header, body) + "\n\n#### Offline\n\n"
            + _table(["impl", "prompts", "output tokens", "seconds", "output tok/s"], off))


def speculative_table(rows: Sequence[dict[str, Any]]) -> str:
    header = ["batch", "decoding", "output tokens", "seconds", "output tok/s", "speed-up", "steps", "drafted",
              "accepted", "acceptance", "tokens per draft step", "same tokens as plain"]
    plain = {r["batch"]: r for r in rows if r["impl"] == "plain"}
    body = [[r["batch"], r["impl"], r["output_tokens"], f"{r['seconds']:.1f}", f"{r['output_tok_per_s']:.1f}",
             _ratio(r["output_tok_per_s"], plain[r["batch"]]["output_tok_per_s"]), r["steps"], r["drafted_tokens"],
             r["accepted_tokens"], f"{r['acceptance_rate']:.2f}", f"{r['tokens_per_draft_step']:.2f}",
             r["same_tokens_as_plain"]] for r in rows]
    what = f"{rows[0]['model']}, greedy, at most {rows[0]['new_tokens']} new tokens" if rows else ""
    return (f"### Speculative decoding ({what})\n\n(a prompt-copying task: correct a text's spelling and write it "
            "out; the paged engine plain and with n-gram prompt lookup drafting k tokens, on one compiled model)\n\n"
            + _table(header, body))


def quantized_table(rows: Sequence[dict[str, Any]]) -> str:
    header = ["format", "quantized ops", "weights MB", "decode step MB (batch 1)", "vs bf16", "ms per decode step",
              "decode tok/s", "vs bf16", "same tokens as eager"]
    body = [[r["format"], ", ".join(f"{op} {n}" for op, n in r["quantized_ops"].items()) or "-",
             f"{r['weight_bytes'] / MB:.1f}", f"{r['decode_bytes'] / MB:.1f}", f"{r['decode_bytes_vs_bf16']:.2f}",
             f"{r['decode_ms_per_step']:.1f}", f"{r['decode_tok_per_s']:.1f}", f"{r['decode_speed_vs_bf16']:.2f}",
             r["same_tokens_as_eager"]] for r in rows]
    what = rows[0]["model"] if rows else ""
    return (f"### Quantized checkpoints ({what}, random weights, bf16 activations)\n\n(each checkpoint loaded by "
            "`LLM(path)`; decode step MB: the modelled HBM bytes of one decode step at batch 1, "
            "`ad_mlir/bench/decode_traffic.py`; speed: on the CPU with the kernels as their torch reference, which "
            "dequantizes each weight at each call; see `ad_mlir/bench/quantized.py`)\n\n" + _table(header, body))


def families_table(rows: Sequence[dict[str, Any]], title: str = "Family sweep") -> str:
    from ad_mlir.bench.families import FamilyRow
    from ad_mlir.bench.families import markdown as sweep_markdown

    return sweep_markdown([FamilyRow(**r) for r in rows], title)


def matrix_table(rows: Sequence[dict[str, Any]]) -> str:
    return families_table(rows, "Family matrix")


TABLES = {"kernels": kernel_table, "launch": launch_table, "generate": generate_table, "compile": compile_table, "traffic": traffic_table,
          "ptx": ptx_table, "matrix": matrix_table, "serve": serve_table, "speculative": speculative_table,
          "quantized": quantized_table, "families": families_table}


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [f"# ad-bench on {m['machine']}", "",
             f"{m['gpu'] or 'no GPU'}; CPU {m['cpu']} ({m['cpu_count']} cores); torch {m['torch']}, triton "
             f"{m['triton']}, xdsl {m['xdsl']}; {m['date']}{'; --quick' if results['quick'] else ''}", ""]
    if m.get("note"):
        lines += [f"Note: {m['note']}.", ""]
    lines += [f"- {part}: skipped, {why}" for part, why in results["skipped"].items()]
    lines += [f"- {part}: from an earlier run ({m['date']}, torch {m['torch']}, triton {m['triton']})"
              + (f"; note: {m['note']}" if m.get("note") else "") for part, m in results.get("part_machines", {}).items()]
    lines += [_row_runs_line(part, runs) for part, runs in results.get("row_runs", {}).items()
              if len(set(runs.values())) > 1]
    for part in sorted(results["parts"], key=list(TABLES).index):  # one order, whichever part ran last
        lines += ["", TABLES[part](results["parts"][part])]
    return "\n".join(lines) + "\n"


def _row_runs_line(part: str, runs: dict[str, str]) -> str:
    """`part`'s rows by the run that made them (a sweep of some families merged into an earlier
    one), naming the families of the smaller groups."""
    counts = collections.Counter(runs.values())
    groups = [f"{n} from {run}" + (f" ({', '.join(sorted(f for f, r in runs.items() if r == run))})" if n <= 10 else "")
              for run, n in counts.most_common()]
    return f"- {part}: rows from {len(counts)} runs: {'; '.join(groups)}"


def write_results(results: dict[str, Any], out: Path) -> str:
    """Write results.json, results.md and the plots to `out`; returns the markdown. Parts that
    `out` holds from an earlier run and this one did not run are kept, with that run's
    machine line."""
    out.mkdir(parents=True, exist_ok=True)
    earlier = out / "results.json"
    if earlier.exists():
        before = json.loads(earlier.read_text())
        for part, rows in before.get("parts", {}).items():
            if part not in results["parts"] and part not in results["skipped"]:
                results["parts"][part] = rows
                results.setdefault("part_machines", {})[part] = before.get("part_machines", {}).get(
                    part, before["machine"])
                if part in before.get("row_runs", {}):
                    results.setdefault("row_runs", {})[part] = before["row_runs"][part]
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    text = markdown(results)
    (out / "results.md").write_text(text)
    plot_results(results, out)
    return text


def plot_results(results: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    written = []
    plots = {"compile": _plot_compile, "traffic": _plot_traffic, "kernels": _plot_kernels, "serve": _plot_serve}
    for part, rows in results["parts"].items():
        if part in plots and rows:
            fig = plots[part](plt, rows)
            path = out / f"{part}.png"
            fig.savefig(path, dpi=110, bbox_inches="tight")
            plt.close(fig)
            written.append(path)
    return written


def _plot_compile(plt: Any, rows: Sequence[dict[str, Any]]) -> Any:
    fig, ax = plt.subplots(figsize=(6, 4))
    layers = [r["layers"] for r in rows]
    ax.plot(layers, [r["ad_mlir_s"] for r in rows], "o-", label="ad-mlir (all stages)")
    timed = [r for r in rows if r["inductor_s"]]
    ax.plot([r["layers"] for r in timed], [r["inductor_s"] for r in timed], "s-", label="torch.compile (Inductor, CPU)")
    warm = [r for r in rows if r.get("ad_mlir_warm_s")]
    ax.plot([r["layers"] for r in warm], [r["ad_mlir_warm_s"] for r in warm], "o--", label="ad-mlir, warm caches")
    warm = [r for r in rows if r.get("inductor_warm_s")]
    ax.plot([r["layers"] for r in warm], [r["inductor_warm_s"] for r in warm], "s--",
            label="torch.compile (Inductor, CPU), warm caches")
    backend = [r for r in rows if r.get("backend_s")]
    ax.plot([r["layers"] for r in backend], [r["backend_s"] for r in backend], "^-",
            label="torch.compile (ad-mlir backend)")
    ax.set(xlabel="decoder layers", ylabel="seconds", title=f"Compile time, Llama-shaped (hidden {rows[0]['hidden']})")
    ax.legend()
    ax.grid(alpha=0.3)
    return fig


def _plot_serve(plt: Any, rows: Sequence[dict[str, Any]]) -> Any:
    online = [r for r in rows if r["kind"] == "online"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    panels = [("output_tok_per_s", "output tokens/s", 1), ("ttft_p50_s", "TTFT p50, ms", 1e3),
              ("itl_p50_s", "inter-token latency p50, ms", 1e3)]
    for ax, (key, label, factor) in zip(axes, panels, strict=True):
        for server in sorted({r["server"] for r in online}):
            points = sorted((r["clients"], r[key] * factor) for r in online if r["server"] == server and r[key] is not None)
            ax.plot([p[0] for p in points], [p[1] for p in points], "o-", label=server)
        ax.set(xscale="log", xlabel="concurrent clients", ylabel=label, title=label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    return fig


def _plot_traffic(plt: Any, rows: Sequence[dict[str, Any]]) -> Any:
    tokens = max(r["tokens"] for r in rows)
    at = [r for r in rows if r["tokens"] == tokens]
    fig, ax = plt.subplots(figsize=(max(8, len(at) * 0.5), 4.5))
    x = range(len(at))
    bars = [("eager_ratio", "eager / ideal"), ("ad_mlir_ratio", "ad-mlir / ideal (its RoPE is in attention)"),
            ("ad_mlir_own_ratio", "ad-mlir / the ideal of its own non-GEMM part")]
    for k, (key, label) in enumerate(bars):
        ax.bar([i + (k - 1) * 0.27 for i in x], [r[key] for r in at], 0.27, label=label)
    ax.axhline(1.0, color="black", lw=0.8, ls="--", label="ideal: each tensor moved once")
    ax.set_xticks(list(x), [r["family"] for r in at], rotation=60, ha="right")
    ax.set(ylabel="modelled bytes / ideal", title=f"Non-GEMM traffic of one layer, {tokens} tokens")
    ax.legend()
    return fig


def _plot_kernels(plt: Any, rows: Sequence[dict[str, Any]]) -> Any:
    cases = sorted({r["case"] for r in rows})
    hidden = min(r["hidden"] for r in rows)
    fig, axes = plt.subplots(len(cases), 1, figsize=(7, 3 * len(cases)), squeeze=False)
    for ax, case in zip(axes[:, 0], cases, strict=True):
        for impl in sorted({r["impl"] for r in rows if r["case"] == case}):
            points = sorted((r["tokens"], r["gbps"]) for r in rows
                            if r["case"] == case and r["impl"] == impl and r["mode"] == "plain" and r["hidden"] == hidden)
            ax.plot([p[0] for p in points], [p[1] for p in points], "o-", label=impl)
        ax.set(xscale="log", xlabel="tokens", ylabel="GB/s", title=f"{case} (hidden {hidden})")
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
