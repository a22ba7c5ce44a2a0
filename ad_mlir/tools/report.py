"""The main job: a tiny HF model through export -> import -> pipeline -> Triton kernels ->
export back, with a report (time per stage, ops by kind, kernels per decoder layer, the
generated kernels and the cache, error against the original graph). Without CUDA the
kernels run in the Triton interpreter.

    python -m ad_mlir --report              # tiny Llama, 2 layers, fp32
    python -m ad_mlir --report --model gemma2 --dtype bfloat16 --pipeline none
    python -m ad_mlir --report --model qwen3 --layers 2 --hidden-size 128   # any transformers causal-LM type
    python -m ad_mlir --report --model path/to/checkpoint   # config.json + safetensors, or a .gguf file
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from xdsl.dialects.builtin import NameLoc

from ad_mlir.codegen.cache import KernelCache
from ad_mlir.codegen.interpreter import default_to_interpreter
from ad_mlir.dialects import ad
from ad_mlir.dialects.weights import weight_only_values
from ad_mlir.frontends.export import export_with_ids
from ad_mlir.frontends.fx_import import import_program
from ad_mlir.passes.pipeline import run_pipeline
from ad_mlir.runtime.fx_export import export_program
from ad_mlir.runtime.kernels import build_kernels
from ad_mlir.semantics.reference import evaluate
from ad_mlir.zoo.checkpoints import built_from_config, named_model
from ad_mlir.zoo.tiny import DTYPES, FAMILIES, random_input_ids

R = TypeVar("R")


def _timed(times: dict[str, float], stage: str, fn: Callable[[], R]) -> R:
    start = time.perf_counter()
    result = fn()
    times[stage] = time.perf_counter() - start
    print(f"  {stage:<22} {times[stage]:8.3f} s", flush=True)
    return result


def op_kinds(module: Any) -> Counter[str]:
    """Top-level ops by kind (an ad.fused region counts once: it is one kernel)."""
    kinds: Counter[str] = Counter()
    top_level = (op for fn in module.ops for op in fn.regions[0].block.ops)
    for op in top_level:
        if isinstance(op, ad.TorchOp):
            kinds[f"ad.torch_op {op.target.data}"] += 1
        elif op.name.startswith("ad."):
            kinds[op.name] += 1
    return kinds


VIEW_OPS = (
    ad.ReshapeOp, ad.ExpandOp, ad.PermuteOp, ad.TransposeOp, ad.UnsqueezeOp, ad.SqueezeOp, ad.SliceOp,
    ad.SplitOp, ad.AliasOp,
)
GEMM_AND_ATTENTION = (
    ad.LinearOp, ad.LinearFp8Op, ad.LinearFp8BlockOp, ad.MmOp, ad.BmmOp, ad.MatmulOp, ad.AddmmOp, ad.AttentionOp,
    ad.RopeAttentionOp,
    ad.LinearNvfp4Op,
)
NO_KERNEL = (*VIEW_OPS, ad.ConstantOp, ad.SymSizeOp)
_LAYER = re.compile(r"\b(?:layers|blocks|layer|h)\.(\d+)\b")
"""Decoder layers as HF names them: `model.layers.3`, `transformer.h.3` (GPT-2, Falcon), `transformer.blocks.3` (MPT)."""


def layer_of(op: Any) -> int | None:
    """The decoder layer an op belongs to, by the HF module path in its location; a fused
    region belongs to the layer of its first op that has one (it may start with model-level
    ops, e.g. the attention mask, fused into a layer's softmax)."""
    if isinstance(op, ad.FusedOp):
        return next((layer for inner in op.body.block.ops if (layer := layer_of(inner)) is not None), None)
    match = _LAYER.search(op.location.desc.data) if isinstance(op.location, NameLoc) else None
    return int(match.group(1)) if match else None


def kernels_per_layer(module: Any) -> dict[int, int]:
    """Kernels (non-view ops and fused regions) outside GEMMs and attention, per decoder layer.
    Ops on weights alone are not kernels: the exporter computes them once."""
    counts: Counter[int] = Counter()
    for fn in module.ops:
        once = weight_only_values(fn)
        for op in fn.regions[0].block.ops:
            if isinstance(op, NO_KERNEL + GEMM_AND_ATTENTION) or not op.name.startswith("ad."):
                continue
            if any(r in once for r in op.results):  # computed once, at compile time
                continue
            if (layer := layer_of(op)) is not None:
                counts[layer] += 1
    return dict(sorted(counts.items()))


def max_abs_error(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    return max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b, strict=True))


def low_precision_bound(expected: torch.Tensor, truth: torch.Tensor) -> float:
    """The error against the fp32 model (`truth`) a bf16/fp16 result may have: twice eager's
    own error in that dtype plus one bf16 ulp (2^-8) of the largest magnitude. Eager rounds
    every op's result, the kernels keep fp32 between ops and round once at each store, so they
    differ from eager by a few ulps that later GEMMs spread; closeness to the truth is the fair
    measure, and eager's own error is the yardstick."""
    eager_error = (expected.double() - truth.double()).abs().max().item()
    return 2 * eager_error + 2**-8 * truth.abs().max().item()


def verdict(expected: Sequence[torch.Tensor], got: Sequence[torch.Tensor], truth: Sequence[torch.Tensor]) -> str:
    """'bit-exact'; 'within tolerance': fp32 within torch.testing's defaults (the kernels
    reorder sums), lower precision within `low_precision_bound` of the fp32 model `truth`;
    or 'OUT OF TOLERANCE'."""
    if all(torch.equal(e, g) for e, g in zip(expected, got, strict=True)):
        return "bit-exact"
    for e, g, t in zip(expected, got, truth, strict=True):
        if e.dtype in (torch.bfloat16, torch.float16):
            if (g.double() - t.double()).abs().max().item() > low_precision_bound(e, t):
                return "OUT OF TOLERANCE"
            continue
        try:
            torch.testing.assert_close(g, e)
        except AssertionError:
            return "OUT OF TOLERANCE"
    return "within tolerance"


E4M3_LOGITS_ERROR = 2 * 2**0.5 * 2.0**-4 / 3**0.5
"""The relative error (L2 norm over the vocabulary, per position) that FP8-quantized linears
may give a decoder's logits against the unquantized model, derived from e4m3 itself:
- e4m3 has 3 mantissa bits: rounding to nearest errs by at most half an ulp, 2^-4 relative;
  spread uniformly over that half ulp, its rms is at most 2^-4 / sqrt(3) = 0.036;
- a product x_k * w_k of two rounded operands errs by (1 + a)(1 + b) - 1, rms sqrt(2) x 0.036 =
  0.051 (independent roundings); over a dot product the independent term errors add in
  quadrature, as the terms do for random signs, so the output errs by ~0.051 relative (rms).
  (The worst case, (2 x 2^-4 + 2^-8) x sum |x_k w_k|, is ~sqrt(K) times |y| for random signs:
  no use as a bound);
- each residual branch (attention: q/k/v then o; MLP: gate/up then down) holds two quantized
  linears in sequence, whose relative errors add: 2 x 0.051 = 0.10 per branch; the residual
  stream, a sum of branches, and the final norm keep that relative error, and the LM head is
  not quantized.
So 2 sqrt(2) 2^-4 / sqrt(3) = 0.102. Measured on the tiny Llama (2 layers, fp32 and bf16,
prefill and 8 decode steps): at most 0.053. A quantization that rounds worse (e.g. to e5m2, 2
mantissa bits) exceeds it; the bound does not grow with the pipeline's own error."""


def fp8_logits_error(original: torch.Tensor, got: torch.Tensor) -> float:
    """The largest, over positions, L2 relative error of `got` logits against `original`'s."""
    original, got = original.float(), got.float()
    return ((got - original).norm(dim=-1) / original.norm(dim=-1)).max().item()


def quantized_verdict(original: Sequence[torch.Tensor], got: Sequence[torch.Tensor]) -> str:
    """For an FP8-quantized graph: 'within tolerance' when the compiled graph's logits (its first
    output) are within `E4M3_LOGITS_ERROR` of the unquantized graph's (`original`), else 'OUT OF
    TOLERANCE'."""
    ok = fp8_logits_error(original[0], got[0]) <= E4M3_LOGITS_ERROR
    return "within tolerance" if ok else "OUT OF TOLERANCE"


def _print_kernels(kernels: dict[Any, Any], cache: KernelCache) -> None:
    names = sorted({k.name for k in kernels.values()})
    print(
        f"\nTriton kernels: {len(kernels)} regions and LLM-level ops -> {len(names)} kernels "
        f"({cache.generated} generated, {cache.hits} read from the cache in {cache.directory})"
    )
    for name in names:
        print(f"  {name}")


def run(name: str, model: torch.nn.Module, fp32_model: Callable[[], torch.nn.Module], pipeline: str,
        decompose: bool, seq_lens: Sequence[int], ptx: bool = False, build_seconds: float = 0.0) -> bool:
    """The report on `model` (named `name`, built in `build_seconds`); `fp32_model` gives it in
    fp32, the truth a lower-precision result is measured against."""
    config, dtype = model.config, str(next(model.parameters()).dtype).removeprefix("torch.")
    print(
        f"ad-mlir: {name}, {config.num_hidden_layers} layers, hidden {config.hidden_size}, {dtype}, "
        f"pipeline '{pipeline}'{', decomposed' if decompose else ''}"
    )
    times = {"build model": build_seconds}
    print(f"  {'build model':<22} {build_seconds:8.3f} s")
    ep = _timed(times, "torch.export", lambda: export_with_ids(model, random_input_ids(model, 8), decompose))
    program = _timed(times, "import to ad", lambda: import_program(ep))
    before, layers_before = op_kinds(program.module), kernels_per_layer(program.module)
    records = _timed(times, "pipeline", lambda: run_pipeline(program.module, pipeline))
    cache = KernelCache()
    kernels = _timed(times, "Triton codegen", lambda: build_kernels(program.module, cache))
    gm = _timed(times, "export to FX", lambda: export_program(program, kernels, fold_weights=True))
    print(f"  {'total':<22} {sum(times.values()):8.3f} s")
    for r in records:
        print(f"    pass {r.name}: {r.ops_before} -> {r.ops_after} ops, {r.seconds:.3f} s")

    after = op_kinds(program.module)
    print(f"\nad ops by kind ({sum(before.values())} imported, {sum(after.values())} after the pipeline):")
    for kind, n in sorted(after.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {n:5d}  {kind}")
    dropped = sorted(set(before) - set(after))
    if dropped:
        print(f"  removed entirely: {', '.join(dropped)}")
    print(
        "\nkernels per decoder layer outside GEMMs/attention (non-view ops + fused regions; a region "
        "counts in the layer of its first op that has one):"
    )
    for layer, n in layers_before.items():
        print(f"  layer {layer}: {n:3d} imported -> {kernels_per_layer(program.module).get(layer, 0):3d} compiled")

    _print_kernels(kernels, cache)
    again = KernelCache(cache.directory)
    build_kernels(program.module, again)
    print(f"  compiled again: {again.generated} kernels generated, {again.hits} read from the cache")
    if ptx:
        from ad_mlir.codegen.ptx import format_table, ptx_reports

        print("\nPTX for sm_90 (no GPU needed), specialized as the runtime launches them at 256 tokens:")
        print(format_table(ptx_reports(kernels.values())))

    interpreted = any(type(k.cached.jit_function).__name__ == "InterpretedFunction" for k in kernels.values())
    runs_on = "Triton interpreter (TRITON_INTERPRET=1)" if interpreted else "torch reference semantics (no CUDA)"
    print(f"\ncompiled graph against the original torch.export graph (same inputs; kernels run in the {runs_on}):")
    truth_model = model if dtype == "float32" else fp32_model()
    quantized = any(isinstance(op, ad.LinearFp8Op) for op in program.module.walk())
    if quantized:
        print("  (FP8 pipeline: the compiled graph's logits are judged against the original graph's by the relative "
              f"error e4m3 allows, {E4M3_LOGITS_ERROR:.3f})")
    ok = True
    for seq in seq_lens:
        ids = random_input_ids(model, seq, seed=seq)
        with torch.no_grad():
            ref = torch.utils._pytree.tree_leaves(ep.module()(input_ids=ids))
            out = gm(ids)
            truth = torch.utils._pytree.tree_leaves(truth_model(input_ids=ids))[: len(ref)]
            ev = evaluate(program.module, program.weights, [ids])
        result = quantized_verdict(ref, out) if quantized else verdict(ref, out, truth)
        ok &= result != "OUT OF TOLERANCE"
        print(
            f"  seq {seq:3d}: compiled graph max |err| {max_abs_error(ref, out):.3g} ({result}), "
            f"reference evaluator max |err| {max_abs_error(ref, ev):.3g}"
        )
    return ok


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m ad_mlir --report", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--model", default="llama", metavar="NAME|PATH",
                   help=f"a built-in tiny family ({', '.join(FAMILIES)}; default llama), any transformers causal-LM "
                   "model type built small from its config (qwen3, phi3, gpt2, ...), smollm2, a checkpoint "
                   "directory (config.json + safetensors) or a .gguf file")
    p.add_argument("--layers", type=int, default=None, help="decoder layers of a model built from a config (default 2)")
    p.add_argument("--hidden-size", type=int, default=None, help="hidden size of a model built from a config "
                   "(default: 64 for a built-in family, 128 for a model type)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--pipeline", default="default", help="'default', 'none' or a pass list like 'canonicalize,dce'")
    p.add_argument("--decompose", action="store_true", help="run torch.export's core ATen decompositions first")
    p.add_argument("--seq-lens", type=int, nargs="+", default=[7, 19], help="sequence lengths to check (dynamic dim)")
    p.add_argument(
        "--no-interpret",
        action="store_true",
        help="on a machine without CUDA, run fused regions as their torch reference instead of "
        "the Triton kernels in the Triton interpreter",
    )
    p.add_argument("--ptx", action="store_true", help="compile every kernel to PTX for sm_90 and report "
                   "registers, spills, shared memory and vectorized loads/stores")
    p.add_argument("-v", "--verbose", action="store_true", help="log each pass")
    args = p.parse_args(argv)
    if not args.no_interpret and not torch.cuda.is_available():
        default_to_interpreter()  # a no-op when `python -m ad_mlir --report` decided it before importing triton
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    layers = args.layers
    if layers is None and built_from_config(args.model):
        layers = 2

    def build(dtype: str) -> torch.nn.Module:
        return named_model(args.model, dtype, layers, args.hidden_size)

    start = time.perf_counter()
    try:
        model = build(args.dtype)
    except ValueError as e:
        p.error(str(e))
    ok = run(args.model, model, lambda: build("float32"), args.pipeline, args.decompose, args.seq_lens, args.ptx,
             time.perf_counter() - start)
    sys.exit(0 if ok else 1)
