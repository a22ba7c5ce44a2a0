"""Mamba1's selective scan over a per-slot state, the state written in place: a kernel template
(`ad.cached_selective_scan`).

`emit_selective_scan_module` writes a kernel module with the interface of the region kernels (a
`@triton.jit` function named as asked, `OUTPUT_DTYPES`, `output_shapes`, `launch`). The launch
takes, in the op's operand order, `x [B, D, S]`, `dt [B, D, S]`, `a [D, N]`, `b`/`c [B, N, S]`
(any strides: HF's transposes and splits of one projection), `d [D]`, `z [B, D, S]` and
`dt_bias [D]` when the op has them, `state [slots, D, N]` (fp32), `slots`, `starts [B]` and, in
the paged form, `query_starts [seqs + 1]` (B is 1, S every sequence's tokens, `slots`/`starts`
[seqs]; all int64, on the device: nothing is read on the host), and returns `out [B, D, S]` in
x's dtype promoted by d's, contiguous.

Grid (B or seqs, cdiv(D, BLOCK_R)): a program holds the [BLOCK_R, N] tile of one sequence's state
in fp32 registers (zeros at start 0: a reused slot starts clean), runs its new tokens
(`state_rows.SEQUENCE`) through the
recurrence one after the other (h = h * exp(dt a) + (dt x) B^T, y = (h C + d x) silu(z)) and
writes the tile back at the end: the sequential form, what a decode step needs and correct for a
prefill (not the parallel scan that makes a long prefill fast on a GPU). Programs share nothing;
sequences must use distinct slots (the runtime's slots are; the padding rows of a captured decode
step share a scratch slot, but start at 0, so they use none of it). The time step is computed in dt's dtype as
HF computes it (dt + dt_bias, softplus, each rounded to that dtype).
"""

from __future__ import annotations

import torch

from ad_mlir.codegen.templates.skeleton import module_source
from ad_mlir.codegen.templates.ssm_scan_kernel import SOFTPLUS_THRESHOLD, _round
from ad_mlir.codegen.templates.state_rows import SEQUENCE, state_emitter, unpack_tensors
from ad_mlir.dialects import ad
from ad_mlir.dialects.kernel_forms import next_power_of_2
from ad_mlir.semantics.op_table import torch_dtype

MAX_BLOCK_ROWS = 64


def selective_scan_blocks(channels: int, state_size: int) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_N): the whole state size in one tile, channels (the rows) in blocks of at most 64
    (Mamba's state size is 16: a [64, 16] fp32 tile is 8 registers a thread over 4 warps)."""
    return min(MAX_BLOCK_ROWS, next_power_of_2(channels)), next_power_of_2(state_size)


_KERNEL = '''
@triton.jit
def {name}(x, dt, a, b, c, d, z, dt_bias, state, slots, starts, query_starts, out, seq_len,
        x_sb, x_sd, x_st, dt_sb, dt_sd, dt_st, a_sd, a_sn, b_sb, b_sn, b_st, c_sb, c_sn, c_st, z_sb, z_sd, z_st,
        st_ss, st_sd, st_sn,
        CHANNELS: tl.constexpr, STATE: tl.constexpr, VARLEN: tl.constexpr, BLOCK_R: tl.constexpr,
        BLOCK_N: tl.constexpr):
{sequence}
    ds = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    ns = tl.arange(0, BLOCK_N)
    d_ok = ds < CHANNELS
    n_ok = ns < STATE
    tile_ok = d_ok[:, None] & n_ok[None, :]
    tile = state + slot * st_ss + ds[:, None] * st_sd + ns[None, :] * st_sn
    hs = tl.where(start > 0, tl.load(tile, mask=tile_ok, other=0.0), 0.0)
    a_t = tl.load(a + ds[:, None] * a_sd + ns[None, :] * a_sn, mask=tile_ok, other=0).to(tl.float32)
{per_channel}
    for t in range(first, last):
        xv = tl.load(x + row * x_sb + ds * x_sd + t * x_st, mask=d_ok, other=0).to(tl.float32)
        step = tl.load(dt + row * dt_sb + ds * dt_sd + t * dt_st, mask=d_ok, other=0).to(tl.float32)
{time_step}
        bv = tl.load(b + row * b_sb + ns * b_sn + t * b_st, mask=n_ok, other=0).to(tl.float32)
        cv = tl.load(c + row * c_sb + ns * c_sn + t * c_st, mask=n_ok, other=0).to(tl.float32)
        hs = hs * tl.exp(step[:, None] * a_t) + (step * xv)[:, None] * bv[None, :]
        y = tl.sum(hs * cv[None, :], axis=1){skip}{gate}
        tl.store(out + (row * CHANNELS + ds) * seq_len + t, y, mask=d_ok)
    tl.store(tile, hs, mask=tile_ok)

OUTPUT_DTYPES = ({out_dtype},)


def output_shapes(tensors):
    return [tuple(tensors[0].shape)]


def launch(kernel, tensors, scalars):
    {unpack}
    batch, channels, seq_len = x.shape
    state_size = a.shape[1]
    if tuple(state.shape[1:]) != (channels, state_size) or tuple(b.shape) != (batch, state_size, seq_len):
        raise ValueError(f"selective scan kernel: x {{tuple(x.shape)}}, b {{tuple(b.shape)}}, state {{tuple(state.shape)}}")
    out = torch.empty((batch, channels, seq_len), dtype={out_dtype}, device=x.device)
    if out.numel() == 0:
        return [out]
    block_d, block_n = selective_scan_blocks(channels, state_size)
    kernel[(slots.shape[0], cdiv(channels, block_d))](
        x, dt, a, b, c, d, z, dt_bias, state, slots, starts, query_starts, out, seq_len, *x.stride(), *dt.stride(),
        *a.stride(), *b.stride(), *c.stride(), *z.stride(), *state.stride(), CHANNELS=channels, STATE=state_size,
        VARLEN={varlen}, BLOCK_R=block_d, BLOCK_N=block_n, num_warps=4)
    return [out]
'''


def _time_step(dtype: torch.dtype, has_dt_bias: bool, dt_softplus: bool) -> str:
    lines = []
    if has_dt_bias:
        lines.append(f"step = {_round('step + bias_d', dtype)}")
    if dt_softplus:
        lines += [f"e = tl.exp(tl.minimum(step, {SOFTPLUS_THRESHOLD!r}))", "w = 1.0 + e",
                  "log1p = tl.where(w == 1.0, e, tl.log(w) * e / (w - 1.0))",
                  f"step = {_round(f'tl.where(step > {SOFTPLUS_THRESHOLD!r}, step, log1p)', dtype)}"]
    return "\n".join(" " * 8 + line for line in lines) or " " * 8 + "pass"


def emit_selective_scan_module(dt_dtype: torch.dtype, out_dtype: torch.dtype, has_d: bool, has_z: bool,
                               has_dt_bias: bool, dt_softplus: bool, varlen: bool, name: str, header: str) -> str:
    """The kernel file for Mamba1's scan with time steps of `dt_dtype` and an output of
    `out_dtype`, with or without D, the gate z and dt_bias, and softplus (x, B, C and z of any
    dtype: each load converts to fp32), in the paged form (`varlen`: the op's `query_starts`) or
    the slot form."""
    given = {"d": (has_d, "a"), "z": (has_z, "x"), "dt_bias": (has_dt_bias, "a")}
    unpack = unpack_tensors(["x", "dt", "a", "b", "c", *(n for n, (has, _) in given.items() if has)],
                            {n: stand_in for n, (has, stand_in) in given.items() if not has}, varlen)
    per_channel = []
    if has_d:
        per_channel.append("d_d = tl.load(d + ds, mask=d_ok, other=0).to(tl.float32)")
    if has_dt_bias:
        per_channel.append(f"bias_d = {_round('tl.load(dt_bias + ds, mask=d_ok, other=0).to(tl.float32)', dt_dtype)}")
    gate = ""
    if has_z:
        gate = ("\n        zv = tl.load(z + row * z_sb + ds * z_sd + t * z_st, mask=d_ok, other=0).to(tl.float32)"
                "\n        y = y * (zv / (1.0 + tl.exp(-zv)))")
    kernel = _KERNEL.format(
        name=name, unpack=unpack, per_channel="\n".join(" " * 4 + line for line in per_channel) or "    pass",
        time_step=_time_step(dt_dtype, has_dt_bias, dt_softplus), skip=" + d_d * xv" if has_d else "", gate=gate,
        out_dtype=str(out_dtype), varlen=varlen, sequence=SEQUENCE)
    return module_source(header, {"ad_mlir.codegen.templates.selective_scan_kernel": ["selective_scan_blocks"]}, [], [kernel])


def _emit(op: ad.CachedSelectiveScanOp, varlen: bool, name: str, header: str) -> str:
    return emit_selective_scan_module(torch_dtype(op.dt.type), torch_dtype(op.result.type), op.d is not None,
                                      op.z is not None, op.dt_bias is not None, op.dt_softplus is not None, varlen,
                                      name, header)


EMITTER = state_emitter(_emit)
