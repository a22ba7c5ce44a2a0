"""A depthwise causal convolution over a per-slot state, the state written in place: a kernel
template (`ad.cached_causal_conv1d`).

`emit_causal_conv_module` writes a kernel module with the interface of the region kernels (a
`@triton.jit` function named as asked, `OUTPUT_DTYPES`, `output_shapes`, `launch`). The launch
takes, in the op's operand order, `x [B, C, S]` (the new tokens; any strides), `weight [C, 1, K]`,
with a bias `bias [C]`, then `state [slots, C, K - 1]`, `slots`, `starts [B]` and, in the paged
form, `query_starts [seqs + 1]` (B is 1, S every sequence's tokens, `slots`/`starts` [seqs]; all
int64, on the device: nothing is read on the host), and returns `out [B, C, S]`, contiguous.

Grid (B or seqs, cdiv(C, BLOCK_C), cdiv(L, BLOCK_R)), L the most tokens a sequence can bring (S;
in the paged form S - seqs + 1, each sequence bringing one at least: a decode step's grid is one
token block deep): a program computes a [BLOCK_R tokens, BLOCK_C channels] tile of one
sequence's outputs (`state_rows.SEQUENCE` finds its tokens; a block past them computes nothing)
as K shifted, masked loads of the inputs, each weighted by its tap in fp32: a tap that falls
before the sequence's first new token reads the slot's state (the inputs of the K - 1 tokens
before) where the sequence has a token there (position start + tap >= 0), else 0, as the
whole-sequence `conv1d` zero-pads: a sequence that starts (start 0) reads no state. Only the
first token block reads the state (BLOCK_R >= K - 1), and it is the one that writes the new
state (the last K - 1 inputs of state + new tokens) after a barrier, so no program reads a state
row another writes. Sequences must use distinct slots (the runtime's slots are; the padding rows
of a captured decode step share a scratch slot, but start at 0, so they use none of it). The
result is rounded once, at the store.
"""

from __future__ import annotations

import torch

from ad_mlir.codegen.templates.skeleton import TL_DTYPE, module_source
from ad_mlir.codegen.templates.state_rows import SEQUENCE, state_emitter, unpack_tensors
from ad_mlir.dialects import ad
from ad_mlir.dialects.kernel_forms import next_power_of_2
from ad_mlir.semantics.op_table import torch_dtype

MAX_BLOCK_C = 128
MAX_BLOCK_R = 32


def conv_blocks(channels: int, seq_len: int, kernel_size: int) -> tuple[int, int, int]:
    """(BLOCK_C, BLOCK_R, num_warps): BLOCK_R covers the K - 1 taps into the state, and a decode
    step's one token without a tile of masked rows. A tile of more than 2048 outputs takes 8
    warps: where the tokens' offset or count is not a multiple of 16 (every paged step: a
    sequence starts anywhere in the flat row) the loads and stores are not vectorized, and a
    [32, 128] tile on 4 warps spilled (255 registers at LFM2's sizes; 182 on 8)."""
    history = max(kernel_size - 1, 1)
    block_c = min(MAX_BLOCK_C, next_power_of_2(channels))
    block_r = max(next_power_of_2(history), min(MAX_BLOCK_R, next_power_of_2(seq_len)))
    return block_c, block_r, 4 if block_c * block_r <= 2048 else 8


_KERNEL = '''
@triton.jit
def {name}(x, w, bias, state, slots, starts, query_starts, out, seq_len, channels,
        x_sb, x_sc, x_st, w_sc, w_sk, st_ss, st_sc, st_sk,
        HAS_BIAS: tl.constexpr, VARLEN: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr):
{sequence}
    length = last - first
    # the sequence's first token and its slot as base pointers, so that a tile's offsets from
    # them stay 32-bit (at LFM2's sizes: 182 registers a thread, 190 with 64-bit offsets)
    x_seq = x + row * x_sb + first * x_st
    out_seq = out + row * channels * seq_len + first
    st_seq = state + slot * st_ss
    cs = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ts = tl.program_id(2) * BLOCK_R + tl.arange(0, BLOCK_R)
    c_ok = cs < channels
    rows = (ts < length)[:, None] & c_ok[None, :]
    acc = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias + cs, mask=c_ok, other=0).to(tl.float32)[None, :]
    for j in tl.static_range({kernel_size}):
        p = (ts - {history} + j)[:, None]
        tap = tl.load(w + cs * w_sc + j * w_sk, mask=c_ok, other=0).to(tl.float32)[None, :]
        xv = tl.load(x_seq + cs[None, :] * x_sc + p * x_st, mask=rows & (p >= 0), other=0)
        sv = tl.load(st_seq + cs[None, :] * st_sc + (p + {history}) * st_sk,
                     mask=rows & (p < 0) & (p + start >= 0), other=0)
        acc += (xv.to(tl.float32) + sv.to(tl.float32)) * tap
    tl.store(out_seq + cs[None, :] * seq_len + ts[:, None], acc.to({dtype}), mask=rows)
    if tl.program_id(2) == 0:
        hs = tl.arange(0, {block_h})[:, None]
        q = length - {history} + hs
        keep = (hs < {history}) & c_ok[None, :]
        new_x = tl.load(x_seq + cs[None, :] * x_sc + q * x_st, mask=keep & (q >= 0), other=0)
        old = tl.load(st_seq + cs[None, :] * st_sc + (q + {history}) * st_sk, mask=keep & (q < 0) & (q + start >= 0),
                      other=0)
        tl.debug_barrier()
        tl.store(st_seq + cs[None, :] * st_sc + hs * st_sk, new_x + old, mask=keep)

OUTPUT_DTYPES = ({torch_dtype},)


def output_shapes(tensors):
    return [tuple(tensors[0].shape)]


def launch(kernel, tensors, scalars):
    {unpack}
    batch, channels, seq_len = x.shape
    if tuple(w.shape) != (channels, 1, {kernel_size}) or tuple(state.shape[1:]) != (channels, {history}):
        raise ValueError(f"causal conv kernel for kernel size {kernel_size}: x {{tuple(x.shape)}}, weight "
                         f"{{tuple(w.shape)}}, state {{tuple(state.shape)}}")
    out = torch.empty((batch, channels, seq_len), dtype={torch_dtype}, device=x.device)
    if out.numel() == 0:
        return [out]
    sequences = slots.shape[0]
    # the most tokens a sequence can bring: in the paged form each brings one at least
    longest = seq_len - sequences + 1 if {varlen} else seq_len
    block_c, block_r, num_warps = conv_blocks(channels, longest, {kernel_size})
    kernel[(sequences, cdiv(channels, block_c), cdiv(longest, block_r))](
        x, w, bias, state, slots, starts, query_starts, out, seq_len, channels, *x.stride(), w.stride(0),
        w.stride(2), *state.stride(), HAS_BIAS={has_bias}, VARLEN={varlen}, BLOCK_C=block_c, BLOCK_R=block_r,
        num_warps=num_warps)
    return [out]
'''


def emit_causal_conv_module(kernel_size: int, dtype: torch.dtype, has_bias: bool, varlen: bool, name: str,
                            header: str) -> str:
    """The kernel file for a depthwise causal convolution of `kernel_size` taps (>= 2) over
    inputs and state of `dtype`, with or without a bias, in the paged form (`varlen`: the op's
    `query_starts`) or the slot form."""
    if kernel_size < 2:
        raise ValueError(f"the causal conv kernel needs 2 or more taps, got {kernel_size}")
    unpack = unpack_tensors(["x", "w", *(["bias"] if has_bias else [])], {} if has_bias else {"bias": "x"}, varlen)
    kernel = _KERNEL.format(
        name=name, kernel_size=kernel_size, history=kernel_size - 1, block_h=next_power_of_2(kernel_size - 1),
        dtype=TL_DTYPE[dtype], torch_dtype=str(dtype), has_bias=has_bias, varlen=varlen, unpack=unpack,
        sequence=SEQUENCE,
    )
    return module_source(header, {"ad_mlir.codegen.templates.causal_conv_kernel": ["conv_blocks"]}, [], [kernel])


def _emit(op: ad.CachedCausalConv1dOp, varlen: bool, name: str, header: str) -> str:
    return emit_causal_conv_module(op.kernel_size(), torch_dtype(op.input.type), op.bias is not None, varlen, name,
                                   header)


EMITTER = state_emitter(_emit)
