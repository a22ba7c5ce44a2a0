"""The Mamba1 selective-scan kernel template (`ad.cached_selective_scan`) and the op's torch
reference, fed as prefills, a chunked prefill and decode steps with the state written in place,
against HF's own whole-sequence `mamba_selective_scan` (transformers' Mamba): in the Triton
interpreter on CPU (conftest sets TRITON_INTERPRET=1 where CUDA is absent) or on the GPU; and its
PTX for sm_90 at Falcon-Mamba-7B's real sizes (8192 channels, state 16), compiled without a GPU:
no spills.

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
from transformers.models.mamba.modeling_mamba import mamba_selective_scan

from ad_mlir.codegen.ptx import compile_all, record_launches, specialize_launch
from ad_mlir.codegen.templates.selective_scan_kernel import emit_selective_scan_module
from ad_mlir.semantics import torch_ops

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SEQ = 21
PIECES = [[(0, 9)], [(1, 7)], [(0, 10)], [(1, 12)], [(0, 11), (1, 13)], [(0, 12), (1, 14)], [(0, SEQ)], [(1, SEQ)]]
"""(row, end) of each call: prefills of 9 and 7 tokens, one token of one row, a chunk of 5 of the
other, two decode steps of both rows together, then chunks to the end."""
SLOTS = [2, 0]
TOLERANCE = 2e-5
"""fp32: the same recurrence as HF's loop, h C summed in another order (measured < 1e-6)."""


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Callable[[tuple], ModuleType]:
    return template_builder(tmp_path_factory.mktemp("selective_scan_kernels"), "selective_scan",
                            lambda spec, name, header: emit_selective_scan_module(*spec, name, header))


@pytest.mark.parametrize("run_kernel", [True, False], ids=["kernel", "reference"])
@pytest.mark.parametrize(("channels", "state_size", "extras"), [
    (32, 16, True),    # Mamba's call: D, the gate z, dt_bias and softplus
    (100, 12, False),  # channels over two blocks, not a power of two; a state size not one either
])
def test_selective_scan_in_pieces_equals_hf_whole_sequence(build, run_kernel: bool, channels: int,  # noqa: ANN001
                                                           state_size: int, extras: bool) -> None:
    g = torch.Generator().manual_seed(channels + state_size)
    # x, z, dt of one projection [2, 3 * channels, SEQ] (HF splits and transposes), B and C of another
    proj = torch.randn(2, 3 * channels, SEQ, generator=g).to(DEVICE)
    x, z, dt = proj.split(channels, dim=1)
    bc = torch.randn(2, SEQ, 2 * state_size, generator=g).to(DEVICE).transpose(1, 2)
    b, c = bc.split(state_size, dim=1)
    a = -torch.rand(channels, state_size, generator=g).to(DEVICE) * 2 - 0.1
    d = torch.randn(channels, generator=g).to(DEVICE) if extras else None
    dt_bias = torch.randn(channels, generator=g).to(DEVICE) if extras else None
    gate = z if extras else None
    dt = dt if extras else dt.abs() * 0.5  # without softplus the steps must be positive already
    expected, final = mamba_selective_scan(x, dt, a, b, c, D=d, z=gate, delta_bias=dt_bias, delta_softplus=extras,
                                           return_last_state=True)
    state = torch.randn(3, channels, state_size, generator=g).to(DEVICE)
    module = build((torch.float32, torch.float32, extras, extras, extras, extras, False)) if run_kernel else None
    done = [0, 0]
    for piece in PIECES:
        rows = [r for r, _ in piece]
        chunk = [torch.stack([v[r, :, done[r]:e] for r, e in piece]) for v in (x, dt, b, c, z)]
        slots = torch.tensor([SLOTS[r] for r in rows], device=DEVICE)
        starts = torch.tensor([done[r] for r in rows], device=DEVICE)
        cx, cdt, cb, cc, cz = chunk
        if module is not None:
            tensors = [cx, cdt, a, cb, cc, *([d, cz, dt_bias] if extras else []), state, slots, starts]
            out = module.launch(getattr(module, module.kernel_name), tensors, [])[0]
        else:
            out = torch_ops.cached_selective_scan(cx, cdt, a, cb, cc, d, cz if extras else None, dt_bias, state, slots,
                                                  starts, dt_softplus=extras)
        for i, (r, e) in enumerate(piece):
            want = expected[r, :, done[r]:e]
            assert ((out[i] - want).abs() <= TOLERANCE * (1 + want.abs())).all(), (piece, r)
            done[r] = e
    for r, slot in enumerate(SLOTS):
        assert ((state[slot] - final[r]).abs() <= TOLERANCE * (1 + final[r].abs())).all(), r


@pytest.mark.parametrize("run_kernel", [True, False], ids=["kernel", "reference"])
def test_selective_scan_over_flattened_sequences_equals_hf_whole_sequence(build, run_kernel: bool) -> None:  # noqa: ANN001
    """The paged form (`query_starts`): each step one batch of both sequences' tokens, of unequal
    lengths (first chunks of 9 and 4, a decode beside a chunk of 5, then 1 and 7, then the rest),
    the varlen kernel (one launch over both) or the reference; against HF's whole sequences as
    above (Mamba's call)."""
    channels, state_size = 32, 16
    g = torch.Generator().manual_seed(5)
    x, z, dt = torch.randn(2, 3 * channels, SEQ, generator=g).to(DEVICE).split(channels, dim=1)
    b, c = torch.randn(2, SEQ, 2 * state_size, generator=g).to(DEVICE).transpose(1, 2).split(state_size, dim=1)
    a = -torch.rand(channels, state_size, generator=g).to(DEVICE) * 2 - 0.1
    d, dt_bias = torch.randn(channels, generator=g).to(DEVICE), torch.randn(channels, generator=g).to(DEVICE)
    expected, final = mamba_selective_scan(x, dt, a, b, c, D=d, z=z, delta_bias=dt_bias, delta_softplus=True,
                                           return_last_state=True)
    state = torch.randn(3, channels, state_size, generator=g).to(DEVICE)
    module = build((torch.float32, torch.float32, True, True, True, True, True))
    done = [0, 0]
    for piece in [[(0, 9), (1, 4)], [(1, 5), (0, 14)], [(0, 15), (1, 12)], [(1, SEQ), (0, SEQ)]]:
        lengths = [e - done[r] for r, e in piece]
        fx, fdt, fb, fc, fz = (torch.cat([v[r:r + 1, :, done[r]:e] for r, e in piece], dim=2) for v in (x, dt, b, c, z))
        meta = [torch.tensor([SLOTS[r] for r, _ in piece], device=DEVICE),
                torch.tensor([done[r] for r, _ in piece], device=DEVICE),
                torch.tensor([0, *lengths], device=DEVICE).cumsum(0)]
        if run_kernel:
            tensors = [fx, fdt, a, fb, fc, d, fz, dt_bias, state, *meta]
            out = module.launch(getattr(module, module.kernel_name), tensors, [])[0]
        else:
            out = torch_ops.cached_selective_scan(fx, fdt, a, fb, fc, d, fz, dt_bias, state, *meta, dt_softplus=True)
        for got, (r, e) in zip(out[0].split(lengths, dim=1), piece, strict=True):
            want = expected[r, :, done[r]:e]
            assert ((got - want).abs() <= TOLERANCE * (1 + want.abs())).all(), (piece, r)
            done[r] = e
    for r, slot in enumerate(SLOTS):
        assert ((state[slot] - final[r]).abs() <= TOLERANCE * (1 + final[r].abs())).all(), r


def test_selective_scan_ptx_for_sm90_at_falcon_mamba_sizes_has_no_spills(build) -> None:  # noqa: ANN001
    """Falcon-Mamba-7B's mixer (8192 channels, state 16) in bf16, its scan output fp32 (D is):
    a 1024-token prefill of 1 row and a decode step of 8, compiled for sm_90."""
    module = build((torch.bfloat16, torch.float32, True, True, True, True, False))
    channels, state_size = 8192, 16
    launches = []
    for batch, seq in ((1, 1024), (8, 1)):
        def meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
            return torch.empty(*shape, dtype=dtype, device="meta")
        x, z, dt = meta(batch, 3 * channels, seq).split(channels, dim=1)
        b, c = meta(batch, seq, 2 * state_size).transpose(1, 2).split(state_size, dim=1)
        per_channel = meta(channels, dtype=torch.float32)
        tensors = [x, dt, meta(channels, state_size, dtype=torch.float32), b, c, per_channel, z, per_channel,
                   meta(16, channels, state_size, dtype=torch.float32),
                   *[torch.empty(batch, dtype=torch.int64, device="meta")] * 2]
        launches += record_launches(module, tensors, [])
    fn = getattr(module, module.kernel_name)
    specs = [specialize_launch(module.kernel_name, Path(module.__file__), fn, launch) for launch in launches]
    assert [s.grid for s in specs] == [(1, channels // 64), (8, channels // 64)]
    for report in compile_all(specs):
        assert report.spills == 0, report


@pytest.mark.parametrize("step", STEPS)
def test_varlen_selective_scan_equals_the_reference_on_a_ragged_step(build, step: str) -> None:  # noqa: ANN001
    """One flattened step (`ragged_steps.STEPS`: sequences of 1, 5 and 3 tokens, decodes only, one
    sequence) in one launch of the paged form's kernel (Mamba's call: D, z, dt_bias, softplus; 100
    channels over two blocks, state 12), against the op's reference on the same inputs and the
    same stale pool, within `TOLERANCE` (the same recurrence in fp32): outputs and every slot."""
    lengths, channels, state_size = STEPS[step].lengths, 100, 12
    g = torch.Generator().manual_seed(len(lengths))
    x, z, dt = torch.randn(1, 3 * channels, sum(lengths), generator=g).to(DEVICE).split(channels, dim=1)
    b, c = torch.randn(1, sum(lengths), 2 * state_size, generator=g).to(DEVICE).transpose(1, 2).split(state_size,
                                                                                                     dim=1)
    a = -torch.rand(channels, state_size, generator=g).to(DEVICE) * 2 - 0.1
    d, dt_bias = torch.randn(channels, generator=g).to(DEVICE), torch.randn(channels, generator=g).to(DEVICE)
    pool = torch.randn(POOL_SLOTS, channels, state_size, generator=g).to(DEVICE)
    meta = STEPS[step].metadata(DEVICE)
    module = build((torch.float32, torch.float32, True, True, True, True, True))
    state, expected_state = pool.clone(), pool.clone()
    out = module.launch(getattr(module, module.kernel_name), [x, dt, a, b, c, d, z, dt_bias, state, *meta], [])[0]
    expected = torch_ops.cached_selective_scan(x, dt, a, b, c, d, z, dt_bias, expected_state, *meta, dt_softplus=True)
    assert out.shape == expected.shape == (1, channels, sum(lengths))
    assert ((out - expected).abs() <= TOLERANCE * (1 + expected.abs())).all()
    assert ((state - expected_state).abs() <= TOLERANCE * (1 + expected_state.abs())).all()
    assert not torch.equal(state, pool), "the step wrote its sequences' slots"


def test_varlen_selective_scan_ptx_for_sm90_at_falcon_mamba_sizes_has_no_spills(build) -> None:  # noqa: ANN001
    """The paged form's kernel at Falcon-Mamba-7B's sizes (8192 channels, state 16; bf16, its
    output fp32), recorded on meta tensors (no tensor's values read): a step of 1024 tokens over
    25 sequences and a decode step of 8."""
    module = build((torch.bfloat16, torch.float32, True, True, True, True, True))
    channels, state_size = 8192, 16
    launches = []
    for seqs, tokens in ((25, 1024), (8, 8)):
        def meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
            return torch.empty(*shape, dtype=dtype, device="meta")
        x, z, dt = meta(1, 3 * channels, tokens).split(channels, dim=1)
        b, c = meta(1, tokens, 2 * state_size).transpose(1, 2).split(state_size, dim=1)
        per_channel = meta(channels, dtype=torch.float32)
        tensors = [x, dt, meta(channels, state_size, dtype=torch.float32), b, c, per_channel, z, per_channel,
                   meta(16, channels, state_size, dtype=torch.float32),
                   *[meta(seqs, dtype=torch.int64)] * 2, meta(seqs + 1, dtype=torch.int64)]
        launches += record_launches(module, tensors, [])
    fn = getattr(module, module.kernel_name)
    specs = [specialize_launch(module.kernel_name, Path(module.__file__), fn, launch) for launch in launches]
    assert [s.grid for s in specs] == [(25, channels // 64), (8, channels // 64)]
    for report in compile_all(specs):
        assert report.spills == 0, report
