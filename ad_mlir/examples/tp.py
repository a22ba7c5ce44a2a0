"""Tensor-parallel tiny HF model under torchrun: each rank compiles the model with
`canonicalize,shard{world-size=W}` + a pipeline, runs its shard of the weights on the same tokens, and
prints its max |error| against the unsharded eager model.

    torchrun --nproc-per-node 2 -m ad_mlir.examples.tp --model llama

The process group comes from torchrun's environment: NCCL when every rank has a GPU, gloo
otherwise (then fused regions run as Triton kernels in the interpreter unless --no-interpret).
The hidden size defaults to 64 x the world size (2W heads of 32, W key/value heads), so any
world size divides the head counts.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ad_mlir.models import DTYPES, FAMILIES, TinyConfig, build_model, example_input_ids, export_model
from ad_mlir.report import max_abs_error, verdict

ALL_REDUCE = "_c10d_functional.all_reduce.default"


@dataclass(frozen=True)
class RankResult:
    rank: int
    world_size: int
    all_reduces: int
    kernels: tuple[str, ...]
    """The `torch.ops.ad_mlir` kernels the rank's graph calls."""
    errors: dict[int, float]
    """Max |error| of the logits against the unsharded eager model, by sequence length."""
    verdict: str


def run_rank(cfg: TinyConfig, pipeline: str = "default", seq_lens: Sequence[int] = (7, 19)) -> RankResult:
    """Compile `cfg`'s model sharded over the initialized process group and compare this rank's
    logits with the unsharded model's (every rank builds the same weights from the seed)."""
    import ad_mlir

    world, rank = dist.get_world_size(), dist.get_rank()
    model = build_model(cfg)
    ep = export_model(model, cfg)
    gm = ad_mlir.compile(ep, pipeline=f"canonicalize,shard{{world-size={world}}},{pipeline}")
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    if device is not None:
        gm, model = gm.to(device), model.to(device)
    truth_model = build_model(dataclasses.replace(cfg, dtype="float32")).to(device)
    errors, verdicts = {}, set()
    for seq in seq_lens:
        ids = example_input_ids(cfg, seq, seed=seq).to(device)
        with torch.no_grad():
            expected = [model(input_ids=ids).logits]
            got = list(gm(ids))[:1]
            truth = [truth_model(input_ids=ids).logits]
        errors[seq] = max_abs_error(expected, got)
        verdicts.add(verdict(expected, got, truth))
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    kernels = tuple(t for t in targets if t.startswith("ad_mlir."))
    worst = "OUT OF TOLERANCE" if "OUT OF TOLERANCE" in verdicts else "within tolerance"
    return RankResult(rank, world, targets.count(ALL_REDUCE), kernels, errors, worst)


def _format(result: RankResult, cfg: TinyConfig) -> str:
    errors = ", ".join(f"seq {s}: {e:.3g}" for s, e in result.errors.items())
    return (
        f"rank {result.rank}/{result.world_size}: {cfg.family} {cfg.dtype}, {cfg.layers} layers, "
        f"{result.all_reduces} all_reduce, {len(result.kernels)} kernel calls; max |error| vs unsharded {errors} "
        f"({result.verdict})"
    )


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="torchrun --nproc-per-node W -m ad_mlir.examples.tp",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(FAMILIES), default="llama")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden-size", type=int, default=None, help="default: 64 x the world size")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--pipeline", default="default", help="what runs after shard: 'default', 'none', 'a,b'")
    p.add_argument("--seq-lens", type=int, nargs="+", default=[7, 19])
    p.add_argument("--no-interpret", action="store_true",
                   help="without CUDA, run fused regions as their torch reference, not in the Triton interpreter")
    args = p.parse_args(argv)
    if "RANK" not in os.environ:
        p.error("run under torchrun, e.g. torchrun --nproc-per-node 2 -m ad_mlir.examples.tp")
    gpus = torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"])
    if gpus:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    elif not args.no_interpret:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read when a kernel module is imported
    dist.init_process_group("nccl" if gpus else "gloo")
    try:
        world = dist.get_world_size()
        cfg = TinyConfig(family=args.model, layers=args.layers, dtype=args.dtype,
                         hidden_size=args.hidden_size or 64 * world)
        result = run_rank(cfg, args.pipeline, args.seq_lens)
        print(_format(result, cfg), flush=True)
    finally:
        dist.destroy_process_group()
    sys.exit(0 if result.verdict != "OUT OF TOLERANCE" else 1)


if __name__ == "__main__":
    main()
