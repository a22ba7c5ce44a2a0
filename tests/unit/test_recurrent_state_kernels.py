"""The recurrent-state kernel templates, Mamba2's scan (`ad.cached_ssm_scan`) and the gated delta
rule (`ad.cached_gated_delta_rule`), fed as a prefill, a chunked prefill and decode steps with the
state written in place, against HF's own whole-sequence functions (`mamba2_chunk_scan` and
`torch_chunk_gated_delta_rule` of transformers, chunked forms independent of the sequential
kernels and of the ops' references, which are checked against them too): in the Triton
interpreter on CPU (conftest sets TRITON_INTERPRET=1 where CUDA is absent) or on the GPU; and
their PTX for sm_90 at Nemotron-H's and Qwen3-Next's real sizes, compiled without a GPU: no
spills.

Two sequences in slots 2 and 0 of 3 whose states start as random values (a stale sequence's),
so a row starting at 0 that read its state would be seen."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from ragged_steps import POOL_SLOTS, STEPS
from template_modules import template_builder
from transformers.models.nemotron_h.modeling_nemotron_h import mamba2_chunk_scan
from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

from ad_mlir.codegen.ptx import compile_all, record_launches, specialize_launch
from ad_mlir.codegen.templates.gated_delta_rule_kernel import emit_gated_delta_rule_module
from ad_mlir.codegen.templates.ssm_scan_kernel import emit_ssm_scan_module
from ad_mlir.semantics import torch_ops

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SEQ = 21
PIECES = [[(0, 9)], [(1, 7)], [(0, 10)], [(1, 12)], [(0, 11), (1, 13)], [(0, 12), (1, 14)], [(0, SEQ)], [(1, SEQ)]]
"""(row, end) of each call: prefills of 9 and 7 tokens, one token of one row, a chunk of 5 of the
other, two decode steps of both rows together, then chunks to the end."""
SLOTS = [2, 0]

# fp32: |kernel - HF| <= tol (1 + |HF|) per output: the sequential recurrence against HF's
# chunked matmuls sums the same terms in another order, in exp of sums against products of exps
# (measured: < 1e-5 over 21 tokens). bf16: both sides read the same bf16 inputs and compute in
# fp32, but the steps HF rounds to bf16 (Mamba2's time step: a factor of every term of the state's
# update; the delta rule's output) may round one ulp apart (the interpreter truncates where torch
# rounds to nearest), so an output may be off by an ulp (2^-8) of the terms it sums, which can
# cancel: the bound is 2 ulps of the piece's largest output, |kernel - HF| <= tol (1 + max |HF|)
# (measured: 0.17 at max 51 for the Mamba2 kernel in the interpreter; the references, rounding as
# torch does, 4e-6).
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2 * 2.0**-7}


def _feed(run: Callable[..., torch.Tensor], inputs: list[torch.Tensor], state: torch.Tensor,
          expected: torch.Tensor, final: torch.Tensor, dtype: torch.dtype) -> None:
    """Every piece's output against the whole sequence's, then the states left behind."""
    tol = TOLERANCE[dtype]
    done = [0, 0]
    for piece in PIECES:
        rows = [r for r, _ in piece]
        length = piece[0][1] - done[rows[0]]
        assert all(e - done[r] == length for r, e in piece)
        chunk = [torch.stack([x[r, done[r]:e] for r, e in piece]) for x in inputs]
        out = run(*chunk, state, torch.tensor([SLOTS[r] for r in rows], device=DEVICE),
                  torch.tensor([done[r] for r in rows], device=DEVICE))
        for i, (r, e) in enumerate(piece):
            want = expected[r, done[r]:e].float()
            scale = want.abs() if dtype == torch.float32 else want.abs().max()
            assert ((out[i].float() - want).abs() <= tol * (1 + scale)).all(), (piece, r)
            done[r] = e
    for r, slot in enumerate(SLOTS):
        scale = final[r].abs() if dtype == torch.float32 else final[r].abs().max()
        assert ((state[slot] - final[r]).abs() <= tol * (1 + scale)).all(), r


# -- Mamba2 ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def build_ssm(tmp_path_factory: pytest.TempPathFactory) -> Callable[[tuple], ModuleType]:
    return template_builder(tmp_path_factory.mktemp("ssm_scan_kernels"), "ssm_scan",
                            lambda spec, name, header: emit_ssm_scan_module(*spec, name, header))


def _ssm_inputs(dtype: torch.dtype, heads: int, head_dim: int, groups: int, state_size: int,
                seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # x, dt, B, C as views of one projection (HF splits one in_proj output), B and C of groups
    proj = torch.randn(2, SEQ, heads * head_dim + heads + 2 * groups * state_size, generator=g).to(dtype).to(DEVICE)
    x, dt, b, c = proj.split([heads * head_dim, heads, groups * state_size, groups * state_size], dim=-1)
    return [x.view(2, SEQ, heads, head_dim), dt * 2, b.view(2, SEQ, groups, state_size),
            c.view(2, SEQ, groups, state_size)]


@pytest.mark.parametrize("run_kernel", [True, False], ids=["kernel", "reference"])
@pytest.mark.parametrize(("dtype", "heads", "head_dim", "groups", "state_size", "extras", "dt_max"), [
    (torch.float32, 4, 8, 2, 16, True, None),
    (torch.float32, 3, 40, 1, 12, False, 0.5),  # head_dim over two blocks, a state size not a power of 2
    (torch.bfloat16, 4, 16, 4, 8, True, None),
])
def test_ssm_scan_in_pieces_equals_hf_whole_sequence(build_ssm, run_kernel: bool, dtype: torch.dtype,  # noqa: ANN001
                                                     heads: int, head_dim: int, groups: int, state_size: int,
                                                     extras: bool, dt_max: float | None) -> None:
    """With D, dt_bias and softplus (Nemotron-H's call), or without them and with an upper clamp;
    HF's chunks of 8 over 21 tokens (three chunks, the last padded)."""
    seed = heads * head_dim + state_size
    x, dt, b, c = _ssm_inputs(dtype, heads, head_dim, groups, state_size, seed)
    g = torch.Generator().manual_seed(seed + 1)
    a = -torch.rand(heads, generator=g).to(DEVICE) * 2 - 0.5
    d = torch.randn(heads, generator=g).to(DEVICE) if extras else None
    dt_bias = torch.randn(heads, generator=g).to(DEVICE) if extras else None
    dt_min = 0.01
    limit = (dt_min, dt_max if dt_max is not None else float("inf"))
    expected, final = mamba2_chunk_scan(x, dt, a, b, c, 8, D=d, dt_bias=dt_bias, dt_softplus=extras, dt_limit=limit,
                                        return_final_states=True)
    state = torch.randn(3, heads, head_dim, state_size, generator=g).to(DEVICE)
    optional = [*([d] if extras else []), *([dt_bias] if extras else [])]
    if run_kernel:
        module = build_ssm((dtype, extras, extras, extras, dt_min, dt_max, False))

        def run(x, dt, b, c, state, slots, starts):  # noqa: ANN001, ANN202
            kernel = getattr(module, module.kernel_name)
            return module.launch(kernel, [x, dt, a, b, c, *optional, state, slots, starts], [])[0]
    else:
        def run(x, dt, b, c, state, slots, starts):  # noqa: ANN001, ANN202
            return torch_ops.cached_ssm_scan(x, dt, a, b, c, d, dt_bias, state, slots, starts, dt_softplus=extras,
                                             dt_min=dt_min, dt_max=dt_max)
    _feed(run, [x, dt, b, c], state, expected, final, dtype)


def test_ssm_ptx_for_sm90_at_nemotron_h_sizes_has_no_spills(build_ssm) -> None:  # noqa: ANN001
    """Nemotron-H-8B's Mamba2 layers (128 heads of 64, 8 groups, state 128) in bf16: a 1024-token
    prefill of 1 row and a decode step of 8, compiled for sm_90 as the runtime specializes them."""
    module = build_ssm((torch.bfloat16, True, True, True, 0.0, None, False))
    launches = []
    for batch, seq in ((1, 1024), (8, 1)):
        m = torch.empty(batch, seq, 128 * 64 + 128 + 2 * 8 * 128, dtype=torch.bfloat16, device="meta")
        x, dt, b, c = m.split([128 * 64, 128, 8 * 128, 8 * 128], dim=-1)
        heads = torch.empty(128, dtype=torch.float32, device="meta")
        tensors = [x.view(batch, seq, 128, 64), dt, heads, b.view(batch, seq, 8, 128), c.view(batch, seq, 8, 128),
                   heads, heads, torch.empty(16, 128, 64, 128, dtype=torch.float32, device="meta"),
                   *[torch.empty(batch, dtype=torch.int64, device="meta")] * 2]
        launches += record_launches(module, tensors, [])
    fn = getattr(module, module.kernel_name)
    specs = [specialize_launch(module.kernel_name, Path(module.__file__), fn, launch) for launch in launches]
    assert [s.grid for s in specs] == [(1, 128, 2), (8, 128, 2)]
    for report in compile_all(specs):
        assert report.spills == 0, report


def _matches_reference(launch: Callable[[torch.Tensor], torch.Tensor],
                       reference: Callable[[torch.Tensor], torch.Tensor], pool: torch.Tensor,
                       dtype: torch.dtype) -> None:
    """The varlen kernel (`launch(state)`) against the op's reference (`reference(state)`), each on
    a copy of the stale `pool`, within `TOLERANCE` (the same recurrence on the same inputs, so
    the slot form's bound against HF holds with room): the outputs, then every slot of the pool."""
    state, expected_state = pool.clone(), pool.clone()
    out, expected = launch(state), reference(expected_state)
    assert out.shape == expected.shape and out.dtype == expected.dtype
    tol = TOLERANCE[dtype]
    for got, want in ((out.float(), expected.float()), (state, expected_state)):
        scale = want.abs() if dtype == torch.float32 else want.abs().max()
        assert ((got - want).abs() <= tol * (1 + scale)).all()
    assert not torch.equal(state, pool), "the step wrote its sequences' slots"


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_varlen_ssm_scan_equals_the_reference_on_a_ragged_step(build_ssm, step: str,  # noqa: ANN001
                                                                dtype: torch.dtype) -> None:
    """One flattened step (`ragged_steps.STEPS`: sequences of 1, 5 and 3 tokens, decodes only, one
    sequence) in one launch of the paged form's kernel (Nemotron-H's call: D, dt_bias, softplus;
    4 heads of 8 over 2 groups, state 16)."""
    lengths, heads, head_dim, groups, state_size = STEPS[step].lengths, 4, 8, 2, 16
    g = torch.Generator().manual_seed(len(lengths))
    proj = torch.randn(1, sum(lengths), heads * head_dim + heads + 2 * groups * state_size, generator=g)
    x, dt, b, c = proj.to(dtype).to(DEVICE).split([heads * head_dim, heads, groups * state_size,
                                                    groups * state_size], dim=-1)
    x, b, c = x.view(1, -1, heads, head_dim), b.view(1, -1, groups, state_size), c.view(1, -1, groups, state_size)
    a = -torch.rand(heads, generator=g).to(DEVICE) * 2 - 0.5
    d, dt_bias = torch.randn(heads, generator=g).to(DEVICE), torch.randn(heads, generator=g).to(DEVICE)
    pool = torch.randn(POOL_SLOTS, heads, head_dim, state_size, generator=g).to(DEVICE)
    meta = STEPS[step].metadata(DEVICE)
    module = build_ssm((dtype, True, True, True, 0.01, None, True))
    kernel = getattr(module, module.kernel_name)
    _matches_reference(
        lambda state: module.launch(kernel, [x, dt * 2, a, b, c, d, dt_bias, state, *meta], [])[0],
        lambda state: torch_ops.cached_ssm_scan(x, dt * 2, a, b, c, d, dt_bias, state, *meta, dt_softplus=True,
                                                dt_min=0.01),
        pool, dtype)


def test_varlen_ssm_ptx_for_sm90_at_nemotron_h_sizes_has_no_spills(build_ssm) -> None:  # noqa: ANN001
    """The paged form's kernel at Nemotron-H-8B's sizes in bf16, recorded on meta tensors (the
    launcher reads no tensor's values: meta tensors have none): a step of 1024 tokens over 25
    sequences and a decode step of 8, one program per sequence and head and block of head_dim."""
    module = build_ssm((torch.bfloat16, True, True, True, 0.0, None, True))
    launches = []
    for seqs, tokens in ((25, 1024), (8, 8)):
        m = torch.empty(1, tokens, 128 * 64 + 128 + 2 * 8 * 128, dtype=torch.bfloat16, device="meta")
        x, dt, b, c = m.split([128 * 64, 128, 8 * 128, 8 * 128], dim=-1)
        heads = torch.empty(128, dtype=torch.float32, device="meta")
        tensors = [x.view(1, tokens, 128, 64), dt, heads, b.view(1, tokens, 8, 128), c.view(1, tokens, 8, 128),
                   heads, heads, torch.empty(16, 128, 64, 128, dtype=torch.float32, device="meta"),
                   *[torch.empty(seqs, dtype=torch.int64, device="meta")] * 2,
                   torch.empty(seqs + 1, dtype=torch.int64, device="meta")]
        launches += record_launches(module, tensors, [])
    fn = getattr(module, module.kernel_name)
    specs = [specialize_launch(module.kernel_name, Path(module.__file__), fn, launch) for launch in launches]
    assert [s.grid for s in specs] == [(25, 128, 2), (8, 128, 2)]
    for report in compile_all(specs):
        assert report.spills == 0, report


# -- gated delta rule --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def build_gdr(tmp_path_factory: pytest.TempPathFactory) -> Callable[[tuple], ModuleType]:
    return template_builder(tmp_path_factory.mktemp("gated_delta_rule_kernels"), "gated_delta_rule",
                            lambda spec, name, header: emit_gated_delta_rule_module(*spec, name, header))


def _gdr_inputs(dtype: torch.dtype, k_heads: int, v_heads: int, k_dim: int, v_dim: int,
                seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # q, k, v as views of one [b, s, channels] tensor (HF splits the conv's output)
    qkv = torch.randn(2, SEQ, 2 * k_heads * k_dim + v_heads * v_dim, generator=g).to(dtype).to(DEVICE)
    q, k, v = qkv.split([k_heads * k_dim, k_heads * k_dim, v_heads * v_dim], dim=-1)
    decay = -torch.rand(2, SEQ, v_heads, generator=g).to(DEVICE)  # HF's g is fp32 (-exp(A_log) softplus(..))
    beta = torch.rand(2, SEQ, v_heads, generator=g).to(dtype).to(DEVICE)
    return [q.view(2, SEQ, k_heads, k_dim), k.view(2, SEQ, k_heads, k_dim), v.view(2, SEQ, v_heads, v_dim), decay,
            beta]


@pytest.mark.parametrize("run_kernel", [True, False], ids=["kernel", "reference"])
@pytest.mark.parametrize(("dtype", "k_heads", "v_heads", "k_dim", "v_dim", "l2norm"), [
    (torch.float32, 2, 4, 16, 8, True),  # value heads grouped over key heads (Qwen3-Next's 16 / 32)
    (torch.float32, 2, 2, 12, 40, False),  # a key dim not a power of 2, value dim over two blocks
    (torch.bfloat16, 1, 2, 16, 16, True),
])
def test_gated_delta_rule_in_pieces_equals_hf_whole_sequence(build_gdr, run_kernel: bool,  # noqa: ANN001
                                                             dtype: torch.dtype, k_heads: int, v_heads: int,
                                                             k_dim: int, v_dim: int, l2norm: bool) -> None:
    """HF's chunks of 8 over 21 tokens (three chunks, the last padded)."""
    q, k, v, decay, beta = _gdr_inputs(dtype, k_heads, v_heads, k_dim, v_dim, k_dim * v_dim + v_heads)
    expected, final = torch_chunk_gated_delta_rule(q, k, v, decay, beta, chunk_size=8, output_final_state=True,
                                                   use_qk_l2norm_in_kernel=l2norm)
    g = torch.Generator().manual_seed(k_dim)
    state = torch.randn(3, v_heads, k_dim, v_dim, generator=g).to(DEVICE)
    if run_kernel:
        module = build_gdr((dtype, k_dim, l2norm, False))

        def run(*tensors):  # noqa: ANN002, ANN202
            return module.launch(getattr(module, module.kernel_name), list(tensors), [])[0]
    else:
        def run(*tensors):  # noqa: ANN002, ANN202
            return torch_ops.cached_gated_delta_rule(*tensors, use_qk_l2norm=l2norm)
    _feed(run, [q, k, v, decay, beta], state, expected, final, dtype)


def test_gated_delta_rule_ptx_for_sm90_at_qwen3_next_sizes_has_no_spills(build_gdr) -> None:  # noqa: ANN001
    """Qwen3-Next-80B's linear-attention layers (16 key heads, 32 value heads, both dims 128) in
    bf16: a 1024-token prefill of 1 row and a decode step of 8, compiled for sm_90."""
    module = build_gdr((torch.bfloat16, 128, True, False))
    launches = []
    for batch, seq in ((1, 1024), (8, 1)):
        qkv = torch.empty(batch, seq, 2 * 16 * 128 + 32 * 128, dtype=torch.bfloat16, device="meta")
        q, k, v = qkv.split([16 * 128, 16 * 128, 32 * 128], dim=-1)
        tensors = [q.view(batch, seq, 16, 128), k.view(batch, seq, 16, 128), v.view(batch, seq, 32, 128),
                   torch.empty(batch, seq, 32, dtype=torch.float32, device="meta"),
                   torch.empty(batch, seq, 32, dtype=torch.bfloat16, device="meta"),
                   torch.empty(16, 32, 128, 128, dtype=torch.float32, device="meta"),
                   *[torch.empty(batch, dtype=torch.int64, device="meta")] * 2]
        launches += record_launches(module, tensors, [])
    fn = getattr(module, module.kernel_name)
    specs = [specialize_launch(module.kernel_name, Path(module.__file__), fn, launch) for launch in launches]
    assert [s.grid for s in specs] == [(1, 32, 4), (8, 32, 4)]
    for report in compile_all(specs):
        assert report.spills == 0, report


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_varlen_gated_delta_rule_equals_the_reference_on_a_ragged_step(build_gdr, step: str,  # noqa: ANN001
                                                                       dtype: torch.dtype) -> None:
    """One flattened step (`ragged_steps.STEPS`) in one launch of the paged form's kernel
    (Qwen3-Next's call: L2-normalized q and k; 4 value heads over 2 key heads, key dim 16, value
    dim 40 over two blocks)."""
    lengths, k_heads, v_heads, k_dim, v_dim = STEPS[step].lengths, 2, 4, 16, 40
    g = torch.Generator().manual_seed(len(lengths))
    qkv = torch.randn(1, sum(lengths), 2 * k_heads * k_dim + v_heads * v_dim, generator=g).to(dtype).to(DEVICE)
    q, k, v = qkv.split([k_heads * k_dim, k_heads * k_dim, v_heads * v_dim], dim=-1)
    q, k, v = q.view(1, -1, k_heads, k_dim), k.view(1, -1, k_heads, k_dim), v.view(1, -1, v_heads, v_dim)
    decay = -torch.rand(1, sum(lengths), v_heads, generator=g).to(DEVICE)
    beta = torch.rand(1, sum(lengths), v_heads, generator=g).to(dtype).to(DEVICE)
    pool = torch.randn(POOL_SLOTS, v_heads, k_dim, v_dim, generator=g).to(DEVICE)
    meta = STEPS[step].metadata(DEVICE)
    module = build_gdr((dtype, k_dim, True, True))
    kernel = getattr(module, module.kernel_name)
    _matches_reference(
        lambda state: module.launch(kernel, [q, k, v, decay, beta, state, *meta], [])[0],
        lambda state: torch_ops.cached_gated_delta_rule(q, k, v, decay, beta, state, *meta, use_qk_l2norm=True),
        pool, dtype)


def test_varlen_gated_delta_rule_ptx_for_sm90_at_qwen3_next_sizes_has_no_spills(build_gdr) -> None:  # noqa: ANN001
    """The paged form's kernel at Qwen3-Next-80B's sizes in bf16, recorded on meta tensors (no
    tensor's values read): a step of 1024 tokens over 25 sequences and a decode step of 8."""
    module = build_gdr((torch.bfloat16, 128, True, True))
    launches = []
    for seqs, tokens in ((25, 1024), (8, 8)):
        qkv = torch.empty(1, tokens, 2 * 16 * 128 + 32 * 128, dtype=torch.bfloat16, device="meta")
        q, k, v = qkv.split([16 * 128, 16 * 128, 32 * 128], dim=-1)
        tensors = [q.view(1, tokens, 16, 128), k.view(1, tokens, 16, 128), v.view(1, tokens, 32, 128),
                   torch.empty(1, tokens, 32, dtype=torch.float32, device="meta"),
                   torch.empty(1, tokens, 32, dtype=torch.bfloat16, device="meta"),
                   torch.empty(16, 32, 128, 128, dtype=torch.float32, device="meta"),
                   *[torch.empty(seqs, dtype=torch.int64, device="meta")] * 2,
                   torch.empty(seqs + 1, dtype=torch.int64, device="meta")]
        launches += record_launches(module, tensors, [])
    fn = getattr(module, module.kernel_name)
    specs = [specialize_launch(module.kernel_name, Path(module.__file__), fn, launch) for launch in launches]
    assert [s.grid for s in specs] == [(25, 32, 4), (8, 32, 4)]
    for report in compile_all(specs):
        assert report.spills == 0, report


# -- the paged form: one flattened batch of sequences of unequal lengths -------------------------

FLAT_PIECES = [[(0, 9), (1, 4)], [(1, 5), (0, 14)], [(0, 15), (1, 12)], [(1, 13), (0, 16)], [(0, SEQ), (1, SEQ)]]
"""(row, end) of each flattened step: first chunks of 9 and 4 tokens, a decode beside a chunk of
5, a chunk of 7 after a decode, then the rest (5 and 8 tokens), every step's sequences of
unequal lengths, in either order."""


@pytest.mark.parametrize("run_kernel", [True, False], ids=["kernel", "reference"])
def test_gated_delta_rule_over_flattened_sequences_equals_hf_whole_sequence(build_gdr, run_kernel: bool) -> None:  # noqa: ANN001
    """The paged form (`query_starts`): each step one batch of both sequences' tokens, the varlen
    kernel (one launch over both) or the reference, against HF's whole sequences as in the slot
    form's test (fp32, its tolerance)."""
    q, k, v, decay, beta = _gdr_inputs(torch.float32, 2, 4, 16, 8, 7)
    expected, final = torch_chunk_gated_delta_rule(q, k, v, decay, beta, chunk_size=8, output_final_state=True,
                                                   use_qk_l2norm_in_kernel=True)
    state = torch.randn(3, 4, 16, 8, generator=torch.Generator().manual_seed(8)).to(DEVICE)
    module = build_gdr((torch.float32, 16, True, True))
    tol, done = TOLERANCE[torch.float32], [0, 0]
    for piece in FLAT_PIECES:
        rows = [r for r, _ in piece]
        flat = [torch.cat([x[r:r + 1, done[r]:e] for r, e in piece], dim=1) for x in (q, k, v, decay, beta)]
        lengths = [e - done[r] for r, e in piece]
        query_starts = torch.tensor([0, *lengths], device=DEVICE).cumsum(0)
        meta = [torch.tensor([SLOTS[r] for r in rows], device=DEVICE), torch.tensor([done[r] for r in rows],
                                                                                   device=DEVICE)]
        if run_kernel:
            out = module.launch(getattr(module, module.kernel_name), [*flat, state, *meta, query_starts], [])[0]
        else:
            out = torch_ops.cached_gated_delta_rule(*flat, state, *meta, query_starts, use_qk_l2norm=True)
        for got, (r, e) in zip(out[0].split(lengths), piece, strict=True):
            want = expected[r, done[r]:e]
            assert ((got - want).abs() <= tol * (1 + want.abs())).all(), (piece, r)
            done[r] = e
    for r, slot in enumerate(SLOTS):
        assert ((state[slot] - final[r]).abs() <= tol * (1 + final[r].abs())).all(), r
