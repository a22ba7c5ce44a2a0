"""The export `LLM` compiles for generation (`export_for_cache`: token ids and positions with the
batch and the sequence dynamic, or one flat sequence for the paged form, HF's own cache off), and
the cache arguments the compiled function takes (`cache_arguments`)."""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from xdsl.dialects import func

from ad_mlir.dialects import ad
from ad_mlir.frontends.export import ModuleExport


@dataclass(frozen=True)
class CacheArgument:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    per_token: bool
    """A K/V cache, MLA's latent cache, DSA's index-key cache or DeepSeek-V4's compressed entries,
    which grows with the tokens of a slot; else a state of fixed size per slot (a convolution's, a
    recurrent scan's)."""
    layer: str
    """The HF module path of the op it serves."""


class CacheExportError(ValueError):
    """The model does not export in the form generation compiles (`export_for_cache`)."""


def export_for_cache(model: torch.nn.Module, max_batch: int, max_seq_len: int,
                     flat: bool = False) -> torch.export.ExportedProgram:
    """`model(input_ids=, position_ids=)` with batch and sequence dynamic (with `flat`, batch 1
    and the sequence dynamic), under no_grad, with
    inputs on the model's device and HF's own cache off (the compiled graph has ours): through
    `use_cache=False` where the forward names it, else through the config (a forward that takes
    it in `**kwargs`). `position_ids` only where the forward takes it: a model without computes
    its positions itself, which `insert-cached-attention` replaces by the step's real ones where
    they are a range over the step's tokens from 0 (BART's, Pegasus' positional embeddings), and
    refuses otherwise."""
    return cache_export(model, max_batch, max_seq_len, flat).exported()


def cache_export(model: torch.nn.Module, max_batch: int, max_seq_len: int, flat: bool = False) -> ModuleExport:
    """`export_for_cache`'s export, not run yet: what `LLM` compiles, so that a compile the
    program cache holds runs no torch.export (`compile_program`)."""
    params = inspect.signature(model.forward).parameters
    name = type(model).__name__
    if "input_ids" not in params:
        raise CacheExportError(f"{name}.forward takes no 'input_ids' parameter: generation needs a causal LM "
                               "called with token ids")
    device = model_device(model)
    seq = torch.export.Dim("seq", min=1, max=max_seq_len)
    # flat: one sequence of every token of a step, batch 1 static (the paged form); else both dynamic
    rows, row_dims = (1, {1: seq}) if flat else (2, {0: torch.export.Dim("batch", min=1, max=max(max_batch, 2)),
                                                     1: seq})
    kwargs: dict[str, Any] = {"input_ids": torch.zeros(rows, 3, dtype=torch.int64, device=device)}
    dims: dict[str, Any] = {"input_ids": row_dims}
    if "position_ids" in params:
        kwargs["position_ids"], dims["position_ids"] = torch.arange(3, device=device).expand(rows, 3), row_dims
    if "use_cache" in params:
        kwargs["use_cache"], dims["use_cache"] = False, None
    return ModuleExport(model, kwargs, dims, generation=True,
                        around=functools.partial(_exporting_for_generation, model, tuple(kwargs), flat))


@contextlib.contextmanager
def _exporting_for_generation(model: torch.nn.Module, inputs: tuple[str, ...], flat: bool) -> Iterator[None]:
    """HF's cache off (`_hf_cache_off`); a failure to export raised as CacheExportError, saying
    with which inputs and which guard the model's code added."""
    try:
        with _hf_cache_off(model):
            yield
    except Exception as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [""]
        # a constraint violation's first line names only the dim; its first "- " line says which guard the code added
        guard = next((line[2:] for line in lines[1:] if line.startswith("- ")), None)
        shapes = "batch 1, tokens dynamic" if flat else "batch and sequence dynamic"
        raise CacheExportError(f"{type(model).__name__} does not export for generation, called with "
                               f"{', '.join(inputs)} ({shapes}): "
                               f"{type(e).__name__}: {lines[0]}" + (f" ({guard})" if guard else "")) from e


@contextlib.contextmanager
def _hf_cache_off(model: torch.nn.Module) -> Iterator[None]:
    """`config.use_cache = False` while exporting (HF forwards fall back to it), restored after."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "use_cache"):
        yield
        return
    before, config.use_cache = config.use_cache, False
    try:
        yield
    finally:
        config.use_cache = before


def model_device(model: torch.nn.Module) -> torch.device:
    """Where the model's weights are (its inputs and caches go there too)."""
    return next(model.parameters()).device


def cache_arguments(fn: func.FuncOp) -> list[CacheArgument]:
    """The cache arguments of a cached function (K/V caches and per-slot states), in order."""
    from ad_mlir.semantics.op_table import torch_dtype

    caches = []
    for arg, attrs in zip(fn.body.block.args, fn.arg_attrs.data, strict=True):
        if ad.CACHE_ATTR in attrs.data:
            layer, role = attrs.data[ad.CACHE_ATTR].data.rsplit(" ", 1)
            caches.append(CacheArgument(attrs.data[ad.INPUT_ATTR].data, tuple(arg.type.get_shape()),
                                        torch_dtype(arg.type.element_type), role in ad.PER_TOKEN_ROLES, layer))
    return caches
