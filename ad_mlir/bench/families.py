"""The family sweep: every causal-LM model type that transformers maps in
`AutoModelForCausalLM`, built small from its config class (random weights), exported with a
dynamic sequence length, compiled with a pipeline (default: `default`) and run on CPU against
eager, with the kernels on their reference path and in the Triton interpreter.

    python -m ad_mlir.bench.families                    # every family, 2 at a time, table on stdout
    python -m ad_mlir.bench.families llama mpt glm -v   # some families
    ad-bench --parts families                           # the same, written under benchmarks/results/

Each family runs in a child process of its own, bounded in time. A row says how far the
family got: not built / not exported (the model's or torch.export's reason: not ours),
compile error, call error or wrong (ours: defects), or ok; and the max |error| of the logits
against eager at two sequence lengths on each path, the kernels per decoder layer before and
after the pipeline, and the fused ops of a layer. The generation column (`--no-generation` skips
it) builds the family again with a wide init (varied greedy tokens) and a hybrid's layer kinds in
turn, and compares `ad_mlir.LLM`'s greedy tokens with HF `generate`'s: a family that equals eager
but generates other tokens is a defect ("different"), one that `LLM` refuses says why.

The quantized column (`--no-quantized` skips it), for a family whose real checkpoints ship
quantized (`ad_mlir.zoo.shipped.SHIPPED`: qwen3, deepseek_v3, gpt_oss, llama), writes its small
model in that format, loads it as `LLM(path)` does, compiles it and compares it with the loaded
model's eager forward on both paths: the status ("refused": the loader's error), the errors and
the quantized ops of a layer; "-" for the other families.

The torch.compile column (`--torch-compile also`, or `only`: that column alone, the others
left as they were) compiles the same small model through `torch.compile(backend="ad_mlir")`
and through the project's torch.export (static shapes, as Dynamo's first compile) +
`ad_mlir.compile`, and compares the LLM ops of the two programs (`LLM_OP_TYPES`; over every
graph when Dynamo breaks the model into several, which the column says): "same", or each
op's count through export / through torch.compile where they differ. `--merge-into
results.json` writes that column into a results file's family rows (and its results.md).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ad_mlir.zoo.small import (
    HYBRID_LAYERS,
    SIZES,
    WHERE_PRESENT,
    causal_lm_families,
    model_from_config,
    small_config,
)

SEQ_LENS = (5, 11)
MAX_SEQ = 1024
"""The dynamic sequence length's upper bound: within every family's position limit (MPT's
ALiBi table has 2048 rows; 4096 fails its export)."""
MAX_PARAMETERS = 400_000_000
"""A family whose small model still has more parameters (a config that ignores our sizes)
is skipped: it would not fit the sweep's time."""

MATRIX: dict[str, str] = {
    "llama": "RMSNorm, SiLU-gated MLP, full RoPE, GQA",
    "qwen2": "Q/K/V biases",
    "mistral": "sliding window",
    "gemma": "RMSNorm with 1 + w, gated GELU (tanh), scaled embedding",
    "gemma2": "attention soft-cap, alternating sliding-window layers, post-norms",
    "gemma3_text": "sliding-window and global layers, QK-norm with 1 + w, gated GELU",
    "qwen3": "QK-norm per head before RoPE",
    "olmo2": "norms after attention and MLP, QK-norm over the whole projection",
    "phi3": "fused QKV and gate/up projections",
    "gpt2": "LayerNorm, GELU (tanh), Conv1D projections, learned positions",
    "opt": "LayerNorm, ReLU MLP, learned positions with an offset",
    "falcon": "fused QKV, multi-query attention, parallel attention + MLP",
    "starcoder2": "LayerNorm with biases, GELU MLP, sliding window",
    "gpt_neox": "partial rotary, LayerNorm, parallel attention + MLP",
    "phi": "partial rotary, LayerNorm, one norm feeding attention and MLP",
    "gptj": "interleaved RoPE pairs, partial rotary, parallel attention + MLP",
    "ernie4_5": "interleaved RoPE pairs",
    "glm": "partial rotary, interleaved pairs, fused gate/up",
    "glm4": "GLM's rotary with extra post-norms",
    "bloom": "ALiBi on a [batch*heads] layout, LayerNorm after the embedding",
    "mpt": "ALiBi, LayerNorm without bias",
    "mixtral": "MoE: top-k routing, softmax then top-k, renormalized",
    "qwen3_moe": "MoE with QK-norm",
    "qwen2_moe": "MoE with a shared expert behind a sigmoid gate",
}
"""Family -> the shape it brings: the five built-in families and the HF decoder shapes beyond
Llama's (tests/models/test_families.py checks each; `ad-bench` tables cover them)."""

LLM_OPS = (
    "ad.rms_norm", "ad.add_rms_norm", "ad.layer_norm", "ad.add_layer_norm", "ad.rope_attention", "ad.rope",
    "ad.silu_and_mul", "ad.gelu_and_mul", "ad.activation", "ad.moe", "ad.quantize_fp8", "ad.attention", "ad.fused",
)

QUANTIZED_OPS = ("ad.linear_fp8_block", "ad.linear_fp8", "ad.quantize_fp8_dynamic", "ad.linear_nvfp4", "ad.linear_int4",
                 "ad.moe_mxfp4", "ad.moe_fp8_block")
"""The ops that compute on a checkpoint's quantized weights (and the quantization of their inputs)."""

TORCH_COMPILE_MODES = ("no", "also", "only")
"""The torch.compile column: not run, run besides the other columns, or run alone."""

STATUSES = ("ok", "wrong", "call error", "compile error", "not exported", "not built", "skipped", "timeout",
            "killed")
OURS = ("wrong", "call error", "compile error", "timeout", "killed")
"""Statuses that are defects of ours (a timeout or a killed child is ours until shown otherwise)."""


@dataclass
class FamilyRow:
    family: str
    status: str = "not built"
    reason: str = ""
    model_class: str = ""
    parameters: int = 0
    reference_error: dict[int, float] = field(default_factory=dict)
    """Max |logits error| against eager per sequence length, kernels as their torch reference."""
    interpreter_error: dict[int, float] = field(default_factory=dict)
    """The same with the kernels run in the Triton interpreter."""
    kernels_before: int | None = None
    kernels_after: int | None = None
    kernel_calls: int = 0
    """Calls of our kernels (`torch.ops.ad_mlir.*`) in the compiled graph."""
    fused_ops: dict[str, int] = field(default_factory=dict)
    """LLM-level ops and fused regions of decoder layer 0 after the pipeline."""
    bf16_error: dict[str, float] = field(default_factory=dict)
    """The bf16 model at the longest sequence length: max |logits - fp32 eager| of eager bf16
    ("eager"), of the compiled bf16 model on each path ("reference", "interpreter"), and the
    bound those may reach ("bound", `report.low_precision_bound`)."""
    seconds: dict[str, float] = field(default_factory=dict)
    generation: str = "-"
    """`LLM` greedy tokens against HF `generate` (`check_generation`): "equal", "different" (a defect of
    ours), "refused" (our error, in `generation_reason`), "HF repeats" (HF's tokens do not vary,
    so equal tokens would prove nothing), or "-" (not run)."""
    generation_reason: str = ""
    torch_compile: str = "-"
    """The LLM ops through `torch.compile(backend="ad_mlir")` against those through torch.export
    (`compare_front_doors`): "same", the differing counts, our error, or "-" (not run)."""
    quantized: str = "-"
    """The family's small model written in the format its real checkpoints ship quantized in
    (`zoo.shipped.SHIPPED`), loaded, compiled and run against the loaded model's eager forward
    (`sweep_quantized`): a status of `STATUSES` but "refused" for the loader's error (a format
    or layer it does not load), or "-" (a family without quantized checkpoints, or not run)."""
    quantized_format: str = ""
    quantized_error: dict[str, float] = field(default_factory=dict)
    """Max |logits error| of the compiled quantized model against the eager one at the longest
    sequence length, per path ("reference", "interpreter")."""
    quantized_ops: dict[str, int] = field(default_factory=dict)
    """The quantized `ad` ops of decoder layer 0 after the pipeline (`QUANTIZED_OPS`)."""
    quantized_reason: str = ""


def _error_line(e: BaseException) -> str:
    """The exception's first line, and for torch.export's constraint errors the first
    constraint it names (the first line only says which dim)."""
    lines = [line.strip() for line in f"{type(e).__name__}: {e}".splitlines() if line.strip()]
    detail = next((line for line in lines[1:] if line.startswith("- ")), None)
    return (lines[0] + (f" {detail}" if detail and "Constraints violated" in lines[0] else ""))[:400]


def _stage(row: FamilyRow, name: str, fn: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    try:
        return fn()
    finally:
        row.seconds[name] = round(time.perf_counter() - start, 3)


def _layer0_ops(module: Any) -> dict[str, int]:
    from ad_mlir.tools.report import layer_of

    counts: Counter[str] = Counter()
    for fn in module.ops:
        for op in fn.regions[0].block.ops:
            if op.name in LLM_OPS and layer_of(op) == 0:
                counts[op.name] += 1
    return dict(sorted(counts.items()))


def sweep_family(family: str, pipeline: str = "default", seq_lens: Sequence[int] = SEQ_LENS,
                 bf16: bool = True, generation: bool = False, torch_compile: str = "no",
                 quantized: bool = True) -> FamilyRow:
    """One family, in this process (the sweep runs it in a child; see `run_sweep`): (`quantized`,
    for a family of `zoo.shipped.SHIPPED`) its quantized checkpoint, then fp32 at each of
    `seq_lens`, then (`bf16`) the same weights in bf16 at the longest, then (`generation`)
    `LLM`'s greedy tokens against HF's; the torch.compile column (`torch_compile` "also", or
    "only": that column alone) at the shortest length."""
    import torch

    from ad_mlir.runtime.kernels import registered_kernel
    from ad_mlir.tools.report import kernels_per_layer, max_abs_error
    from ad_mlir.zoo.shipped import SHIPPED

    row = FamilyRow(family)
    try:
        config = small_config(family)
        row.model_class, row.parameters = _size_on_meta(config)
        if row.parameters > MAX_PARAMETERS:
            row.status, row.reason = "skipped", f"{row.parameters / 1e6:.0f}M parameters at the sweep's sizes"
            return row
        model = _stage(row, "build", lambda: model_from_config(config))
    except Exception as e:  # noqa: BLE001 (a family that transformers cannot build is a row, not a crash)
        row.reason = _error_line(e)
        return row
    ids = torch.randint(1, 1000, (1, max(seq_lens)), generator=torch.Generator().manual_seed(0))
    if torch_compile != "no":
        row.torch_compile = _stage(row, "torch.compile column", lambda: compare_front_doors(model, ids[:, : seq_lens[0]]))
        if torch_compile == "only":
            row.status, row.reason = "skipped", "only the torch.compile column was run"
            return row
    if quantized and family in SHIPPED:
        sweep_quantized(row, ids, pipeline)
    try:
        ep = _stage(row, "export", lambda: _export(model, ids[:, : seq_lens[0]]))
    except Exception as e:  # noqa: BLE001
        row.status, row.reason = "not exported", _error_line(e)
        return row
    try:
        gm, module = _stage(row, "compile", lambda: _compile(ep, pipeline, row))
    except Exception as e:  # noqa: BLE001
        row.status, row.reason = "compile error", _error_line(e)
        logging.getLogger(__name__).debug("%s", traceback.format_exc())
        return row
    row.kernels_after = max(kernels_per_layer(module).values(), default=0)
    row.kernel_calls = sum(1 for n in gm.graph.nodes if n.op == "call_function" and registered_kernel(n.target))
    row.fused_ops = _layer0_ops(module)
    row.status = "ok"
    for seq in seq_lens:
        x = ids[:, :seq]
        with torch.no_grad():
            expected = model(input_ids=x).logits
        for path, errors in (("reference", row.reference_error), ("interpreter", row.interpreter_error)):
            try:
                got = _run_compiled(row, gm, x, path, f"run {seq}")
            except Exception as e:  # noqa: BLE001
                row.status, row.reason = "call error", _error_line(e)
                return row
            errors[seq] = max_abs_error([expected], [got])
            if got.shape != expected.shape or not _close(got, expected):
                row.status = "wrong"
                row.reason = f"max |error| {errors[seq]:.3g} at seq {seq}" + (
                    "" if path == "reference" else " (Triton interpreter)")
    if bf16 and row.status == "ok":
        _sweep_bf16(row, model, ids[:, : max(seq_lens)], pipeline)
    if generation and row.status == "ok":
        _stage(row, "generation", lambda: check_generation(row))
    return row


def sweep_quantized(row: FamilyRow, ids: Any, pipeline: str) -> None:
    """The quantized column: the family's small model (`zoo.shipped.SHIPPED`'s settings) written
    as a checkpoint in the format its real checkpoints ship in, loaded as `LLM(path)` loads it
    (`load_causal_lm`, fp32 around the quantized tensors), exported, compiled and run at the
    longest of `ids` on each path against the loaded model's eager forward, which computes the same
    quantization (the FP8 activations' rounding too: the interpreter's e4m3 conversion made
    torch's, `nearest_e4m3_rounding`, to measure the kernels and not the interpreter). The eager
    and compiled arithmetic differ by the order of fp32 sums: held to `_close`, as the fp32 model."""
    import torch

    from ad_mlir.codegen.interpreter import nearest_e4m3_rounding
    from ad_mlir.tools.report import max_abs_error
    from ad_mlir.zoo.checkpoints import load_causal_lm
    from ad_mlir.zoo.shipped import SHIPPED

    shipped = SHIPPED[row.family]
    row.quantized_format, status = shipped.label, "not built"
    with tempfile.TemporaryDirectory(prefix="ad_mlir_sweep_") as tmp:
        try:
            model = model_from_config(small_config(row.family, overrides=shipped.overrides))
            directory = _stage(row, "write quantized", lambda: shipped.write(model, Path(tmp) / f"{row.family}-quantized"))
            status = "refused"
            model, _ = _stage(row, "load quantized", lambda: load_causal_lm(str(directory), "cpu", "float32"))
            status = "not exported"
            ep = _stage(row, "export quantized", lambda: _export(model, ids[:, : SEQ_LENS[0]]))
            status = "compile error"
            gm, module = _stage(row, "compile quantized", lambda: _compile(ep, pipeline, FamilyRow(row.family)))
            row.quantized_ops = quantized_ops(module)
            status = "call error"
            with torch.no_grad():
                expected = model(input_ids=ids).logits
            row.quantized = "ok"
            for path in ("reference", "interpreter"):
                with nearest_e4m3_rounding():
                    got = _run_compiled(row, gm, ids, path, f"run quantized {ids.shape[1]}")
                row.quantized_error[path] = max_abs_error([expected], [got])
                if got.shape != expected.shape or not _close(got, expected):
                    row.quantized = "wrong"
                    row.quantized_reason = f"max |error| {row.quantized_error[path]:.3g} ({path})"
        except Exception as e:  # noqa: BLE001 (the column says what failed)
            row.quantized, row.quantized_reason = status, _error_line(e).replace(tmp + os.sep, "")


def quantized_ops(module: Any) -> dict[str, int]:
    """The `QUANTIZED_OPS` of decoder layer 0 by name, inside fused regions too."""
    from ad_mlir.tools.report import layer_of

    counts = Counter(op.name for op in module.walk() if op.name in QUANTIZED_OPS and layer_of(op) == 0)
    return dict(sorted(counts.items()))


def compare_front_doors(model: Any, ids: Any) -> str:
    """The torch.compile column for `model` on `ids`: "same" when the LLM ops (`llm_ops`) of
    the programs made through `torch.compile(model, backend="ad_mlir")` (summed over its graphs)
    and through the project's torch.export + `ad_mlir.compile` are equal, else
    "export / torch.compile: op n/m, ..." over the ops whose counts differ; "(Dynamo: N graphs)"
    when Dynamo broke the model into several. An error of either path is the column's value."""
    from unittest import mock

    import torch
    import torch._dynamo

    import ad_mlir.dynamo_backend
    from ad_mlir.compiler import compile_program
    from ad_mlir.frontends.export import export_inference
    from ad_mlir.runtime.kernels import reference_kernels

    programs: list[Any] = []

    def recording(gm: Any, *args: Any, **kwargs: Any) -> Any:
        compiled, program = compile_program(gm, *args, **kwargs)
        programs.append(program)
        return compiled

    torch._dynamo.reset()
    try:
        with mock.patch.object(ad_mlir.dynamo_backend, "compile", recording), torch.no_grad(), reference_kernels():
            torch.compile(model, backend="ad_mlir", options={"fallback": False})(input_ids=ids)
    except Exception as e:  # noqa: BLE001 (the column says what failed)
        return "torch.compile: " + _error_line(e)
    finally:
        torch._dynamo.reset()
    try:
        exported = llm_ops(compile_program(export_inference(model, {"input_ids": ids}, None))[1].module)
    except Exception as e:  # noqa: BLE001
        return "export path: " + _error_line(e)
    compiled = sum((llm_ops(p.module) for p in programs), Counter())
    graphs = f" (Dynamo: {len(programs)} graphs)" if len(programs) != 1 else ""
    if compiled == exported:
        return "same" + graphs
    differ = sorted(n for n in exported.keys() | compiled.keys() if exported[n] != compiled[n])
    return "export / torch.compile: " + ", ".join(
        f"{n.removeprefix('ad.')} {exported[n]}/{compiled[n]}" for n in differ) + graphs


def llm_ops(module: Any) -> Counter[str]:
    """The LLM-level ops of a compiled module by name: kernel ops (norms, RoPE, attention, MoE,
    ...), linears and attentions."""
    from ad_mlir.dialects import ad

    return Counter(op.name for op in module.walk() if isinstance(op, ad.KernelOp | ad.LinearOp | ad.AttentionOp))


def _run_compiled(row: FamilyRow, gm: Any, ids: Any, path: str, stage: str) -> Any:
    """The compiled model's logits with the kernels as their torch reference or (`path`
    "interpreter") as Triton kernels: in the interpreter where CUDA is absent."""
    import torch

    from ad_mlir.runtime.kernels import reference_kernels

    context = reference_kernels if path == "reference" else contextlib.nullcontext
    with torch.no_grad(), context():
        return _stage(row, stage + ("" if path == "reference" else " interpreted"), lambda: gm(ids)[0])


def _sweep_bf16(row: FamilyRow, model: Any, ids: Any, pipeline: str) -> None:
    """The bf16 model (the fp32 weights rounded) compiled and run on both paths, each judged
    against the fp32 model by `report.low_precision_bound`: eager bf16's own error is the
    yardstick, as the kernels keep fp32 between ops where eager rounds each result. The
    interpreter rounds the kernels' bf16 stores to nearest as a GPU does (its own truncation
    alone puts Pegasus's logits past the bound: `interpreter.nearest_bf16_rounding`)."""
    import torch

    from ad_mlir.codegen.interpreter import nearest_bf16_rounding
    from ad_mlir.tools.report import low_precision_bound, max_abs_error

    with torch.no_grad():
        truth = model(input_ids=ids).logits
        model = _in_bf16(model)
        eager = model(input_ids=ids).logits
    row.bf16_error = {"eager": max_abs_error([truth], [eager]), "bound": low_precision_bound(eager, truth)}
    status = "not exported"
    try:
        ep = _stage(row, "export bf16", lambda: _export(model, ids[:, : SEQ_LENS[0]]))
        status = "compile error"
        gm, _ = _stage(row, "compile bf16", lambda: _compile(ep, pipeline, FamilyRow(row.family)))
        status = "call error"
        for path in ("reference", "interpreter"):
            with nearest_bf16_rounding():
                got = _run_compiled(row, gm, ids, path, f"run bf16 {ids.shape[1]}")
            row.bf16_error[path] = max_abs_error([truth], [got])
            if got.dtype != eager.dtype or row.bf16_error[path] > row.bf16_error["bound"]:  # HF may upcast logits
                row.status = "wrong"
                row.reason = (f"bf16 ({path}): max |error| {row.bf16_error[path]:.3g} against fp32, eager bf16's "
                              f"{row.bf16_error['eager']:.3g}, bound {row.bf16_error['bound']:.3g}")
                return
    except Exception as e:  # noqa: BLE001
        row.status, row.reason = status, "bf16: " + _error_line(e)


def _in_bf16(model: Any) -> Any:
    """`model`'s weights loaded in bf16 as `from_pretrained(dtype=torch.bfloat16)` loads a
    checkpoint: what the model keeps in fp32 stays fp32 (Inkling2's router, whose fp32 input
    meets a bf16 weight after a plain `model.to(torch.bfloat16)`)."""
    import torch

    weights = model.state_dict()
    loaded = type(model).from_pretrained(None, config=model.config, state_dict=weights, dtype=torch.bfloat16)
    # a weight the loader renamed or initialized anew would pass for bf16's own error
    other = [k for k, v in loaded.state_dict().items() if k not in weights or not torch.equal(v, weights[k].to(v.dtype))]
    if other:
        raise RuntimeError(f"{type(model).__name__} loads other weights in bf16 than its fp32 ones: {other[:3]}")
    return loaded.eval()


def _close(got: Any, expected: Any) -> bool:
    """fp32 logits within torch.testing's defaults (rtol 1.3e-6, atol 1e-5): the kernels compute
    in fp32 like eager and only reorder sums."""
    import torch

    try:
        torch.testing.assert_close(got, expected)
    except AssertionError:
        return False
    return True


def _size_on_meta(config: Any) -> tuple[str, int]:
    """The model's class and parameter count, built on the meta device (no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return type(model).__name__, sum(p.numel() for p in model.parameters())


def _export(model: Any, ids: Any) -> Any:
    from ad_mlir.frontends.export import export_with_ids

    return export_with_ids(model, ids, max_seq=MAX_SEQ)


def _compile(ep: Any, pipeline: str, row: FamilyRow) -> tuple[Any, Any]:
    """`ad_mlir.compile`'s stages, keeping the module to count kernels before and after."""
    from ad_mlir.codegen.cache import KernelCache
    from ad_mlir.frontends.fx_import import import_program
    from ad_mlir.passes.pipeline import run_pipeline
    from ad_mlir.runtime.fx_export import export_program
    from ad_mlir.runtime.kernels import build_kernels
    from ad_mlir.tools.report import kernels_per_layer

    program = import_program(ep)
    row.kernels_before = max(kernels_per_layer(program.module).values(), default=0)
    run_pipeline(program.module, pipeline)
    gm = export_program(program, build_kernels(program.module, KernelCache()), fold_weights=True)
    return gm, program.module


# ----------------------------------------------------------------- the sweep


GENERATION_PROMPTS = ([5, 9, 13, 7], [21, 3, 8, 30, 11, 2, 17], [40, 41, 42])
"""Three prompts for two slots: one waits for a freed slot."""
GENERATION_TOKENS = 8
GENERATION_VARIANTS: tuple[tuple[float, dict[str, Any]], ...] = (
    (0.5, {}), (0.05, {}), (0.5, {"tie_word_embeddings": False}))
"""The generation column's model, `initializer_range` and config settings, tried in turn until
HF's greedy tokens vary (the default init often repeats one token, which a broken cache
reproduces): 0.5 for most families; 0.05 where weights that wide saturate the model into
repeating the last prompt token (the Gemma families' scaled embeddings and soft caps); untied
embeddings where the tied model repeats at any init (OpenAI-GPT)."""


def generation_config(family: str, init: float = 0.5, settings: dict[str, Any] | None = None) -> Any:
    """`small_config` (a hybrid's two layers already one of each kind: `zoo.small.hybrid_layers`)
    with `initializer_range` `init`, `settings`, and, where its layers are still of one kind but
    its default config names several (Gemma2's sliding and full attention), the first two kinds
    in turn (not for a hybrid whose layers `HYBRID_LAYERS` chose: Zamba's two hybrid layers)."""
    from transformers import AutoConfig

    settings = dict(settings or {})
    config = small_config(family, overrides=settings)
    kinds = list(dict.fromkeys(getattr(AutoConfig.for_model(family), "layer_types", None) or []))
    layer_types = getattr(config, "layer_types", None)
    if len(kinds) > 1 and layer_types and len(set(layer_types)) < 2 and family not in HYBRID_LAYERS:
        # built with them, not set afterwards: a config derives settings per kind (Dory's RoPE)
        settings["layer_types"] = [kinds[i % len(kinds)] for i in range(config.num_hidden_layers)]
        config = small_config(family, overrides=settings)
    config.initializer_range = init
    return config


def greedy_only(model: Any) -> Any:
    """`model` with a generation config of its EOS and pad tokens alone: HF's `generate` is then
    greedy decoding and nothing else, what `LLM` answers. The config HF derives from a model's
    config can hold policies of `generate` (BART's, Pegasus' and BlenderBot's `forced_eos_token_id`
    makes the last allowed token EOS; BlenderBot's `encoder_no_repeat_ngram_size` bans n-grams of
    the prompt), which are not the model's tokens."""
    from transformers import GenerationConfig

    defaults = model.generation_config
    model.generation_config = GenerationConfig(eos_token_id=defaults.eos_token_id, pad_token_id=defaults.pad_token_id,
                                               use_cache=defaults.use_cache)
    return model


def check_generation(row: FamilyRow) -> None:
    """`ad_mlir.LLM` (2 slots, kernels on their torch reference) against HF `generate`, greedy,
    `GENERATION_TOKENS` new tokens of each of `GENERATION_PROMPTS`."""
    import torch

    import ad_mlir
    from ad_mlir.runtime.kernels import reference_kernels

    for init, settings in GENERATION_VARIANTS:
        torch.manual_seed(0)
        model = greedy_only(model_from_config(generation_config(row.family, init, settings)))
        with torch.no_grad():
            expected = [model.generate(torch.tensor([p]), max_new_tokens=GENERATION_TOKENS, do_sample=False)
                        [0, len(p):].tolist() for p in GENERATION_PROMPTS]
        if any(len(set(tokens)) > 1 for tokens in expected):
            break
    try:
        llm = ad_mlir.LLM(model, max_batch=2, max_seq_len=64)
        with reference_kernels():
            got = [o.token_ids for o in llm.generate(list(GENERATION_PROMPTS), max_new_tokens=GENERATION_TOKENS)]
    except Exception as e:  # noqa: BLE001 (a refusal is a row: ours when it is not our own error)
        row.generation, row.generation_reason = "refused", _error_line(e)
        return
    if all(len(set(tokens)) <= 1 for tokens in expected):
        row.generation = "HF repeats"
    else:
        row.generation = "equal" if got == expected else "different"


def _run_child(family: str, pipeline: str, timeout: float, env: dict[str, str], generation: bool,
               torch_compile: str = "no", quantized: bool = True) -> FamilyRow:
    cmd = [sys.executable, "-m", "ad_mlir.bench.families", "--child", "--pipeline", pipeline, family,
           "--torch-compile", torch_compile, *([] if generation else ["--no-generation"]),
           *([] if quantized else ["--no-quantized"])]
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return FamilyRow(family, "timeout", f"did not finish in {timeout:.0f} s",
                         seconds={"total": round(time.perf_counter() - start, 1)})
    lines = done.stdout.strip().splitlines()
    if done.returncode < 0:
        return FamilyRow(family, "killed", f"child killed by signal {-done.returncode}"
                         + (" (out of memory)" if done.returncode == -9 else ""))
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return FamilyRow(family, "call error", f"child exited {done.returncode}: {tail[:300]}")
    row = FamilyRow(**json.loads(lines[-1]))
    row.reference_error = {int(k): v for k, v in row.reference_error.items()}
    row.interpreter_error = {int(k): v for k, v in row.interpreter_error.items()}
    row.seconds["total"] = round(time.perf_counter() - start, 1)
    return row


def run_sweep(
    families: Sequence[str], pipeline: str = "default", timeout: float = 600, jobs: int = 2,
    progress: Callable[[FamilyRow], None] | None = None, generation: bool = True, torch_compile: str = "no",
    quantized: bool = True,
) -> list[FamilyRow]:
    """Each family in a child process (kernels in the interpreter where CUDA is absent, a
    fresh kernel cache for the sweep, passes strict so a failing pass is a compile error, one
    CPU thread each: the shapes are tiny and `jobs` children share the cores)."""
    env = dict(os.environ, TRITON_INTERPRET="1", AD_MLIR_SKIP_ON_ERROR="0", OMP_NUM_THREADS="1")
    rows: dict[str, FamilyRow] = {}
    with tempfile.TemporaryDirectory(prefix="ad_mlir_sweep_") as cache, \
            concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        env.setdefault("AD_MLIR_CACHE_DIR", cache)
        futures = {pool.submit(_run_child, f, pipeline, timeout, env, generation, torch_compile, quantized): f
                   for f in families}
        for future in concurrent.futures.as_completed(futures):
            row = future.result()
            rows[row.family] = row
            if progress:
                progress(row)
    return [rows[f] for f in families]


def summary(rows: Sequence[FamilyRow]) -> dict[str, int]:
    counts = Counter(r.status for r in rows)
    return {s: counts[s] for s in STATUSES if counts[s]}


def _errors(errors: dict[int, float]) -> str:
    """At each sequence length, shortest first (keys are strings once read back from JSON)."""
    return " / ".join(f"{errors[k]:.2g}" for k in sorted(errors, key=int)) or "-"


def _bf16_errors(errors: dict[str, float]) -> str:
    return " / ".join(f"{errors[k]:.2g}" if k in errors else "-" for k in ("eager", "reference", "interpreter"))


def _quantized(r: FamilyRow) -> str:
    """"-", or the format, the status, the errors on each path and the quantized ops of layer 0."""
    if r.quantized == "-":
        return "-"
    errors = " / ".join(f"{r.quantized_error[k]:.2g}" for k in ("reference", "interpreter") if k in r.quantized_error)
    ops = ", ".join(f"{k.removeprefix('ad.')} {v}" for k, v in r.quantized_ops.items())
    return "; ".join(x for x in (f"{r.quantized_format}: {r.quantized}", errors, ops) if x)


def table(rows: Sequence[FamilyRow]) -> str:
    header = ["family", "status", "max err ref", "max err interp", "bf16 err eager / ref / interp",
              "kernels/layer", "kernel calls", "fused ops (layer 0)", "generation", "torch.compile", "quantized", "s",
              "reason"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        kernels = "-" if r.kernels_after is None else f"{r.kernels_before} -> {r.kernels_after}"
        fused = ", ".join(f"{k.removeprefix('ad.')} {v}" for k, v in r.fused_ops.items()) or "-"
        quantized = f"quantized: {r.quantized_reason}" if r.quantized_reason else ""
        reason = "; ".join(x for x in (r.reason, r.generation_reason, quantized) if x).replace("|", "\\|")
        lines.append(f"| {r.family} | {r.status} | {_errors(r.reference_error)} | {_errors(r.interpreter_error)} "
                     f"| {_bf16_errors(r.bf16_error)} | {kernels} | {r.kernel_calls} | {fused} | {r.generation} "
                     f"| {r.torch_compile} | {_quantized(r)} | {r.seconds.get('total', '-')} | {reason} |")
    return "\n".join(lines)


def markdown(rows: Sequence[FamilyRow], title: str = "Family sweep") -> str:
    counts = ", ".join(f"{n} {s}" for s, n in summary(rows).items())
    sizes = ", ".join(f"{k}={v}" for k, v in SIZES.items())
    return (f"### {title}: {len(rows)} causal-LM families ({counts})\n\n"
            f"Sizes: {sizes}; where the config has them: {', '.join(f'{k}={v}' for k, v in WHERE_PRESENT.items())}; fp32; "
            f"errors are max |logits - eager| at seq {' / '.join(map(str, SEQ_LENS))}; bf16 errors are max "
            f"|logits - fp32 eager| at seq {max(SEQ_LENS)} of eager bf16 and of the compiled bf16 model (allowed: "
            "twice eager's plus one bf16 ulp of the largest logit); 'kernels/layer' is "
            "the most kernels of a decoder layer outside GEMMs and attention, imported -> compiled; 'generation' "
            f"is `ad_mlir.LLM`'s greedy tokens (2 slots, {len(GENERATION_PROMPTS)} prompts, {GENERATION_TOKENS} new "
            f"tokens) against HF generate's, with the first of initializer_range 0.5, 0.05, 0.5 untied under which HF's tokens vary, and a hybrid's layer kinds in turn; "
            f"'torch.compile' compares the LLM ops through `torch.compile(backend=\"ad_mlir\")` with those through torch.export at seq {SEQ_LENS[0]} "
            "(\"same\", or the differing counts as export/torch.compile); 'quantized' is, for a family whose real "
            "checkpoints ship quantized, its small model written in that format (`ad_mlir/zoo/shipped.py`), loaded, "
            f"compiled and run at seq {max(SEQ_LENS)} against the loaded model's eager forward: the status (\"refused\": "
            "the loader's error, in 'reason'), max |error| on the reference path / in the interpreter, and the "
            "quantized ops of layer 0.\n\n"
            + table(rows))


def merge_torch_compile_column(rows: Sequence[FamilyRow], results: Path) -> None:
    """Write `rows`' torch.compile column into the family rows of `results` (an ad-bench
    results.json: its family sweep's and family matrix's) and rewrite its results.md; the other
    columns stay as they were."""
    from ad_mlir.bench.report import markdown as results_markdown

    data = json.loads(results.read_text())
    column = {r.family: r.torch_compile for r in rows}
    for part in ("families", "matrix"):
        for row in data["parts"].get(part, []):
            row["torch_compile"] = column.get(row["family"], row.get("torch_compile", "-"))
    results.write_text(json.dumps(data, indent=1) + "\n")
    results.with_name("results.md").write_text(results_markdown(data))


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m ad_mlir.bench.families", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("families", nargs="*", help="model types (default: every one AutoModelForCausalLM maps)")
    p.add_argument("--pipeline", default="default")
    p.add_argument("--timeout", type=float, default=600, help="seconds per family")
    p.add_argument("--jobs", type=int, default=2, help="families at a time")
    p.add_argument("--json", type=str, default=None, help="also write the rows to this JSON file")
    p.add_argument("--no-generation", dest="generation", action="store_false",
                   help="skip the generation column (LLM's greedy tokens against HF generate's)")
    p.add_argument("--no-quantized", dest="quantized", action="store_false",
                   help="skip the quantized column (the family's checkpoint in the format it ships quantized in)")
    p.add_argument("--torch-compile", choices=TORCH_COMPILE_MODES, default="no",
                   help="the torch.compile column (LLM ops through torch.compile against torch.export): "
                        "not run, run besides the others, or run alone")
    p.add_argument("--merge-into", type=str, default=None,
                   help="write the torch.compile column of these rows into this results.json's family rows "
                        "(and its results.md)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("-v", "--verbose", action="store_true", help="a line per family as it finishes")
    args = p.parse_args(argv)
    if args.child:
        logging.basicConfig(level=logging.WARNING)
        row = sweep_family(args.families[0], args.pipeline, generation=args.generation, torch_compile=args.torch_compile,
                           quantized=args.quantized)
        print(json.dumps(asdict(row)))
        return
    families = args.families or causal_lm_families()
    unknown = set(families) - set(causal_lm_families())
    if unknown:
        p.error(f"not causal-LM model types of transformers: {', '.join(sorted(unknown))}")

    def progress(row: FamilyRow) -> None:
        if args.verbose:
            column = f" [torch.compile: {row.torch_compile}]" if args.torch_compile != "no" else ""
            print(f"{row.family}: {row.status} {row.reason}{column}", file=sys.stderr, flush=True)

    rows = run_sweep(families, args.pipeline, args.timeout, args.jobs, progress, args.generation, args.torch_compile,
                     args.quantized)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)
    if args.merge_into:
        merge_torch_compile_column(rows, Path(args.merge_into))
    print(markdown(rows))
    sys.exit(1 if any(r.status in OURS or r.quantized in OURS or r.generation == "different" for r in rows) else 0)


if __name__ == "__main__":
    main()
