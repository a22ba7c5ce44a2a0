"""Tensor-parallel tiny HF model under torchrun: each rank compiles the model with
`canonicalize,match-moe,shard{world-size=W}` + a pipeline, runs its shard of the weights on the same tokens, and
prints its max |error| against the unsharded eager model.

    torchrun --standalone --nproc-per-node 2 -m ad_mlir.examples.tp --model llama

With --generate each rank builds an `ad_mlir.LLM` from that pipeline (K/V caches of its local
heads), generates greedily from fixed prompts and prints its tokens and whether they equal those
of one unsharded `LLM` (run on rank 0, sent to every rank); the exit status says so too.

    torchrun --standalone --nproc-per-node 2 -m ad_mlir.examples.tp --model llama --generate

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

from ad_mlir.codegen.interpreter import default_to_interpreter
from ad_mlir.frontends.export import export_model
from ad_mlir.llm.ranks import sharded_pipeline
from ad_mlir.runtime.kernels import registered_kernel
from ad_mlir.zoo.tiny import DTYPES, FAMILIES, TinyConfig, build_model, example_input_ids

ALL_REDUCE = "_c10d_functional.all_reduce.default"
PROMPTS = ((5, 9, 13, 3, 7, 40, 41), (3, 4), (11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21))
"""Token ids of different lengths (the tiny models have no tokenizer); three prompts for two
cache slots, so one waits for a freed slot."""


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
    from ad_mlir.tools.report import max_abs_error, verdict

    world, rank = dist.get_world_size(), dist.get_rank()
    model = build_model(cfg)
    ep = export_model(model)
    gm = ad_mlir.compile(ep, pipeline=sharded_pipeline(pipeline, world))
    device = _device()
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
    kernels = tuple(str(n.target) for n in gm.graph.nodes if n.op == "call_function" and registered_kernel(n.target))
    worst = "OUT OF TOLERANCE" if "OUT OF TOLERANCE" in verdicts else "within tolerance"
    return RankResult(rank, world, targets.count(ALL_REDUCE), kernels, errors, worst)


@dataclass(frozen=True)
class GenerateResult:
    rank: int
    world_size: int
    tokens: list[list[int]]
    """This rank's greedy new tokens, per prompt."""
    unsharded: list[list[int]]
    """The same prompts through one unsharded LLM (on rank 0)."""
    kv_heads: dict[str, int]
    """K/V heads of each of this rank's caches."""

    @property
    def equal(self) -> bool:
        return self.tokens == self.unsharded


def generate_rank(cfg: TinyConfig, pipeline: str = "default", prompts: Sequence[Sequence[int]] = PROMPTS,
                  max_new_tokens: int = 12) -> GenerateResult:
    """Generate greedily with `cfg`'s model sharded over the initialized process group (every rank
    builds the same weights from the seed); rank 0 also generates with the model unsharded."""
    from ad_mlir import LLM

    world, rank = dist.get_world_size(), dist.get_rank()
    model = build_model(cfg).to(_device())
    sizes = {"max_batch": 2, "max_seq_len": max(map(len, prompts)) + max_new_tokens}
    llm = LLM(model, pipeline=sharded_pipeline(pipeline, world), **sizes)
    tokens = [out.token_ids for out in llm.generate(prompts, max_new_tokens)]
    unsharded: list[list[list[int]] | None] = [None]
    if rank == 0:
        single = LLM(model, pipeline=pipeline, world_size=1, rank=0, **sizes)
        unsharded = [[out.token_ids for out in single.generate(prompts, max_new_tokens)]]
    dist.broadcast_object_list(unsharded, src=0)
    kv_heads = {name: cache.shape[2] for name, cache in llm.caches.items()}  # [slots, max_seq, kv_heads, head_dim]
    return GenerateResult(rank, world, tokens, unsharded[0], kv_heads)


def _device() -> torch.device | None:
    """This rank's GPU under NCCL; None (the CPU) under gloo."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None


def _format_generate(result: GenerateResult, cfg: TinyConfig) -> str:
    heads = sorted(set(result.kv_heads.values()))
    return (
        f"rank {result.rank}/{result.world_size}: {cfg.family} {cfg.dtype}, {cfg.layers} layers, K/V heads per cache: "
        f"{'/'.join(map(str, heads))}; tokens {result.tokens}; "
        f"equal to one unsharded process: {result.equal}"
    )


def _format(result: RankResult, cfg: TinyConfig) -> str:
    errors = ", ".join(f"seq {s}: {e:.3g}" for s, e in result.errors.items())
    return (
        f"rank {result.rank}/{result.world_size}: {cfg.family} {cfg.dtype}, {cfg.layers} layers, "
        f"{result.all_reduces} all_reduce, {len(result.kernels)} kernel calls; max |error| vs unsharded {errors} "
        f"({result.verdict})"
    )



def _print_line(text: str) -> None:
    """One write of the line and its newline: the ranks print at once to one pipe, and a print's
    text and end written apart interleave (seen: two ranks' lines glued, their newlines after)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()

def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="torchrun --standalone --nproc-per-node W -m ad_mlir.examples.tp",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(FAMILIES), default="llama")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden-size", type=int, default=None, help="default: 64 x the world size")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--pipeline", default="default", help="what runs after shard: 'default', 'none', 'a,b'")
    p.add_argument("--seq-lens", type=int, nargs="+", default=[7, 19])
    p.add_argument("--generate", action="store_true",
                   help="generate greedily from fixed prompts with ad_mlir.LLM (K/V caches of the local heads) and "
                        "compare the tokens with one unsharded LLM's")
    p.add_argument("--max-new-tokens", type=int, default=12, help="with --generate")
    p.add_argument("--no-interpret", action="store_true",
                   help="without CUDA, run fused regions as their torch reference, not in the Triton interpreter")
    args = p.parse_args(argv)
    if "RANK" not in os.environ:
        p.error("run under torchrun, e.g. torchrun --standalone --nproc-per-node 2 -m ad_mlir.examples.tp")
    gpus = torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"])
    if gpus:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    elif not args.no_interpret:
        default_to_interpreter()  # ad_mlir.tools.report and ad_mlir.compile import triton: none is imported yet
    dist.init_process_group("nccl" if gpus else "gloo")
    try:
        world = dist.get_world_size()
        cfg = TinyConfig(family=args.model, layers=args.layers, dtype=args.dtype,
                         hidden_size=args.hidden_size or 64 * world)
        if args.generate:
            generated = generate_rank(cfg, args.pipeline, max_new_tokens=args.max_new_tokens)
            _print_line(_format_generate(generated, cfg))
            ok = generated.equal
        else:
            result = run_rank(cfg, args.pipeline, args.seq_lens)
            _print_line(_format(result, cfg))
            ok = result.verdict != "OUT OF TOLERANCE"
        # every rank done before any tears its connections down: a rank that went on (rank 0's
        # unsharded run) while its peer exited had its gloo thread aborted at exit ("terminate
        # called without an active exception", exit -6) after printing equal tokens
        dist.barrier()
    finally:
        dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
