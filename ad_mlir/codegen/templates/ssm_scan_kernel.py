"""Mamba2's state-space scan over a per-slot state, the state written in place: a kernel template
(`ad.cached_ssm_scan`).

`emit_ssm_scan_module` writes a kernel module with the interface of the region kernels (a
`@triton.jit` function named as asked, `OUTPUT_DTYPES`, `output_shapes`, `launch`). The launch
takes, in the op's operand order, `x [B, S, H, P]`, `dt [B, S, H]`, `a [H]`, `b`/`c [B, S, G, N]`
(any strides: HF's splits and views of one projection), `d [H]` and `dt_bias [H]` when the op has
them, `state [slots, H, P, N]` (fp32), `slots`, `starts [B]` and, in the paged form,
`query_starts [seqs + 1]` (B is 1, S every sequence's tokens, `slots`/`starts` [seqs]; all int64,
on the device: nothing is read on the host), and returns `out [B, S, H, P]` in fp32, contiguous.

Grid (B or seqs, H, cdiv(P, BLOCK_R)): a program holds the [BLOCK_R, N] tile of one sequence's
state for one head in fp32 registers (zeros at start 0: a reused slot starts clean), runs its new
tokens (`state_rows.SEQUENCE`: its batch row's, or its range of the flat row) through the
recurrence one after the other (h = h * exp(dt a) + (dt x) B^T, y = h C + d x) and writes the tile
back at the end. This is the sequential form, the one a decode step needs and correct for a
prefill; it is not the chunked form (matmuls over chunks of tokens) that makes a long prefill fast
on a GPU. Programs share nothing: each owns its tile of the state. Sequences must use distinct
slots (the runtime's slots are; the padding rows of a captured decode step share a scratch slot,
but start at 0, so they use none of it).

The time step is computed in dt's dtype as HF computes it (dt + dt_bias, softplus, clamp, each
rounded to that dtype); softplus is log1p(exp(x)) in a form exact for small exp(x) (Triton has no
log1p), x itself above 20 as torch's threshold.
"""

from __future__ import annotations

import torch

from ad_mlir.codegen.templates.skeleton import TL_DTYPE, module_source
from ad_mlir.codegen.templates.state_rows import SEQUENCE, state_emitter, unpack_tensors
from ad_mlir.dialects import ad
from ad_mlir.dialects.kernel_forms import next_power_of_2
from ad_mlir.semantics.op_table import torch_dtype

MAX_BLOCK_R = 32
SOFTPLUS_THRESHOLD = 20.0
"""torch's softplus returns x itself above this."""


def ssm_blocks(head_dim: int, state_size: int) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_N): the whole state size in one tile, head_dim in blocks of at most 32
    (a [32, 128] fp32 tile is 32 registers a thread over 4 warps)."""
    return min(MAX_BLOCK_R, next_power_of_2(head_dim)), next_power_of_2(state_size)


_KERNEL = '''
@triton.jit
def {name}(x, dt, a, b, c, d, dt_bias, state, slots, starts, query_starts, out, seq_len,
        x_sb, x_st, x_sh, x_sp, dt_sb, dt_st, dt_sh, b_sb, b_st, b_sg, b_sn, c_sb, c_st, c_sg, c_sn,
        st_ss, st_sh, st_sp, st_sn,
        HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, STATE: tl.constexpr, HEADS_PER_GROUP: tl.constexpr,
        VARLEN: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
{sequence}
    h = tl.program_id(1)
    ps = tl.program_id(2) * BLOCK_R + tl.arange(0, BLOCK_R)
    ns = tl.arange(0, BLOCK_N)
    p_ok = ps < HEAD_DIM
    n_ok = ns < STATE
    group = h // HEADS_PER_GROUP
    tile = state + slot * st_ss + h * st_sh + ps[:, None] * st_sp + ns[None, :] * st_sn
    tile_ok = p_ok[:, None] & n_ok[None, :]
    hs = tl.where(start > 0, tl.load(tile, mask=tile_ok, other=0.0), 0.0)
    a_h = tl.load(a + h).to(tl.float32)
{per_head}
    for t in range(first, last):
        xv = tl.load(x + row * x_sb + t * x_st + h * x_sh + ps * x_sp, mask=p_ok, other=0).to(tl.float32)
        step = tl.load(dt + row * dt_sb + t * dt_st + h * dt_sh).to(tl.float32)
{time_step}
        bv = tl.load(b + row * b_sb + t * b_st + group * b_sg + ns * b_sn, mask=n_ok, other=0).to(tl.float32)
        cv = tl.load(c + row * c_sb + t * c_st + group * c_sg + ns * c_sn, mask=n_ok, other=0).to(tl.float32)
        hs = hs * tl.exp(step * a_h) + (step * xv)[:, None] * bv[None, :]
        y = tl.sum(hs * cv[None, :], axis=1){skip}
        tl.store(out + ((row * seq_len + t) * HEADS + h) * HEAD_DIM + ps, y, mask=p_ok)
    tl.store(tile, hs, mask=tile_ok)

OUTPUT_DTYPES = (torch.float32,)


def output_shapes(tensors):
    return [tuple(tensors[0].shape)]


def launch(kernel, tensors, scalars):
    {unpack}
    batch, seq_len, heads, head_dim = x.shape
    groups, state_size = b.shape[2], b.shape[3]
    if tuple(state.shape[1:]) != (heads, head_dim, state_size) or heads % groups:
        raise ValueError(f"ssm scan kernel: x {{tuple(x.shape)}}, b {{tuple(b.shape)}}, state {{tuple(state.shape)}}")
    out = torch.empty((batch, seq_len, heads, head_dim), dtype=torch.float32, device=x.device)
    if out.numel() == 0:
        return [out]
    block_r, block_n = ssm_blocks(head_dim, state_size)
    kernel[(slots.shape[0], heads, cdiv(head_dim, block_r))](
        x, dt, a, b, c, d, dt_bias, state, slots, starts, query_starts, out, seq_len, *x.stride(), *dt.stride(),
        *b.stride(), *c.stride(), *state.stride(), HEADS=heads, HEAD_DIM=head_dim, STATE=state_size,
        HEADS_PER_GROUP=heads // groups, VARLEN={varlen}, BLOCK_R=block_r, BLOCK_N=block_n, num_warps=4)
    return [out]
'''


def _round(value: str, dtype: torch.dtype) -> str:
    """`value` rounded to `dtype` and back to fp32 (a step HF computes in that dtype)."""
    return value if dtype == torch.float32 else f"{value}.to({TL_DTYPE[dtype]}).to(tl.float32)"


def _time_step(dtype: torch.dtype, has_dt_bias: bool, dt_softplus: bool, dt_min: float, dt_max: float | None) -> str:
    lines = []
    if has_dt_bias:
        lines.append(f"step = {_round('step + bias_h', dtype)}")
    if dt_softplus:
        lines += [f"e = tl.exp(tl.minimum(step, {SOFTPLUS_THRESHOLD!r}))", "w = 1.0 + e",
                  "log1p = tl.where(w == 1.0, e, tl.log(w) * e / (w - 1.0))",
                  f"step = {_round(f'tl.where(step > {SOFTPLUS_THRESHOLD!r}, step, log1p)', dtype)}"]
    clamp = f"tl.maximum(step, {float(dt_min)!r})"
    if dt_max is not None:
        clamp = f"tl.minimum({clamp}, {float(dt_max)!r})"
    lines.append(f"step = {_round(clamp, dtype)}")
    return "\n".join(" " * 8 + line for line in lines)


def emit_ssm_scan_module(dt_dtype: torch.dtype, has_d: bool, has_dt_bias: bool, dt_softplus: bool, dt_min: float,
                         dt_max: float | None, varlen: bool, name: str, header: str) -> str:
    """The kernel file for Mamba2's scan with time steps of `dt_dtype`, with or without D and
    dt_bias, softplus and the clamp [dt_min, dt_max] (x, B and C of any dtype: each load
    converts to fp32), in the paged form (`varlen`: the op's `query_starts`) or the slot form."""
    given = {"d": has_d, "dt_bias": has_dt_bias}
    unpack = unpack_tensors(["x", "dt", "a", "b", "c", *(n for n, has in given.items() if has)],
                            {n: "a" for n, has in given.items() if not has}, varlen)
    per_head = []
    if has_d:
        per_head.append("d_h = tl.load(d + h).to(tl.float32)")
    if has_dt_bias:
        per_head.append(f"bias_h = {_round('tl.load(dt_bias + h).to(tl.float32)', dt_dtype)}")
    kernel = _KERNEL.format(
        name=name, unpack=unpack, per_head="\n".join(" " * 4 + line for line in per_head) or "    pass",
        time_step=_time_step(dt_dtype, has_dt_bias, dt_softplus, dt_min, dt_max),
        skip=" + d_h * xv" if has_d else "", varlen=varlen, sequence=SEQUENCE,
    )
    return module_source(header, {"ad_mlir.codegen.templates.ssm_scan_kernel": ["ssm_blocks"]}, [], [kernel])


def _emit(op: ad.CachedSsmScanOp, varlen: bool, name: str, header: str) -> str:
    return emit_ssm_scan_module(torch_dtype(op.dt.type), op.d is not None, op.dt_bias is not None,
                                op.dt_softplus is not None, op.dt_min.value.data if op.dt_min is not None else 0.0,
                                op.dt_max.value.data if op.dt_max is not None else None, varlen, name, header)


EMITTER = state_emitter(_emit)
