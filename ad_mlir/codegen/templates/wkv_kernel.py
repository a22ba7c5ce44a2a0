"""RWKV's time mixing (the WKV recurrence) over a per-slot state, the state written in place: a
kernel template (`ad.cached_wkv`).

`emit_wkv_module` writes a kernel module with the interface of the region kernels (a
`@triton.jit` function named as asked, `OUTPUT_DTYPES`, `output_shapes`, `launch`). The launch
takes, in the op's operand order, `w [W]` and `u [W]` (the decay `-exp(time_decay)` and the
bonus `time_first`, contiguous), `key [B, S, W]` and `value [B, S, W]` (any strides), `state
[slots, 3, W]` (fp32: num, den and the running maximum), `slots`, `starts [B]` and, in the paged
form, `query_starts [seqs + 1]` (B is 1, S every sequence's tokens, `slots`/`starts` [seqs]; all
int64, on the device: nothing is read on the host), and returns `out [B, S, W]` in key's dtype,
contiguous.

Grid (B or seqs, cdiv(W, BLOCK_C)): a program holds BLOCK_C channels of one sequence's state in
fp32 registers (an empty state, 0, 0, -1e38, at start 0: a reused slot starts clean), runs its
new tokens (`state_rows.SEQUENCE`) through HF's step one after the other (q = max(p, u + k),
y = (e^(p-q) num + e^(u+k-q) v) / (e^(p-q) den + e^(u+k-q)); p' = max(p + w, k), num and den
decayed by e^(p+w-p') plus e^(k-p') v and e^(k-p')), storing each y in key's dtype, and writes
the state back at the end: the sequential form (not a parallel scan over a long prefill).
Channels are independent, so programs share nothing; sequences must use distinct slots.
"""

from __future__ import annotations

import torch

from ad_mlir.codegen.templates.skeleton import module_source
from ad_mlir.codegen.templates.state_rows import SEQUENCE, state_emitter, unpack_tensors
from ad_mlir.dialects import ad
from ad_mlir.dialects.kernel_forms import next_power_of_2
from ad_mlir.semantics.op_table import torch_dtype

MAX_BLOCK = 256
"""Channels a program holds: 2 fp32 registers a thread over 4 warps for each of num, den, p, w, u,
k and v."""


def wkv_block(width: int) -> int:
    """BLOCK_C: the channels of one program, a power of two of at most `MAX_BLOCK`."""
    return min(MAX_BLOCK, next_power_of_2(width))


_KERNEL = '''
@triton.jit
def {name}(w, u, k, v, state, slots, starts, query_starts, out, seq_len, k_sb, k_st, k_sw, v_sb, v_st, v_sw,
        st_ss, st_sp, st_sw, WIDTH: tl.constexpr, VARLEN: tl.constexpr, BLOCK_C: tl.constexpr):
{sequence}
    ws = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = ws < WIDTH
    wv = tl.load(w + ws, mask=ok, other=0).to(tl.float32)
    uv = tl.load(u + ws, mask=ok, other=0).to(tl.float32)
    cell = state + slot * st_ss + ws * st_sw
    num = tl.where(start > 0, tl.load(cell, mask=ok, other=0.0), 0.0)
    den = tl.where(start > 0, tl.load(cell + st_sp, mask=ok, other=0.0), 0.0)
    top = tl.where(start > 0, tl.load(cell + 2 * st_sp, mask=ok, other=-1e38), -1e38)
    for t in range(first, last):
        kv = tl.load(k + row * k_sb + t * k_st + ws * k_sw, mask=ok, other=0).to(tl.float32)
        vv = tl.load(v + row * v_sb + t * v_st + ws * v_sw, mask=ok, other=0).to(tl.float32)
        q = tl.maximum(top, kv + uv)
        e1 = tl.exp(top - q)
        e2 = tl.exp(kv + uv - q)
        tl.store(out + (row * seq_len + t) * WIDTH + ws, (e1 * num + e2 * vv) / (e1 * den + e2), mask=ok)
        q = tl.maximum(top + wv, kv)
        e1 = tl.exp(top + wv - q)
        e2 = tl.exp(kv - q)
        num = e1 * num + e2 * vv
        den = e1 * den + e2
        top = q
    tl.store(cell, num, mask=ok)
    tl.store(cell + st_sp, den, mask=ok)
    tl.store(cell + 2 * st_sp, top, mask=ok)

OUTPUT_DTYPES = ({out_dtype},)


def output_shapes(tensors):
    return [tuple(tensors[2].shape)]


def launch(kernel, tensors, scalars):
    {unpack}
    batch, seq_len, width = k.shape
    if tuple(v.shape) != (batch, seq_len, width) or tuple(state.shape[1:]) != (3, width) \\
            or tuple(w.shape) != (width,) or tuple(u.shape) != (width,):
        raise ValueError(f"WKV kernel: w {{tuple(w.shape)}}, u {{tuple(u.shape)}}, k {{tuple(k.shape)}}, "
                         f"v {{tuple(v.shape)}}, state {{tuple(state.shape)}}")
    out = torch.empty((batch, seq_len, width), dtype={out_dtype}, device=k.device)
    if out.numel() == 0:
        return [out]
    block = wkv_block(width)
    kernel[(slots.shape[0], cdiv(width, block))](
        w.contiguous(), u.contiguous(), k, v, state, slots, starts, query_starts, out, seq_len, *k.stride(),
        *v.stride(), *state.stride(), WIDTH=width, VARLEN={varlen}, BLOCK_C=block, num_warps=4)
    return [out]
'''


def emit_wkv_module(dtype: torch.dtype, varlen: bool, name: str, header: str) -> str:
    """The kernel file for the WKV recurrence over keys of `dtype` (its output's; w, u and the
    values of any dtype: each load converts to fp32), in the paged form (`varlen`: the op's
    `query_starts`) or the slot form."""
    kernel = _KERNEL.format(name=name, out_dtype=str(dtype), varlen=varlen, sequence=SEQUENCE,
                            unpack=unpack_tensors(["w", "u", "k", "v"], {}, varlen))
    return module_source(header, {"ad_mlir.codegen.templates.wkv_kernel": ["wkv_block"]}, [], [kernel])


def _emit(op: ad.CachedWkvOp, varlen: bool, name: str, header: str) -> str:
    return emit_wkv_module(torch_dtype(op.key.type), varlen, name, header)


EMITTER = state_emitter(_emit)
