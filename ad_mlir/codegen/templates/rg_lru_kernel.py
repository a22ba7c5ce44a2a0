"""RecurrentGemma's RG-LRU recurrence over a per-slot state, the state written in place: a kernel
template (`ad.cached_rg_lru`).

`emit_rg_lru_module` writes a kernel module with the interface of the region kernels (a
`@triton.jit` function named as asked, `OUTPUT_DTYPES`, `output_shapes`, `launch`). The launch
takes, in the op's operand order, `x [B, S, W]` and `a [B, S, W]` (any strides), `state [slots,
W]` (fp32), `slots`, `starts [B]` and, in the paged form, `query_starts [seqs + 1]` (B is 1, S
every sequence's tokens, `slots`/`starts` [seqs]; all int64, on the device: nothing is read on
the host), and returns `out [B, S, W]` in x's dtype, contiguous.

Grid (B or seqs, cdiv(W, BLOCK_C)): a program holds BLOCK_C channels of one sequence's state in
fp32 registers (zeros at start 0: a reused slot starts clean), runs its new tokens
(`state_rows.SEQUENCE`) through h = a_t h + x_t one after the other, storing each h in x's
dtype, and writes the state back at the end: the sequential form, what a decode step needs and
correct for a prefill (not the parallel scan that makes a long prefill fast on a GPU). Channels
are independent, so programs share nothing; sequences must use distinct slots (the runtime's
slots are; the padding rows of a captured decode step share a scratch slot, but start at 0, so
they use none of it).
"""

from __future__ import annotations

import torch

from ad_mlir.codegen.templates.skeleton import module_source
from ad_mlir.codegen.templates.state_rows import SEQUENCE, state_emitter, unpack_tensors
from ad_mlir.dialects import ad
from ad_mlir.dialects.kernel_forms import next_power_of_2
from ad_mlir.semantics.op_table import torch_dtype

MAX_BLOCK = 256
"""Channels a program holds: 2 fp32 registers a thread over 4 warps for each of h, x and a."""


def rg_lru_block(width: int) -> int:
    """BLOCK_C: the channels of one program, a power of two of at most `MAX_BLOCK`."""
    return min(MAX_BLOCK, next_power_of_2(width))


_KERNEL = '''
@triton.jit
def {name}(x, a, state, slots, starts, query_starts, out, seq_len, x_sb, x_st, x_sw, a_sb, a_st, a_sw, st_ss,
        st_sw, WIDTH: tl.constexpr, VARLEN: tl.constexpr, BLOCK_C: tl.constexpr):
{sequence}
    ws = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = ws < WIDTH
    cell = state + slot * st_ss + ws * st_sw
    h = tl.where(start > 0, tl.load(cell, mask=ok, other=0.0), 0.0)
    for t in range(first, last):
        xv = tl.load(x + row * x_sb + t * x_st + ws * x_sw, mask=ok, other=0).to(tl.float32)
        av = tl.load(a + row * a_sb + t * a_st + ws * a_sw, mask=ok, other=0).to(tl.float32)
        h = av * h + xv
        tl.store(out + (row * seq_len + t) * WIDTH + ws, h, mask=ok)
    tl.store(cell, h, mask=ok)

OUTPUT_DTYPES = ({out_dtype},)


def output_shapes(tensors):
    return [tuple(tensors[0].shape)]


def launch(kernel, tensors, scalars):
    {unpack}
    batch, seq_len, width = x.shape
    if tuple(a.shape) != (batch, seq_len, width) or tuple(state.shape[1:]) != (width,):
        raise ValueError(f"RG-LRU kernel: x {{tuple(x.shape)}}, a {{tuple(a.shape)}}, state {{tuple(state.shape)}}")
    out = torch.empty((batch, seq_len, width), dtype={out_dtype}, device=x.device)
    if out.numel() == 0:
        return [out]
    block = rg_lru_block(width)
    kernel[(slots.shape[0], cdiv(width, block))](
        x, a, state, slots, starts, query_starts, out, seq_len, *x.stride(), *a.stride(), *state.stride(),
        WIDTH=width, VARLEN={varlen}, BLOCK_C=block, num_warps=4)
    return [out]
'''


def emit_rg_lru_module(dtype: torch.dtype, varlen: bool, name: str, header: str) -> str:
    """The kernel file for the RG-LRU over x of `dtype` (its output's; a of any dtype: each load
    converts to fp32), in the paged form (`varlen`: the op's `query_starts`) or the slot form."""
    kernel = _KERNEL.format(name=name, out_dtype=str(dtype), varlen=varlen, sequence=SEQUENCE,
                            unpack=unpack_tensors(["x", "a"], {}, varlen))
    return module_source(header, {"ad_mlir.codegen.templates.rg_lru_kernel": ["rg_lru_block"]}, [], [kernel])


def _emit(op: ad.CachedRgLruOp, varlen: bool, name: str, header: str) -> str:
    return emit_rg_lru_module(torch_dtype(op.input.type), varlen, name, header)


EMITTER = state_emitter(_emit)
