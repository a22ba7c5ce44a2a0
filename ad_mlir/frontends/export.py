"""The project's inference export: `torch.export` of a model under no_grad, with SDPA's math
backend and a dynamic sequence length."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch loads lazily: `ad-opt file.mlir` should not pay 1.7 s for it
    import torch


def export_meta_model(model: torch.nn.Module) -> torch.export.ExportedProgram:
    """A `meta_model`'s export at 8 tokens, the sequence dynamic up to 1024 (MPT's export
    refuses 2048, its ALiBi table's length)."""
    import torch

    return export_with_ids(model, torch.zeros(1, 8, dtype=torch.long, device="meta"), max_seq=1024)


def export_model(model: torch.nn.Module, seq_len: int = 8, decompose: bool = False) -> torch.export.ExportedProgram:
    """Export `model(input_ids=...)` with a dynamic sequence length, under no_grad
    (inference graphs; no grad-mode wrappers), traced at `seq_len` token ids drawn (seed 1)
    from the model's own vocabulary."""
    import torch

    vocab = model.get_input_embeddings().num_embeddings
    ids = torch.randint(0, vocab, (1, seq_len), generator=torch.Generator().manual_seed(1))
    return export_with_ids(model, ids, decompose)


def export_with_ids(
    model: torch.nn.Module, input_ids: torch.Tensor, decompose: bool = False, max_seq: int = 4096
) -> torch.export.ExportedProgram:
    """`export_model` for given `input_ids` (e.g. on the meta device, for a `meta_model`);
    the sequence length is dynamic in [2, max_seq]."""
    import torch

    seq = torch.export.Dim("seq", min=2, max=max_seq)
    ep = export_inference(model, {"input_ids": input_ids}, {"input_ids": {1: seq}})
    return ep.run_decompositions() if decompose else ep


def export_inference(model: torch.nn.Module, kwargs: dict[str, Any], dynamic_shapes: Any,
                     args: tuple[Any, ...] = (), generation: bool = False) -> torch.export.ExportedProgram:
    """`torch.export.export(model, args, kwargs)`, non-strict, under no_grad (inference graphs: no
    grad-mode wrappers) and with SDPA's math backend chosen while tracing: on CUDA the fused
    backends' fake kernels pad the mask to a multiple of 8 and guard on that padding, which a
    dynamic sequence length cannot satisfy (fp32 HF models on an H100, torch 2.11). The graph
    keeps the SDPA op either way; its backend is chosen again when it runs. HF's chunked scans
    (Mamba2, the gated delta rule) are exported as opaque ops (`frontends/export_patches.py`);
    `generation`: the export for generation, whose steps hold only real tokens (with the patches
    `export_patches.GENERATION_METHODS` adds). Under a torch before 2.13 its symbolic Min and Max
    simplify as 2.13's do (`frontends/torch_patches.py`; without, no grouped-query model exports
    with a dynamic length there), so that each torch traces the same graph."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ad_mlir.frontends.export_patches import routed_for_export
    from ad_mlir.frontends.torch_patches import multiples_collapsed

    with heap_frozen(), torch.no_grad(), sdpa_kernel(SDPBackend.MATH), routed_for_export(generation), \
            multiples_collapsed():
        return torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False)


@dataclass
class ModuleExport:
    """`export_inference(module, kwargs, dynamic_shapes, args, generation)`, run when asked for
    (`exported`, once), within `around()` where given (a context manager: what else the export
    needs set, and which error it raises for a failure). `compile_program` takes it in place of
    the export: where the compiled-program cache holds the compile of the same export (its module
    entries, `runtime/program_cache.py`, keyed by `frontends/export_key.py`) it never runs."""

    module: torch.nn.Module
    kwargs: dict[str, Any]
    dynamic_shapes: Any
    args: tuple[Any, ...] = ()
    generation: bool = False
    around: Callable[[], AbstractContextManager[Any]] | None = None
    _exported: torch.export.ExportedProgram | None = field(default=None, init=False, repr=False)

    def exported(self) -> torch.export.ExportedProgram:
        if self._exported is None:
            with self.around() if self.around is not None else contextlib.nullcontext():
                self._exported = export_inference(self.module, self.kwargs, self.dynamic_shapes, self.args,
                                                  self.generation)
        return self._exported


@contextlib.contextmanager
def heap_frozen() -> Iterator[None]:
    """Within: the objects that existed before (torch's and the other loaded modules', the model,
    the exported graph) are left out of Python's cyclic garbage collection (`gc.freeze`), and
    taken back at the end (`gc.unfreeze`). Why: a full collection visits every tracked object,
    and exporting or compiling a model allocates enough to set off some; after a 32-layer Llama's
    export each visits some 520,000 objects (0.3-0.5 s), in whichever stage allocates at the
    time (measured, fresh process, 2 cores: time in the collector 0.59 -> 0.15 s over the stages
    after the export, 0.25-0.32 -> 0.09 s in the export). Garbage made within is collected as before; garbage among the older objects waits
    for the first collection after. Where objects are frozen already (a caller's `gc.freeze`, as
    model servers do after loading, or an enclosing `heap_frozen`), nothing changes."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
