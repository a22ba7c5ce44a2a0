"""`compile(gm)`: import -> pass pipeline -> Triton kernels for the fused regions -> export."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ad_mlir.codegen.cache import KernelCache
from ad_mlir.frontends.fx_import import ImportedProgram, import_program
from ad_mlir.passes.pipeline import run_pipeline
from ad_mlir.passes.verify import NumericVerifier
from ad_mlir.runtime.fx_export import export_program
from ad_mlir.runtime.kernels import build_kernels
from ad_mlir.runtime.verify import check_compiled
from ad_mlir.semantics.weights import Rank


def compile(
    gm: torch.nn.Module | torch.export.ExportedProgram,
    example_inputs: Sequence[Any] | Mapping[str, Any] | None = None,
    pipeline: str | Path = "default",
    cache: KernelCache | None = None,
    world_size: int | None = None,
    rank: int | None = None,
    verify: bool = False,
    dynamic_shapes: Any = None,
) -> torch.fx.GraphModule:
    """Compile a graph through `pipeline` ("default", "none", "pass,pass" or a YAML file). `gm` is
    an ExportedProgram (grad-mode exports included: grad-mode and disabled-autocast regions are
    inlined, an enabled autocast region gets its casts made explicit), `ep.module()`, an
    ATen-level GraphModule (`make_fx`, AOTAutograd) with `meta["val"]` or `example_inputs`, or an
    `nn.Module` / `symbolic_trace` GraphModule with `example_inputs` (a tuple of positional
    inputs or a dict of keyword inputs) and optionally `dynamic_shapes` (as `torch.export.export`
    takes them), exported here for inference (non-strict, under no_grad). A higher-order op that
    cannot be inlined exactly (`torch.cond`, ...) raises ImportError_ naming its node.
    Each fused region becomes a Triton kernel called as `torch.ops.ad_mlir.<name>`
    (kernels are cached on disk, see `codegen/cache.py`). The result takes the graph's user
    inputs in order and returns a tuple. Ops on weights alone (e.g. the weight concatenation of
    `fuse-gemms`) run once, here: the result holds their outputs in place of those weights.
    Weight arguments that are tensor-parallel shards (`ad.shard_dim`) hold `rank`'s slice;
    `world_size` and `rank` default to the initialized process group's, else 1 and 0.

    With `verify`, every pass is checked numerically (the function before and after it, on the
    same random inputs and the real weights, `passes/verify.py`), and so is the result: its
    kernels against the final IR (`runtime/verify.py`); a difference beyond the dtype's tolerance raises
    NumericMismatch naming the pass (and the first op that differs) or the result. A pass that
    raises or breaks the program is skipped instead when the pipeline's YAML says
    `skip_on_error: true` (the default outside the test suite, see `run_pipeline`).

    The result checks its inputs at every call before any kernel runs (count, dtype, device type,
    rank, static sizes, the dynamic dims' ranges of the export): a mismatch raises InputError
    naming the input, expected and actual (`frontends/input_checks.py`)."""
    return compile_program(gm, example_inputs, pipeline, cache, world_size, rank, verify, dynamic_shapes)[0]


def compile_program(
    gm: torch.nn.Module | torch.export.ExportedProgram,
    example_inputs: Sequence[Any] | Mapping[str, Any] | None = None,
    pipeline: str | Path = "default",
    cache: KernelCache | None = None,
    world_size: int | None = None,
    rank: int | None = None,
    verify: bool = False,
    dynamic_shapes: Any = None,
) -> tuple[torch.fx.GraphModule, ImportedProgram]:
    """`compile`, also returning the program the pipeline made (its function's arguments say
    what the compiled graph takes, e.g. the K/V caches `insert-cached-attention` added)."""
    program = import_program(gm, example_inputs, dynamic_shapes)
    run_pipeline(program.module, pipeline, numeric=NumericVerifier(program.weights) if verify else None)
    compiled = export_program(
        program, build_kernels(program.module, cache), fold_weights=True, rank=_rank(world_size, rank)
    )
    if verify:
        check_compiled(compiled, program.module, program.weights)
    return compiled, program


def _rank(world_size: int | None, rank: int | None) -> Rank:
    initialized = torch.distributed.is_available() and torch.distributed.is_initialized()
    if world_size is None:
        world_size = torch.distributed.get_world_size() if initialized else 1
    if rank is None:
        rank = torch.distributed.get_rank() if initialized else 0
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of {world_size}")
    return Rank(rank, world_size)
