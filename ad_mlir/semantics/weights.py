"""The value of a weight argument on a tensor-parallel rank: the weight itself, or the rank's
slice of a sharded weight (`ad.shard_dim`, `ad.shard_chunks`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from xdsl.dialects.builtin import DictionaryAttr
from xdsl.ir import Attribute

from ad_mlir.dialects import ad
from ad_mlir.dialects.weights import weight_of


@dataclass(frozen=True)
class Rank:
    """Which tensor-parallel rank a graph is built or run for."""

    rank: int = 0
    world_size: int = 1


SINGLE_RANK = Rank()
"""No tensor parallelism."""


class ShardError(ValueError):
    """A sharded weight argument whose shard does not fit the weight and the world size."""


def rank_weight(tensor: torch.Tensor, arg_type: Attribute, arg_attrs: DictionaryAttr, rank: Rank) -> torch.Tensor:
    """The value of a weight argument on `rank`: the weight itself, or for a shard
    (`ad.shard_dim`) the rank's contiguous slice of the argument's local size (of each chunk,
    with `ad.shard_chunks`)."""
    if ad.SHARD_DIM_ATTR not in arg_attrs.data:
        return tensor
    dim = arg_attrs.data[ad.SHARD_DIM_ATTR].value.data
    local = arg_type.get_shape()[dim]
    if tensor.shape[dim] != local * rank.world_size:
        fqn = weight_of(arg_attrs)[1]
        raise ShardError(
            f"weight '{fqn}' has {tensor.shape[dim]} along dim {dim}, but its shard of {local} on each of "
            f"{rank.world_size} ranks covers {local * rank.world_size}"
        )
    if ad.SHARD_CHUNKS_ATTR not in arg_attrs.data:
        return tensor.narrow(dim, rank.rank * local, local).contiguous()
    chunks = arg_attrs.data[ad.SHARD_CHUNKS_ATTR].value.data
    part = local // chunks
    return torch.cat([c.narrow(dim, rank.rank * part, part) for c in tensor.chunk(chunks, dim)], dim)
