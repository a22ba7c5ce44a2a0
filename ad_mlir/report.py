"""The main job: a tiny HF model through export -> import -> pipeline -> export back,
with a report (ops by kind, round-trip error against the original graph, time per stage).

    python -m ad_mlir                       # tiny Llama, 2 layers, fp32
    python -m ad_mlir --model gemma2 --dtype bfloat16 --pipeline none
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

from ad_mlir.dialects import ad
from ad_mlir.frontends.fx_export import export_program
from ad_mlir.frontends.fx_import import import_program
from ad_mlir.models import DTYPES, FAMILIES, TinyConfig, build_model, example_input_ids, export_model
from ad_mlir.passes.pipeline import run_pipeline
from ad_mlir.runtime.reference import evaluate

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
GEMM_AND_ATTENTION = (ad.LinearOp, ad.MmOp, ad.BmmOp, ad.MatmulOp, ad.AddmmOp, ad.AttentionOp)
_NO_KERNEL = (*VIEW_OPS, ad.ConstantOp, ad.SymSizeOp)
_LAYER = re.compile(r"\blayers\.(\d+)\b")


def kernels_per_layer(module: Any) -> dict[int, int]:
    """Kernels (non-view ops and fused regions) outside GEMMs and attention, per decoder layer
    (by the HF module path in each op's location; a region is located at its first op)."""
    counts: Counter[int] = Counter()
    for fn in module.ops:
        for op in fn.regions[0].block.ops:
            if isinstance(op, _NO_KERNEL + GEMM_AND_ATTENTION) or not op.name.startswith("ad."):
                continue
            match = _LAYER.search(op.location.desc.data) if isinstance(op.location, NameLoc) else None
            if match:
                counts[int(match.group(1))] += 1
    return dict(sorted(counts.items()))


def max_abs_error(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    return max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b, strict=True))


def verdict(expected: Sequence[torch.Tensor], got: Sequence[torch.Tensor]) -> str:
    """'bit-exact', 'within tolerance' (torch.testing's defaults for the dtype: rewrites such
    as the softmax decomposition reorder float math), or 'OUT OF TOLERANCE'."""
    if all(torch.equal(e, g) for e, g in zip(expected, got, strict=True)):
        return "bit-exact"
    try:
        for e, g in zip(expected, got, strict=True):
            torch.testing.assert_close(g, e)
    except AssertionError:
        return "OUT OF TOLERANCE"
    return "within tolerance"


def run(cfg: TinyConfig, pipeline: str, decompose: bool, seq_lens: Sequence[int]) -> bool:
    print(
        f"ad-mlir: {cfg.family}, {cfg.layers} layers, hidden {cfg.hidden_size}, {cfg.dtype}, "
        f"pipeline '{pipeline}'{', decomposed' if decompose else ''}"
    )
    times: dict[str, float] = {}
    model = _timed(times, "build model", lambda: build_model(cfg))
    ep = _timed(times, "torch.export", lambda: export_model(model, cfg, decompose=decompose))
    program = _timed(times, "import to ad", lambda: import_program(ep))
    before = op_kinds(program.module)
    records = _timed(times, "pipeline", lambda: run_pipeline(program.module, pipeline))
    gm = _timed(times, "export to FX", lambda: export_program(program))
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

    print("\ncompiled graph against the original torch.export graph (same inputs):")
    ok = True
    for seq in seq_lens:
        ids = example_input_ids(cfg, seq, seed=seq)
        with torch.no_grad():
            ref = torch.utils._pytree.tree_leaves(ep.module()(input_ids=ids))
            out = gm(ids)
            ev = evaluate(program.module, program.weights, [ids])
        result = verdict(ref, out)
        ok &= result != "OUT OF TOLERANCE"
        print(
            f"  seq {seq:3d}: exported graph max |err| {max_abs_error(ref, out):.3g} ({result}), "
            f"reference evaluator max |err| {max_abs_error(ref, ev):.3g}"
        )
    return ok


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m ad_mlir", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(FAMILIES), default="llama")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--pipeline", default="default", help="'default', 'none' or a pass list like 'canonicalize,dce'")
    p.add_argument("--decompose", action="store_true", help="run torch.export's core ATen decompositions first")
    p.add_argument("--seq-lens", type=int, nargs="+", default=[7, 19], help="sequence lengths to check (dynamic dim)")
    p.add_argument("-v", "--verbose", action="store_true", help="log each pass")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    try:
        cfg = TinyConfig(family=args.model, layers=args.layers, hidden_size=args.hidden_size, dtype=args.dtype)
    except ValueError as e:
        p.error(str(e))
    ok = run(cfg, args.pipeline, args.decompose, args.seq_lens)
    sys.exit(0 if ok else 1)
