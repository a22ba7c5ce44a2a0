"""The gated delta rule over a per-slot state, the state written in place: a kernel template
(`ad.cached_gated_delta_rule`).

`emit_gated_delta_rule_module` writes a kernel module with the interface of the region kernels
(a `@triton.jit` function named as asked, `OUTPUT_DTYPES`, `output_shapes`, `launch`). The launch
takes, in the op's operand order, `query`/`key [B, S, HK, K]`, `value [B, S, HV, V]`, `g`/`beta
[B, S, HV]` (any strides: HF's splits and views), `state [slots, HV, K, V]` (fp32), `slots`,
`starts [B]` and, in the paged form, `query_starts [seqs + 1]` (B is 1, S every sequence's tokens,
`slots`/`starts` [seqs]; all int64, on the device: nothing is read on the host), and returns
`out [B, S, HV, V]` in the query's dtype, contiguous.

Grid (B or seqs, HV, cdiv(V, BLOCK_C)): a program holds the [K, BLOCK_C] tile of one sequence's
state for one value head in fp32 registers (zeros at start 0: a reused slot starts clean), runs its
new tokens (`state_rows.SEQUENCE`) through the recurrence one after the other (HF's
`torch_recurrent_gated_delta_rule`: decay by exp(g), read k^T S, write k (beta (v - k^T S))^T,
output q^T S, q and k L2-normalized over the whole key dim first when asked, q scaled by K^-0.5)
and writes the tile back at the end. This is the sequential form, the one a decode step needs and
correct for a prefill; it is not the chunked form (the UT transform over chunks of tokens) that
makes a long prefill fast on a GPU. Programs share nothing: each owns its tile of the state.
Sequences must use distinct slots (the runtime's slots are; the padding rows of a captured decode
step share a scratch slot, but start at 0, so they use none of it)."""

from __future__ import annotations

import torch

from ad_mlir.codegen.templates.skeleton import TL_DTYPE, module_source
from ad_mlir.codegen.templates.state_rows import SEQUENCE, state_emitter, unpack_tensors
from ad_mlir.dialects import ad
from ad_mlir.dialects.kernel_forms import next_power_of_2
from ad_mlir.semantics.op_table import torch_dtype
from ad_mlir.semantics.torch_ops import L2NORM_EPS

MAX_BLOCK_C = 32


def delta_rule_blocks(k_dim: int, v_dim: int) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_C): the whole key dim in one tile (the L2 norm and k^T S need all of it),
    the value dim in blocks of at most 32 (a [128, 32] fp32 tile is 32 registers a thread over 4
    warps)."""
    return next_power_of_2(k_dim), min(MAX_BLOCK_C, next_power_of_2(v_dim))


_KERNEL = '''
@triton.jit
def {name}(q, k, v, g, beta, state, slots, starts, query_starts, out, seq_len,
        q_sb, q_st, q_sh, q_sk, k_sb, k_st, k_sh, k_sk, v_sb, v_st, v_sh, v_sv, g_sb, g_st, g_sh,
        be_sb, be_st, be_sh, st_ss, st_sh, st_sk, st_sv,
        V_HEADS: tl.constexpr, K_DIM: tl.constexpr, V_DIM: tl.constexpr, GROUPS: tl.constexpr,
        VARLEN: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
{sequence}
    hv = tl.program_id(1)
    vs = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    ks = tl.arange(0, BLOCK_R)
    k_ok = ks < K_DIM
    v_ok = vs < V_DIM
    hk = hv // GROUPS
    tile = state + slot * st_ss + hv * st_sh + ks[:, None] * st_sk + vs[None, :] * st_sv
    tile_ok = k_ok[:, None] & v_ok[None, :]
    s = tl.where(start > 0, tl.load(tile, mask=tile_ok, other=0.0), 0.0)
    for t in range(first, last):
        qv = tl.load(q + row * q_sb + t * q_st + hk * q_sh + ks * q_sk, mask=k_ok, other=0).to(tl.float32)
        kv = tl.load(k + row * k_sb + t * k_st + hk * k_sh + ks * k_sk, mask=k_ok, other=0).to(tl.float32)
{l2norm}
        qv = qv * {scale!r}
        vv = tl.load(v + row * v_sb + t * v_st + hv * v_sh + vs * v_sv, mask=v_ok, other=0).to(tl.float32)
        decay = tl.exp(tl.load(g + row * g_sb + t * g_st + hv * g_sh).to(tl.float32))
        strength = tl.load(beta + row * be_sb + t * be_st + hv * be_sh).to(tl.float32)
        s = s * decay
        delta = (vv - tl.sum(s * kv[:, None], axis=0)) * strength
        s = s + kv[:, None] * delta[None, :]
        o = tl.sum(s * qv[:, None], axis=0)
        tl.store(out + ((row * seq_len + t) * V_HEADS + hv) * V_DIM + vs, o.to({dtype}), mask=v_ok)
    tl.store(tile, s, mask=tile_ok)

OUTPUT_DTYPES = ({torch_dtype},)


def output_shapes(tensors):
    return [tuple(tensors[2].shape)]


def launch(kernel, tensors, scalars):
    {unpack}
    batch, seq_len, v_heads, v_dim = v.shape
    k_heads, k_dim = q.shape[2], q.shape[3]
    if tuple(state.shape[1:]) != (v_heads, k_dim, v_dim) or v_heads % k_heads or k_dim != {k_dim}:
        raise ValueError(f"gated delta rule kernel for key dim {k_dim}: q {{tuple(q.shape)}}, v {{tuple(v.shape)}}, "
                         f"state {{tuple(state.shape)}}")
    out = torch.empty((batch, seq_len, v_heads, v_dim), dtype={torch_dtype}, device=q.device)
    if out.numel() == 0:
        return [out]
    block_r, block_c = delta_rule_blocks(k_dim, v_dim)
    kernel[(slots.shape[0], v_heads, cdiv(v_dim, block_c))](
        q, k, v, g, beta, state, slots, starts, query_starts, out, seq_len, *q.stride(), *k.stride(), *v.stride(),
        *g.stride(), *beta.stride(), *state.stride(), V_HEADS=v_heads, K_DIM=k_dim, V_DIM=v_dim,
        GROUPS=v_heads // k_heads, VARLEN={varlen}, BLOCK_R=block_r, BLOCK_C=block_c, num_warps=4)
    return [out]
'''

_L2NORM = f"""        qv = qv * (1.0 / tl.sqrt(tl.sum(qv * qv, axis=0) + {L2NORM_EPS!r}))
        kv = kv * (1.0 / tl.sqrt(tl.sum(kv * kv, axis=0) + {L2NORM_EPS!r}))"""


def emit_gated_delta_rule_module(dtype: torch.dtype, k_dim: int, use_qk_l2norm: bool, varlen: bool, name: str,
                                 header: str) -> str:
    """The kernel file for the gated delta rule with a query of `dtype` (the output's) and key
    dim `k_dim` (q's scale), q and k L2-normalized or not, in the paged form (`varlen`: the op's
    `query_starts`) or the slot form."""
    kernel = _KERNEL.format(name=name, l2norm=_L2NORM if use_qk_l2norm else "", scale=k_dim ** -0.5, k_dim=k_dim,
                            dtype=TL_DTYPE[dtype], torch_dtype=str(dtype), varlen=varlen, sequence=SEQUENCE,
                            unpack=unpack_tensors(["q", "k", "v", "g", "beta"], {}, varlen))
    return module_source(header, {"ad_mlir.codegen.templates.gated_delta_rule_kernel": ["delta_rule_blocks"]}, [], [kernel])


def _emit(op: ad.CachedGatedDeltaRuleOp, varlen: bool, name: str, header: str) -> str:
    return emit_gated_delta_rule_module(torch_dtype(op.query.type), op.query.type.get_shape()[3],
                                        op.use_qk_l2norm is not None, varlen, name, header)


EMITTER = state_emitter(_emit)
