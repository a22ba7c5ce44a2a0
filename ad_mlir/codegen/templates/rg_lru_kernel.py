"""RecurrentGemma's RG-LRU recurrence over a per-slot state, the state written in place: a kernel
template (`ad.cached_rg_lru`).

`emit_rg_lru_module` writes a kernel module with the interface of the region kernels (a
`@triton.jit` function named as asked, `OUTPUT_DTYPES`, `output_shapes`, `launch`). The launch
takes, in the op's operand order, `x [B, S, W]` and `a [B, S, W]` (any strides), `state [slots,
W]` (fp32), `slots`, `starts [B]` (int64, on the device: nothing is read on the host), and
returns `out [B, S, W]` in x's dtype, contiguous.

Grid (B, cdiv(W, BLOCK_C)): a program holds BLOCK_C channels of one row's state in fp32 registers
(zeros at start 0: a reused slot starts clean), runs the new tokens through h = a_t h + x_t one
after the other, storing each h in x's dtype, and writes the state back at the end: the
sequential form, what a decode step needs and correct for a prefill (not the parallel scan that
makes a long prefill fast on a GPU). Channels are independent, so programs share nothing; rows
must use distinct slots (the runtime's slots are).
"""

from __future__ import annotations

import torch

from ad_mlir.codegen.templates.by_sequence import state_emitter
from ad_mlir.codegen.templates.skeleton import module_source
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
def {name}(x, a, state, slots, starts, out, seq_len, x_sb, x_st, x_sw, a_sb, a_st, a_sw, st_ss, st_sw,
        WIDTH: tl.constexpr, BLOCK_C: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    ws = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = ws < WIDTH
    slot = tl.load(slots + row)
    start = tl.load(starts + row)
    cell = state + slot * st_ss + ws * st_sw
    h = tl.where(start > 0, tl.load(cell, mask=ok, other=0.0), 0.0)
    for t in range(seq_len):
        xv = tl.load(x + row * x_sb + t * x_st + ws * x_sw, mask=ok, other=0).to(tl.float32)
        av = tl.load(a + row * a_sb + t * a_st + ws * a_sw, mask=ok, other=0).to(tl.float32)
        h = av * h + xv
        tl.store(out + (row * seq_len + t) * WIDTH + ws, h, mask=ok)
    tl.store(cell, h, mask=ok)

OUTPUT_DTYPES = ({out_dtype},)


def output_shapes(tensors):
    return [tuple(tensors[0].shape)]


def launch(kernel, tensors, scalars):
    x, a, state, slots, starts = tensors
    batch, seq_len, width = x.shape
    if tuple(a.shape) != (batch, seq_len, width) or tuple(state.shape[1:]) != (width,):
        raise ValueError(f"RG-LRU kernel: x {{tuple(x.shape)}}, a {{tuple(a.shape)}}, state {{tuple(state.shape)}}")
    out = torch.empty((batch, seq_len, width), dtype={out_dtype}, device=x.device)
    if out.numel() == 0:
        return [out]
    block = rg_lru_block(width)
    kernel[(batch, triton.cdiv(width, block))](
        x, a, state, slots, starts, out, seq_len, *x.stride(), *a.stride(), *state.stride(), WIDTH=width,
        BLOCK_C=block, num_warps=4)
    return [out]
'''


def emit_rg_lru_module(dtype: torch.dtype, name: str, header: str) -> str:
    """The kernel file for the RG-LRU over x of `dtype` (its output's; a of any dtype: each load
    converts to fp32)."""
    kernel = _KERNEL.format(name=name, out_dtype=str(dtype))
    return module_source(header, {"ad_mlir.codegen.templates.rg_lru_kernel": ["rg_lru_block"]}, [], [kernel])


def _emit(op: ad.CachedRgLruOp, name: str, header: str) -> str:
    return emit_rg_lru_module(torch_dtype(op.input.type), name, header)


EMITTER = state_emitter(_emit, lambda op: [op.input, op.a], axis=1)
