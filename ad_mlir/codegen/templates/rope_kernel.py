"""RoPE on a query and a key in one kernel: a template, emitted as Python source.

`emit_rope_module` writes a kernel module with the interface of the region kernels (a
`@triton.jit` function named as asked, `OUTPUT_DTYPES`, `output_shapes`, `launch`).

The launch takes `q [B, Hq, S, D]`, `k [B, Hk, S, D]`, `cos`, `sin [Bc, S, R]` (any strides;
a size-1 dim is read with stride 0, so a batch-1 table broadcasts; R <= D the rotary dim) and
returns the rotated `q` and `k`, contiguous. One program takes one token (batch, position) and
BLOCK_R of the Hq + Hk heads, query heads first, as a [BLOCK_R, BLOCK_C] tile (D padded to a
power of two, masked): it loads that token's cos/sin row once for all of them, loads each head's
row and each rotated dim's partner (rotate_half: dim `(d + R/2) % R`, negated in the first half;
interleaved pairs: dim `d ^ 1`, negated at even d), and stores `x * cos + rotate(x) * sin` on
the first R dims and x on the rest, computed in fp32 and rounded once at the store (HF rounds
after each op in the model dtype: a bf16 ulp apart).
"""

from __future__ import annotations

import torch

from ad_mlir.codegen.emitters import KernelEmitter
from ad_mlir.codegen.templates.attention_kernel import rotary_dim_of
from ad_mlir.codegen.templates.skeleton import TL_DTYPE, module_source
from ad_mlir.dialects import ad
from ad_mlir.dialects.kernel_forms import next_power_of_2
from ad_mlir.semantics.op_table import torch_dtype

MAX_TILE = 4096
"""Elements of a program's [BLOCK_R, D] tile (4096: 16 fp32 registers a thread at 4 warps)."""


def rope_blocks(heads: int, head_dim: int) -> tuple[int, int]:
    """(BLOCK_R, num_warps) for `heads` query + key heads of `head_dim`."""
    block_h = min(next_power_of_2(max(heads, 1)), max(1, MAX_TILE // head_dim))
    return block_h, 4 if block_h * head_dim >= 1024 else 1


_KERNEL = '''
@triton.jit
def {name}(q, k, cos, sin, q_out, k_out, seq_len, n_q, n_k,
        q_sb, q_sh, q_ss, q_sd, k_sb, k_sh, k_ss, k_sd, c_sb, c_ss, c_sd, s_sb, s_ss, s_sd,
        BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    b = token // seq_len
    s = token % seq_len
    heads = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]
    dims = tl.arange(0, BLOCK_C)[None, :]
    rotated = dims < {rotary}
    partner = {partner}
    sign = tl.where({negated}, -1.0, 1.0)
    c = tl.load(cos + b * c_sb + s * c_ss + dims * c_sd, mask=rotated, other=0).to(tl.float32)
    sn = tl.load(sin + b * s_sb + s * s_ss + dims * s_sd, mask=rotated, other=0).to(tl.float32)
    is_q = (heads < n_q) & (dims < {head_dim})
    is_k = (heads >= n_q) & (heads < n_q + n_k) & (dims < {head_dim})
    q_row = q + b * q_sb + heads * q_sh + s * q_ss
    k_row = k + b * k_sb + (heads - n_q) * k_sh + s * k_ss
    x = tl.load(q_row + dims * q_sd, mask=is_q, other=0).to(tl.float32)
    x += tl.load(k_row + dims * k_sd, mask=is_k, other=0).to(tl.float32)
    x_rot = tl.load(q_row + partner * q_sd, mask=is_q & rotated, other=0).to(tl.float32)
    x_rot += tl.load(k_row + partner * k_sd, mask=is_k & rotated, other=0).to(tl.float32)
    y = tl.where(rotated, x * c + sign * x_rot * sn, x)
    tl.store(q_out + ((b * n_q + heads) * seq_len + s) * {head_dim} + dims, y.to({q_dtype}), mask=is_q)
    tl.store(k_out + ((b * n_k + heads - n_q) * seq_len + s) * {head_dim} + dims, y.to({k_dtype}), mask=is_k)


OUTPUT_DTYPES = ({q_torch}, {k_torch})


def output_shapes(tensors):
    return [tuple(tensors[0].shape), tuple(tensors[1].shape)]


def _strides(t):
    """A size-1 dim is read with stride 0: it broadcasts (a cos/sin table of batch 1)."""
    return [0 if size == 1 else stride for size, stride in zip(t.shape, t.stride())]


def launch(kernel, tensors, scalars):
    q, k, cos, sin = tensors
    batch, n_q, seq_len, head_dim = q.shape
    n_k = k.shape[1]
    if head_dim != {head_dim} or k.shape[3] != {head_dim} or cos.shape[-1] != {rotary}:
        raise ValueError(f"rope kernel for head_dim {head_dim}, rotary_dim {rotary}: q {{tuple(q.shape)}}, "
                         f"k {{tuple(k.shape)}}, cos {{tuple(cos.shape)}}")
    outs = [torch.empty(s, dtype=d, device=q.device) for s, d in zip(output_shapes(tensors), OUTPUT_DTYPES)]
    if batch * seq_len == 0:
        return outs
    block_h, num_warps = rope_blocks(n_q + n_k, {head_p})
    kernel[(batch * seq_len, cdiv(n_q + n_k, block_h))](
        q, k, cos, sin, outs[0], outs[1], seq_len, n_q, n_k,
        *_strides(q), *_strides(k), *_strides(cos), *_strides(sin),
        BLOCK_R=block_h, BLOCK_C={head_p}, num_warps=num_warps, enable_fp_fusion=True,
    )
    return outs
'''


def emit_rope_module(head_dim: int, q_dtype: torch.dtype, k_dtype: torch.dtype, name: str, header: str,
                     rotary_dim: int | None = None, interleaved: bool = False) -> str:
    """The kernel file for RoPE on the first `rotary_dim` (even; None: all) of `head_dim` dims of
    q and k of these dtypes, in HF's rotate_half form or on `interleaved` pairs."""
    rotary = head_dim if rotary_dim is None else rotary_dim
    if rotary < 2 or rotary % 2 or rotary > head_dim:
        raise ValueError(f"the rope kernel needs an even rotary_dim in 2..head_dim {head_dim}, got {rotary}")
    half = rotary // 2
    kernel = _KERNEL.format(
        name=name, head_dim=head_dim, head_p=next_power_of_2(head_dim), rotary=rotary,
        partner="dims ^ 1" if interleaved else f"tl.where(dims < {half}, dims + {half}, dims - {half})",
        negated="dims % 2 == 0" if interleaved else f"dims < {half}",
        q_dtype=TL_DTYPE[q_dtype], k_dtype=TL_DTYPE[k_dtype], q_torch=str(q_dtype), k_torch=str(k_dtype),
    )
    return module_source(header, {"ad_mlir.codegen.templates.rope_kernel": ["rope_blocks"]}, [], [kernel])


def _emit(op: ad.RopeOp, name: str, header: str) -> str:
    return emit_rope_module(op.query.type.get_shape()[3], torch_dtype(op.query.type), torch_dtype(op.key.type), name,
                            header, rotary_dim_of(op), op.interleaved is not None)


EMITTER = KernelEmitter(_emit)
