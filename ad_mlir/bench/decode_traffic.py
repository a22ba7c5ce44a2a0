"""Modelled HBM bytes of one decode step of a compiled `LLM` graph, against its ideal.

The step: `batch` sequences, one new token each, each slot holding `cached` tokens. Sizes come
from the compiled `ad` module: its dynamic dim 0 is the batch, any other dynamic dim the new
tokens per row (1 in decode). Every op that launches a kernel reads each tensor operand once
and writes each result once (`bench/traffic.py`'s model, GEMMs included), except:
- a value computed from weights alone is folded at compile time and costs nothing;
- an embedding reads `batch` rows of its table, not the table;
- `ad.cached_attention` reads each row's cache up to `cached` tokens (K and V), not the whole
  cache argument, and writes the new token's K and V;
- `ad.cached_mla_attention` reads each row's latent cache up to `cached` tokens once per block
  of query heads of its kernel (`mla_blocks`), writes the new latent, and its launch writes and
  reads the absorbed query and the latent-space output ([batch, heads, rank] in fp32, each twice);
  with DeepSeek sparse attention's `selected` it reads min(k, cached + 1) latents of each row (the
  selected ones) per block of query heads, and the selection;
- `ad.cached_index_topk` reads each row's index-key cache up to `cached` tokens, writes the new
  key, and writes and reads a score per position of the slot (max_seq fp32, `torch.topk`'s input).
The ideal: every weight read once (a table shared by the embedding and the LM head, or read only
by the embedding: once, or `batch` rows), each row's K/V (MLA latent, index-key) caches read once
up to `cached` tokens (a sparse MLA's latents: the selected ones) and the new K/V (latent, index
key) written; activations, logits included, cost nothing.
"""

from __future__ import annotations

from typing import Any

from xdsl.dialects import func
from xdsl.dialects.builtin import DYNAMIC_INDEX, TensorType
from xdsl.ir import Operation, SSAValue

from ad_mlir.dialects import ad
from ad_mlir.dialects.weights import weight_only_values
from ad_mlir.frontends.fx_import import ImportedProgram
from ad_mlir.tools.report import NO_KERNEL, VIEW_OPS


def decode_bytes(value: SSAValue, batch: int) -> int:
    """Bytes of a tensor value in a decode step: dynamic dim 0 is `batch`, others 1."""
    n = 1
    for i, d in enumerate(value.type.get_shape()):
        n *= (batch if i == 0 else 1) if d == DYNAMIC_INDEX else d
    return n * max(value.type.element_type.bitwidth // 8, 1)


def _root(value: SSAValue) -> SSAValue:
    while isinstance(value.owner, VIEW_OPS):
        value = value.owner.operands[0]
    return value


def _row_bytes(cache: SSAValue) -> int:
    """One token of one slot of a [slots, max_seq, kv_heads, head_dim] cache (MLA's [slots,
    max_seq, rank + rope])."""
    _, _, *row = cache.type.get_shape()
    n = 1
    for d in row:
        n *= d
    return n * cache.type.element_type.bitwidth // 8


def _op_bytes(op: Operation, batch: int, cached: int) -> int:
    tensors = [v for v in op.operands if isinstance(v.type, TensorType)]
    written = sum(decode_bytes(r, batch) for r in op.results if isinstance(r.type, TensorType))
    if isinstance(op, ad.CachedAttentionOp):
        caches = {op.k_cache, op.v_cache, op.compressed_cache}
        new = [v for v in tensors if v not in caches and v not in (op.block_tables, op.cache_starts)]
        row = _row_bytes(op.k_cache)
        return (sum(decode_bytes(v, batch) for v in new) + 2 * batch * cached * row + 2 * batch * row + written
                + decode_bytes(op.block_tables, batch) + decode_bytes(op.cache_starts, batch)
                + _entries_bytes(op, batch, cached))
    if isinstance(op, ad.CachedMlaAttentionOp):
        return _mla_bytes(op, batch, cached, written)
    if isinstance(op, ad.CachedIndexTopkOp):
        new = sum(decode_bytes(v, batch) for v in (op.query, op.key, op.weights, op.slots, op.starts))
        row, max_seq = _row_bytes(op.cache), op.cache.type.get_shape()[1]
        return new + batch * cached * row + batch * row + 2 * batch * max_seq * 4 + written
    if isinstance(op, ad.EmbeddingOp):
        return decode_bytes(op.indices, batch) + 2 * written  # the rows read equal the rows written
    return sum(min(decode_bytes(v, batch), decode_bytes(_root(v), batch)) for v in tensors) + written


def _entries_read(op: ad.CachedAttentionOp, cached: int) -> int:
    """DeepSeek-V4's compressed entries a row's decode token reads: all of them, or the selected
    ones (none without entries)."""
    if op.compressed_cache is None:
        return 0
    return cached if op.selected is None else min(op.selected.type.get_shape()[2], cached + 1)


def _entries_bytes(op: ad.CachedAttentionOp, batch: int, cached: int) -> int:
    """The compressed entries a decode step reads and the one per row it writes."""
    if op.compressed_cache is None:
        return 0
    return batch * (_entries_read(op, cached) + 1) * _row_bytes(op.compressed_cache)


def _mla_bytes(op: ad.CachedMlaAttentionOp, batch: int, cached: int, written: int) -> int:
    from ad_mlir.codegen.templates.mla_attention_kernel import mla_blocks

    heads, _, rope, rank, _ = op.dims()
    reads = -(-heads // mla_blocks(rank, rope).block_m)
    row = _row_bytes(op.cache)
    inputs = (op.q_nope, op.q_rope, op.latent, op.k_rope, op.block_tables, op.cache_starts,
              *([op.selected] if op.selected else []))
    new = sum(decode_bytes(v, batch) for v in inputs)
    latent_space = 2 * 2 * batch * heads * rank * 4  # q W_uk and the output before W_uv: written, read
    return new + decode_bytes(op.kv_b_weight, batch) + reads * batch * _latents_read(op, cached) * row + batch * row \
        + latent_space + written


def _latents_read(op: ad.CachedMlaAttentionOp, cached: int) -> int:
    """Cached latents a row's decode token reads: all of them, or the selected ones."""
    return cached if op.selected is None else min(op.selected.type.get_shape()[2], cached + 1)


def decode_step_traffic(program: ImportedProgram, batch: int, cached: int) -> dict[str, Any]:
    """Modelled bytes of the compiled graph's decode step and of its ideal (module docstring)."""
    fn: func.FuncOp = program.function
    folded = weight_only_values(fn)
    modelled = launches = 0
    for op in fn.body.block.ops:
        results = [r for r in op.results if isinstance(r.type, TensorType)]
        if isinstance(op, NO_KERNEL) or not op.name.startswith("ad.") or not results or all(r in folded for r in results):
            continue
        if isinstance(op, ad.CastOp) and op.input.type == op.result.type:
            continue
        modelled += _op_bytes(op, batch, cached)
        launches += 1
    caches = [op for op in fn.body.block.ops if isinstance(op, ad.CachedAttentionOp)]
    latents = [op for op in fn.body.block.ops if isinstance(op, ad.CachedMlaAttentionOp)]
    indexers = [op for op in fn.body.block.ops if isinstance(op, ad.CachedIndexTopkOp)]
    entries = [op for op in caches if op.compressed_cache is not None]
    kv = sum(2 * batch * _row_bytes(op.k_cache) for op in caches) + sum(batch * _row_bytes(op.cache) for op in latents) \
        + sum(batch * _row_bytes(op.cache) for op in indexers) \
        + sum(batch * _row_bytes(op.compressed_cache) for op in entries)
    read = sum(2 * batch * _row_bytes(op.k_cache) * cached for op in caches) \
        + sum(batch * _row_bytes(op.cache) * _latents_read(op, cached) for op in latents) \
        + sum(batch * _row_bytes(op.cache) * cached for op in indexers) \
        + sum(batch * _row_bytes(op.compressed_cache) * _entries_read(op, cached) for op in entries)
    ideal = {"weights": _weight_bytes(fn, program, batch), "caches_read": read, "new_kv_written": kv}
    return {"batch": batch, "cached": cached, "launches": launches, "modelled_bytes": modelled,
            "ideal_bytes": sum(ideal.values()), **{f"ideal_{k}_bytes": v for k, v in ideal.items()},
            "ratio": modelled / sum(ideal.values())}


def _weight_bytes(fn: func.FuncOp, program: ImportedProgram, batch: int) -> int:
    """Each weight tensor once (tied ones share storage): `batch` rows of one that only
    embeddings read, else all of it."""
    sizes: dict[int, int] = {}
    for arg, attrs in zip(fn.body.block.args, fn.arg_attrs.data, strict=True):
        if ad.PARAM_ATTR not in attrs.data:
            continue
        tensor = program.weights[attrs.data[ad.PARAM_ATTR].data]
        users = [u.operation for u in arg.uses]
        full = tensor.numel() * tensor.element_size()
        read = batch * full // tensor.shape[0] if users and all(isinstance(u, ad.EmbeddingOp) for u in users) else full
        key = tensor.untyped_storage().data_ptr() if tensor.device.type != "meta" else id(tensor)
        sizes[key] = max(sizes.get(key, 0), read)
    return sum(sizes.values())
