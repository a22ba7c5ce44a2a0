"""The CPU parts of `ad-bench`: the traffic model's byte accounting, compile-time stages (fresh
processes), the results files and the command line. Nothing here asserts a timing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from xdsl.dialects import func
from xdsl.parser import Parser

from ad_mlir.bench import cli, report
from ad_mlir.bench.compile_time import run_compile_time
from ad_mlir.bench.families import FamilyRow
from ad_mlir.bench.report import write_results
from ad_mlir.bench.traffic import ideal_bytes, launch_bytes, layer_launches, run_traffic
from ad_mlir.passes.pipeline import PIPELINES, make_context
from ad_mlir.zoo.tiny import ModelShape, TinyConfig, build_model

TINY = ModelShape(hidden_size=256, intermediate_size=512, heads=2, kv_heads=1, head_dim=128, vocab_size=128)

LAYER = """
func.func @forward(%x: tensor<1x?x8xf32> {ad.input = "x"}, %w: tensor<8xf32> {ad.param = "w"},
                   %wo: tensor<8x8xf32> {ad.param = "o"}) -> tensor<1x?x8xf32> {
  %h = ad.linear %x, %wo : (tensor<1x?x8xf32>, tensor<8x8xf32>) -> tensor<1x?x8xf32> loc("model.layers.1.o_proj")
  %s = ad.add %x, %h : tensor<1x?x8xf32>, tensor<1x?x8xf32> -> tensor<1x?x8xf32> loc("model.layers.1")
  %wb = ad.expand %w [1, -1, 8] : tensor<8xf32> -> tensor<1x?x8xf32> loc("model.layers.1")
  %m = ad.mul %s, %wb : tensor<1x?x8xf32>, tensor<1x?x8xf32> -> tensor<1x?x8xf32> loc("model.layers.1")
  %c = ad.cast %m : tensor<1x?x8xf32> -> tensor<1x?x8xf32> loc("model.layers.1")
  %e = ad.exp %c : tensor<1x?x8xf32> -> tensor<1x?x8xf32> loc("model.layers.1")
  %y = ad.linear %e, %wo : (tensor<1x?x8xf32>, tensor<8x8xf32>) -> tensor<1x?x8xf32> loc("model.layers.1.down")
  %r = ad.add %s, %y : tensor<1x?x8xf32>, tensor<1x?x8xf32> -> tensor<1x?x8xf32> loc("model.layers.2")
  func.return %r : tensor<1x?x8xf32>
}
"""


def test_traffic_counts_each_launch_and_the_ideal_by_hand() -> None:
    fn = next(op for op in Parser(make_context(), LAYER).parse_module().ops if isinstance(op, func.FuncOp))
    ops = layer_launches(fn, fold_weights=False)
    # add, mul, exp launch; the linears, the broadcast view and the same-type cast do not;
    # the add of layer 2 is another layer's
    assert [op.name for op in ops] == ["ad.add", "ad.mul", "ad.exp"]
    row = 8 * 4  # bytes of one token's 8 f32
    tokens = 5
    # add: x, h in, s out; mul: s and w (8 floats: the broadcast reads its source) in, m out; exp: m in, e out
    assert launch_bytes(ops, tokens) == 3 * tokens * row + (2 * tokens * row + row) + 2 * tokens * row
    # as one kernel: x, h, w read once; s (read by layer 2) and e (by the linear) written once
    assert ideal_bytes(ops, tokens) == 2 * tokens * row + row + 2 * tokens * row


def test_the_default_pipeline_moves_less_than_eager_on_llama_and_gemma2() -> None:
    rows = run_traffic((1, 64), families=("llama", "gemma2"), shape=TINY, dtype="bfloat16")
    assert [(r["family"], r["tokens"]) for r in rows] == [("llama", 1), ("llama", 64), ("gemma2", 1), ("gemma2", 64)]
    for r in rows:
        assert r["ad_mlir_launches"] < r["eager_launches"] and r["ad_mlir_bytes"] < r["eager_bytes"], r
        assert r["eager_ratio"] == r["eager_bytes"] / r["ideal_bytes"] > 1, r
        # its own ideal: its kernels, each reading and writing once, cannot beat them as one kernel
        assert r["ad_mlir_own_ratio"] >= 1, r


def test_compile_time_stages_run_in_fresh_processes() -> None:
    (row,) = run_compile_time([1], shape=TINY, inductor=False, ptx=False)
    stages = list(row["stages"])
    assert stages[:7] == ["module entry key", "module entry read", "export", "import", "repeated layers: shorten",
                          "program key", "program cache read"]
    assert stages[-4:] == ["program cache write", "Triton codegen", "export to FX", "module entry write"]
    passes = [s.removeprefix("pass ") for s in stages if s.startswith("pass ")]
    assert passes == PIPELINES["default"].split(","), "one stage per pass of the default pipeline, in order"
    # warm: a second fresh process, given the caches the first left, reads the compile from the
    # module entry (the program it names, the kernels): no export, import or passes
    assert list(row["warm_stages"]) == ["module entry key", "module entry read"]
    assert row["ad_mlir_s"] == sum(row["stages"].values())
    assert row["ad_mlir_warm_s"] == sum(row["warm_stages"].values())
    assert (row["inductor_s"], row["ratio"], row["inductor_note"]) == (None, None, "not run (--no-inductor)")


def test_backend_compile_time_counts_compiling_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """`time_backend` times `torch.compile(backend="ad_mlir")` up to the compiled graph, which
    it never runs (its kernels would run in the Triton interpreter)."""
    import torch

    import ad_mlir.dynamo_backend
    from ad_mlir.bench.compile_time import time_backend
    from ad_mlir.zoo.tiny import meta_model

    compiled, ran = [], []
    real = ad_mlir.dynamo_backend.compile

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        gm = real(*args, **kwargs)
        compiled.append(gm)
        gm.register_forward_pre_hook(lambda *_: ran.append(True))
        return gm

    monkeypatch.setattr(ad_mlir.dynamo_backend, "compile", spy)
    try:
        seconds = time_backend(meta_model("llama", TINY, 1, "float32"))
    finally:
        torch._dynamo.reset()
    assert len(compiled) == 1 and not ran and seconds > 0


def _results() -> dict:
    compile_row = {"layers": 1, "hidden": 256, "dtype": "bfloat16", "ad_mlir_s": 2.0, "inductor_s": 5.0,
                   "ad_mlir_warm_s": 1.25, "inductor_warm_s": 2.0, "backend_s": 3.0, "backend_warm_s": 1.5,
                   "inductor_note": None, "ratio": 2.5, "warm_ratio": 1.6,
                   "stages": {"export": 1.0, "import": 0.1, "program key": 0.05, "program cache read": 0.0,
                              "pass canonicalize": 0.2, "program cache write": 0.02, "Triton codegen": 0.3,
                              "PTX (sm_90)": 0.3, "export to FX": 0.1},
                   "warm_stages": {"export": 1.0, "import": 0.1, "program key": 0.05, "program cache read": 0.03,
                                   "Triton codegen": 0.05, "export to FX": 0.02}}
    traffic_row = {"family": "llama", "tokens": 4, "hidden": 256, "dtype": "bfloat16", "eager_launches": 30,
                   "eager_bytes": 3e6, "ad_mlir_launches": 4, "ad_mlir_bytes": 1e6, "ideal_bytes": 1e6,
                   "ad_mlir_own_ideal_bytes": 1e6, "eager_ratio": 3.0, "ad_mlir_ratio": 1.0, "ad_mlir_own_ratio": 1.0}
    return {"machine": cli.machine_info(), "quick": True, "skipped": {"kernels": "no CUDA device"},
            "parts": {"compile": [compile_row], "traffic": [traffic_row]}}


def test_results_are_written_as_json_markdown_and_plots(tmp_path: Path) -> None:
    results = _results()
    text = write_results(results, tmp_path)
    assert json.loads((tmp_path / "results.json").read_text()) == json.loads(json.dumps(results))
    assert (tmp_path / "results.md").read_text() == text
    assert "- kernels: skipped, no CUDA device" in text
    assert "| 1 | 2.00 / 1.25 | 5.00 / 2.00 | 2.5x / 1.6x | 3.00 / 1.50 |" in text
    assert ("| 1 | - / - | 1.00 / 1.00 | 0.10 / 0.10 | 0.07 / 0.08 | 0.20 / - | 0.30 / 0.05 | 0.30 / - | 0.10 / 0.02 |"
            in text)
    assert "| llama | 256 | 4 | 30 | 3.00 | 4 | 1.00 | 1.00 | 3.00 | 1.00 | 1.00 |" in text
    for plot in ("compile.png", "traffic.png"):
        assert (tmp_path / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_command_line_runs_what_the_machine_can(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "_run_part", lambda part, args, progress: _results()["parts"][part])
    cli.main(["--parts", "kernels,traffic", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "# ad-bench on cpu" in out and "kernels: skipped, no CUDA device" in out
    assert "Modelled HBM traffic" in out and "Compile time" not in out
    assert {p.name for p in tmp_path.iterdir()} == {"results.json", "results.md", "traffic.png"}
    with pytest.raises(SystemExit):
        cli.main(["--parts", "kernels,speed"])
    assert "unknown parts ['speed']" in capsys.readouterr().err


def test_a_run_of_some_families_replaces_only_their_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    earlier = [{"family": "llama", "status": "ok"}, {"family": "mpt", "status": "wrong"}]
    (tmp_path / "results.json").write_text(json.dumps({"parts": {"families": earlier}}))
    swept: list[tuple[str, ...]] = []

    def sweep(families: tuple[str, ...], progress: object) -> list[FamilyRow]:
        swept.append(families)
        return [FamilyRow(f, status="ok") for f in families]

    monkeypatch.setattr("ad_mlir.bench.families.run_sweep", sweep)
    rows = cli._run_part("families", cli._parse(["--families", "mpt,glm", "--out", str(tmp_path)]), print)
    assert swept == [("mpt", "glm")]
    assert [(r["family"], r["status"]) for r in rows] == [("llama", "ok"), ("mpt", "ok"), ("glm", "ok")]


def test_a_run_of_some_families_says_which_rows_each_run_made(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows merged into an earlier sweep keep that sweep's date and CPU; the markdown says which
    rows come from which run, and a later run of other parts keeps the record."""
    machine = {"date": "2026-11-26T12:38:05", "cpu": "AMD EPYC"}
    earlier = [{"family": f, "status": "ok"} for f in ("llama", "mpt", "gpt2")]
    (tmp_path / "results.json").write_text(json.dumps({"machine": machine, "parts": {"families": earlier}}))
    monkeypatch.setattr("ad_mlir.bench.families.run_sweep",
                        lambda families, progress: [FamilyRow(f, status="ok") for f in families])
    monkeypatch.setattr("ad_mlir.bench.families.markdown", lambda rows, title: title)
    this_machine = {**cli.machine_info(), "date": "2026-11-29T10:25:33", "cpu": "Intel Xeon"}
    monkeypatch.setattr(cli, "machine_info", lambda: this_machine)
    cli.main(["--parts", "families", "--families", "mpt,glm", "--out", str(tmp_path)])
    runs = json.loads((tmp_path / "results.json").read_text())["row_runs"]["families"]
    this, before = "2026-11-29T10:25:33 (Intel Xeon)", "2026-11-26T12:38:05 (AMD EPYC)"
    assert runs == {"llama": before, "mpt": this, "gpt2": before, "glm": this}
    line = f"- families: rows from 2 runs: 2 from {before} (gpt2, llama); 2 from {this} (glm, mpt)"
    assert line in capsys.readouterr().out.splitlines()
    monkeypatch.setattr(cli, "_run_part", lambda part, args, progress: _results()["parts"][part])
    cli.main(["--parts", "traffic", "--out", str(tmp_path)])
    assert line in (tmp_path / "results.md").read_text().splitlines()


def test_the_quantized_column_shows_the_loaders_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    """A DeepSeek-V3 whose experts' intermediate size (48) is no multiple of the FP8 block (32):
    stacked, a block would hold both gate and up rows, so the loader refuses the checkpoint naming
    the experts module: the column says so (the temporary directory left out), not "ok", and
    nothing after the load runs."""
    from ad_mlir.bench.families import markdown, sweep_quantized
    from ad_mlir.zoo import shipped

    fp8 = shipped.SHIPPED["deepseek_v3"]
    monkeypatch.setitem(shipped.SHIPPED, "deepseek_v3", shipped.ShippedFormat(
        fp8.label, fp8.write, {**fp8.overrides, "moe_intermediate_size": 48}))
    row = FamilyRow("deepseek_v3")
    sweep_quantized(row, torch.tensor([[3, 1, 4, 1, 5]]), "default")
    assert (row.quantized, row.quantized_format, row.quantized_ops) == ("refused", "FP8 blocks 32x32", {})
    assert row.quantized_reason == (
        "ValueError: 'deepseek_v3-quantized': model.layers.1.mlp.experts has intermediate size 48, not a multiple "
        "of weight_block_size's bn 32: its stacked gate and up rows would share a block")
    assert "export quantized" not in row.seconds
    table = markdown([row, FamilyRow("mpt", status="ok")])
    assert "| FP8 blocks 32x32: refused | " in table and "quantized: ValueError: 'deepseek_v3-quantized'" in table
    assert re.search(r"^\| mpt \| ok \|.*\| - \| - \| - \|  \|$", table, re.M), table


def test_the_torch_compile_column_compares_the_llm_ops_of_the_two_front_doors(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the backend's SDPA op left opaque (canonicalize not turning it into ad.attention), a
    tiny Llama's column names what differs, as counts through export / through torch.compile:
    RoPE fused into the attention there, left on its own here (the equal case is
    test_dynamo_backend.py's, per family)."""
    import torch

    from ad_mlir.bench.families import compare_front_doors
    from ad_mlir.dialects import canonicalization_patterns
    from ad_mlir.zoo.tiny import TinyConfig, build_model

    model, ids = build_model(TinyConfig(family="llama", layers=1)), torch.tensor([[3, 1, 4, 1, 5]])
    monkeypatch.setattr(canonicalization_patterns.SdpaBackendToAttention, "match_and_rewrite", lambda *a: None)
    assert compare_front_doors(model, ids) == "export / torch.compile: rope 0/1, rope_attention 1/0"


def test_the_torch_compile_column_merges_into_the_results_file(tmp_path: Path) -> None:
    from ad_mlir.bench.families import merge_torch_compile_column

    earlier = [{"family": "llama", "status": "ok", "torch_compile": "same"}, {"family": "mpt", "status": "wrong"}]
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"machine": {"machine": "cpu", "gpu": "", "cpu": "x", "cpu_count": 2, "torch": "t",
                                               "triton": "t", "xdsl": "x", "date": "d"},
                                   "quick": False, "parts": {"families": earlier, "matrix": [{"family": "mpt", "status": "ok"}]},
                                   "skipped": {}}))
    merge_torch_compile_column([FamilyRow("mpt", status="skipped", torch_compile="export / torch.compile: moe 2/0")],
                               results)
    parts = json.loads(results.read_text())["parts"]
    assert parts["families"] == [earlier[0], {**earlier[1], "torch_compile": "export / torch.compile: moe 2/0"}]
    assert parts["matrix"] == [{"family": "mpt", "status": "ok", "torch_compile": "export / torch.compile: moe 2/0"}]
    assert "| mpt | wrong |" in (tmp_path / "results.md").read_text()


def test_decode_traffic_counts_weights_caches_and_new_kv() -> None:
    """One decode step of a one-layer tiny Llama (untied embeddings: the table is read for the
    batch's rows only) against the ideal worked out from its sizes."""
    import ad_mlir
    from ad_mlir.bench.decode_traffic import decode_step_traffic
    from ad_mlir.zoo.tiny import TinyConfig, build_model

    model = build_model(TinyConfig(family="llama", layers=1))
    llm = ad_mlir.LLM(model, max_batch=2, max_seq_len=32)
    cfg, batch = model.config, 2
    assert not cfg.tie_word_embeddings
    table = model.get_input_embeddings().weight
    weights = sum(p.numel() * 4 for p in model.parameters()) - table.numel() * 4 + batch * cfg.hidden_size * 4
    token = 2 * cfg.num_key_value_heads * cfg.head_dim * 4  # K and V of one token of one layer
    short, long = decode_step_traffic(llm.program, batch, 10), decode_step_traffic(llm.program, batch, 20)
    assert short["ideal_weights_bytes"] == weights
    assert short["ideal_caches_read_bytes"] == batch * 10 * token
    assert short["ideal_new_kv_written_bytes"] == batch * token
    assert short["ideal_bytes"] == weights + batch * 11 * token
    # each kernel moves at least what the ideal does; 10 more cached tokens are read once more
    assert short["modelled_bytes"] > short["ideal_bytes"] and short["ratio"] > 1
    assert long["modelled_bytes"] - short["modelled_bytes"] == batch * 10 * token
    assert short["launches"] == long["launches"] > 5


def test_the_generate_table_shows_speed_and_decode_traffic() -> None:
    from ad_mlir.bench.report import generate_table

    speed = {"kind": "speed", "model": "tiny", "impl": "ad-mlir", "device": "cpu", "dtype": "float32", "batch": 1,
             "prompt_tokens": 32, "new_tokens": 16, "seconds": 2.0, "tok_per_s": 8.0, "prefill_s": 0.5,
             "decode_ms_per_step": 100.0, "decode_tok_per_s": 10.0, "compile_s": 3.0}
    traffic = {"kind": "decode traffic", "model": "tiny", "batch": 1, "cached": 32, "launches": 41,
               "modelled_bytes": 2e6, "ideal_bytes": 1e6, "ideal_weights_bytes": 9e5, "ideal_caches_read_bytes": 9e4,
               "ideal_new_kv_written_bytes": 1e4, "ratio": 2.0}
    text = generate_table([speed, traffic])
    assert "### Generation (tiny, float32 on cpu, greedy, EOS ignored)" in text
    assert "| ad-mlir | 1 | 32 | 16 | 2.00 | 8.0 | 0.500 | 100.0 | 10.0 | 3.00 |" in text
    assert "| 1 | 32 | 41 | 2.00 | 1.00 | 0.90 | 0.090 | 0.0100 | 2.000 |" in text


def test_the_ptx_part_specializes_generation_as_the_runtime_launches() -> None:
    """The cached-attention rows: a prefill of TOKENS tokens (one launch over query blocks) and a
    decode step of DECODE_BATCH sequences (split kernel over batch x K/V heads and the cache's
    splits, then one reduce program per head), with the launch's own sizes."""
    from ad_mlir.bench.ptx_table import CACHE_TOKENS, DECODE_BATCH, TOKENS, generation_specializations
    from ad_mlir.codegen.templates.cached_attention_kernel import DECODE, PREFILL, REDUCE, decode_splits

    phases, specs = zip(*generation_specializations(TINY, "bfloat16"), strict=True)
    assert phases == ("prefill", "decode", "decode (reduce)")
    assert [s.constexprs["PHASE"] for s in specs] == [PREFILL, DECODE, REDUCE]
    splits = decode_splits(CACHE_TOKENS)[0]
    assert [s.grid for s in specs] == [(TINY.heads, TOKENS // specs[0].constexprs["BLOCK_M"]),
                                       (DECODE_BATCH * TINY.kv_heads, splits), (DECODE_BATCH * TINY.heads,)]
    assert all(s.constexprs["V_DIM"] == TINY.head_dim and s.signature["q"] == "*bf16" for s in specs)


def test_the_serve_rows_count_tokens_and_latencies_from_the_chunks() -> None:
    """Two streamed answers with known chunk times: tokens by the counter, TTFT from sending to the
    first chunk, ITL as (last - first chunk) / (tokens - 1), answers compared with transformers'."""
    from ad_mlir.bench.report import serve_table
    from ad_mlir.bench.serve import load_row, mark_same_answers

    results = [{"question": "a", "text": "x y z", "sent": 0.0, "chunks": [0.5, 0.6, 0.7]},
               {"question": "b", "text": "x y", "sent": 1.0, "chunks": [1.1, 1.4]}]
    ours = load_row("ad-mlir serve", 2, results, 2.0, lambda text: len(text.split()))
    assert ours["output_tokens"] == 5 and ours["output_tok_per_s"] == 2.5
    assert abs(ours["ttft_p50_s"] - 0.3) < 1e-9  # 0.5 and 0.1; p99 interpolates: 0.1 + 0.99 * 0.4
    assert abs(ours["itl_p50_s"] - 0.2) < 1e-9  # 0.1 and 0.3
    theirs = load_row("transformers serve", 2, [dict(results[0]), {**results[1], "text": "other"}], 4.0,
                      lambda text: len(text.split()))
    rows = [{**r, "model": "tiny", "max_tokens": 8} for r in (ours, theirs)]
    mark_same_answers(rows)
    assert rows[0]["same_answers"] == "1/2" and "same_answers" not in rows[1]
    text = serve_table(rows + [{"kind": "offline", "impl": "ad-mlir LLM.generate", "batch": 8, "output_tokens": 64,
                                "seconds": 2.0, "output_tok_per_s": 32.0, "model": "tiny", "max_tokens": 8}])
    assert "| ad-mlir serve | 2 | 2 | 5 | 2.0 | 2.5 | 300 | 496 | 200 | 298 | 1/2 |" in text
    assert "| ad-mlir LLM.generate | 8 | 64 | 2.0 | 32.0 |" in text


def test_the_launch_part_times_every_kernel_of_a_step_through_the_launcher_not_the_reference(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under `stubbed_launches` a kernel call binds its inputs to the generated launcher and
    runs no reference (it would raise here) and no kernel; the part has a row per kernel the
    decode step calls, each path timed, then the step's, and its table shows them."""
    from ad_mlir.bench.launch import run_launch
    from ad_mlir.bench.report import launch_table
    from ad_mlir.runtime import kernels

    def no_reference(graph: object, values: object) -> None:
        raise AssertionError("a stubbed launch ran the reference")

    monkeypatch.setattr(kernels, "run_reference", no_reference)
    rows = run_launch(calls=2, repeats=1)
    kernel_rows, (step,) = rows[:-1], rows[-1:]
    assert {r["kernel"].rsplit("_", 1)[0] for r in kernel_rows} >= {"rms_norm", "add_rms_norm", "cached_attention",
                                                                     "silu_and_mul"}
    assert all(r[f"{path}_us"] > 0 for r in kernel_rows for path in ("op", "direct", "launcher", "jit", "bound"))
    assert step["kind"] == "step" and step["kernels"] >= len(kernel_rows) and step["op_us"] > 0
    table = launch_table(rows)
    assert all(f"| {r['kernel']} |" in table for r in kernel_rows) and "| 4 | 64 |" in table


def test_stubbed_launches_run_the_generated_launcher_with_a_kernel_that_runs_nothing() -> None:
    import torch

    import ad_mlir
    from ad_mlir.runtime.kernels import registered_kernel, stubbed_launches

    class SiluMul(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.silu(x) * y

    x, y = torch.randn(4, 8), torch.randn(4, 8)
    gm = ad_mlir.compile(torch.export.export(SiluMul(), (x, y)), pipeline="default")
    kernel = next(registered_kernel(n.target) for n in gm.graph.nodes if registered_kernel(n.target) is not None)
    launched: list[tuple] = []
    module = kernel.cached.module
    launch = module.launch

    def recording(fn: object, tensors: list, scalars: list) -> list[torch.Tensor]:
        launched.append((type(fn).__name__, [t.shape for t in tensors]))
        return launch(fn, tensors, scalars)

    module.launch = recording
    try:
        with stubbed_launches():
            out, = gm(x, y)
        expected = torch.nn.functional.silu(x) * y
        assert launched == [("_NoKernel", [x.shape, y.shape])] and out.shape == expected.shape
        launched.clear()
        torch.testing.assert_close(gm(x, y)[0], expected)  # fp32: torch's default tolerances for it
        assert all(name != "_NoKernel" for name, _ in launched), "outside it, the kernel (or reference) runs"
    finally:
        module.launch = launch


def test_the_speculative_part_decodes_plainly_and_with_drafts_and_tabulates_both() -> None:
    """`bench/speculative.py`'s decoding on a tiny paged model (the part itself loads SmolLM2): a
    prompt that repeats itself gets drafts, the drafted run's tokens are the plain run's, and the
    table gives the speed-up over the plain row of the same batch."""
    import ad_mlir
    from ad_mlir.bench.report import speculative_table
    from ad_mlir.bench.speculative import _decode, _same_prefix
    from ad_mlir.llm.speculative import NgramProposer
    from ad_mlir.runtime.kernels import reference_kernels

    llm = ad_mlir.LLM(build_model(TinyConfig(layers=1)), max_batch=2, max_seq_len=32, page_size=4)
    prompts = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11, 9, 10]]
    with torch.no_grad(), reference_kernels():
        plain, plain_tokens = _decode(llm, prompts, 6, None)
        drafted, tokens = _decode(llm, prompts, 6, NgramProposer(2))
    assert plain["drafted_tokens"] == 0 and plain["steps"] >= 6
    assert drafted["drafted_tokens"] > 0 and drafted["output_tokens"] == plain["output_tokens"]
    assert _same_prefix(tokens, plain_tokens) == "all"
    assert _same_prefix([[1, 2, 3], [4, 5]], [[1, 2, 9], [4, 5]]) == "2"
    rows = [{"kind": "speculative", "model": "tiny", "batch": 2, "impl": impl, "new_tokens": 6, **row,
             "same_tokens_as_plain": "all"} for impl, row in (("plain", plain), ("n-gram k=2", drafted))]
    rows[0]["output_tok_per_s"], rows[1]["output_tok_per_s"] = 10.0, 15.0
    text = speculative_table(rows)
    assert "| 2 | n-gram k=2 |" in text and "| 1.5x |" in text


def test_the_quantized_part_loads_each_checkpoint_as_its_quantized_ops_and_counts_their_bytes() -> None:
    """A one-layer Llama as bf16 and GPTQ int4 checkpoints: the GPTQ graph holds four int4 linears
    (fused Q/K/V, o, fused gate/up, down) and its weights are the bf16 ones less each linear's
    2*K*N bytes plus, by the format's layout, K*N/2 of packed nibbles and per group of 64 input
    features N/2 bytes of packed zero points and N bf16 scales (g_idx, trivial, is dropped)."""
    import transformers

    from ad_mlir.bench.quantized import run_quantized

    config = transformers.LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                      initializer_range=0.5)
    model = transformers.LlamaForCausalLM(config).eval().to(torch.bfloat16)
    rows = run_quantized(True, model=model, new_tokens=3, formats=["GPTQ int4 (g64)"])
    assert [(r["format"], r["quantized_ops"]) for r in rows] == [("bf16", {}), ("GPTQ int4 (g64)", {"ad.linear_int4": 4})]
    linears = [(128, 128), (128, 64), (128, 64), (128, 128), (128, 256), (128, 256), (256, 128)]  # (K, N)
    int4 = sum(k * n // 2 + (k // 64) * (n // 2 + 2 * n) for k, n in linears)
    assert rows[0]["weight_bytes"] - rows[1]["weight_bytes"] == sum(2 * k * n for k, n in linears) - int4
    assert rows[1]["decode_bytes_vs_bf16"] < 1 and rows[0]["decode_bytes_vs_bf16"] == 1
    assert all(r["same_tokens_as_eager"] >= 1 and r["decode_tok_per_s"] > 0 for r in rows)
    table = report.quantized_table(rows)
    assert "| GPTQ int4 (g64) | ad.linear_int4 4 |" in table
