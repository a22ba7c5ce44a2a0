"""The WKV kernel template (`ad.cached_wkv`, RWKV's time mixing) and the op's torch reference, fed
as prefills, a chunked prefill and decode steps with the state written in place, against HF's own
whole-sequence `rwkv_linear_attention_cpu` (transformers' RWKV): in the Triton interpreter on CPU
(conftest sets TRITON_INTERPRET=1 where CUDA is absent) or on the GPU; and its PTX for sm_90 at
RWKV-4 1.5B's width (2048), compiled without a GPU: no spills. The paged form (`query_starts`) is
one launch over a step's flattened sequences (`state_rows.SEQUENCE`).

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
from transformers.models.rwkv.modeling_rwkv import rwkv_linear_attention_cpu

from ad_mlir.codegen.ptx import compile_all, record_launches, specialize_launch
from ad_mlir.codegen.templates.wkv_kernel import emit_wkv_module
from ad_mlir.semantics import torch_ops

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SEQ = 21
PIECES = [[(0, 9)], [(1, 7)], [(0, 10)], [(1, 12)], [(0, 11), (1, 13)], [(0, 12), (1, 14)], [(0, SEQ)], [(1, SEQ)]]
"""(row, end) of each call: prefills of 9 and 7 tokens, one token of one row, a chunk of 5 of the
other, two decode steps of both rows together, then chunks to the end."""
FLAT_PIECES = [[(0, 9), (1, 4)], [(1, 5), (0, 14)], [(0, 15), (1, 12)], [(1, SEQ), (0, SEQ)]]
"""The paged form's steps: both sequences' tokens in one batch row, of unequal lengths."""
SLOTS = [2, 0]
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2.0**-7}
"""Relative to 1 + |value|. fp32: HF's operations in HF's order, the interpreter's exponentials
and a fused multiply-add possibly an ulp off torch's. bf16: each output is the same fp32 value
rounded once to bf16 (to nearest by torch and on a GPU, truncated by the interpreter's store): one
bf16 ulp (2^-7 relative) apart at most."""


def _inputs(dtype: torch.dtype, width: int) -> tuple[torch.Tensor, ...]:
    """w, u [width], k and v [2, SEQ, width] (cut from one [2, SEQ, 2 width] tensor: strided; keys
    wide enough that the running maximum moves both ways) and HF's whole-sequence output and final
    state [2, 3, width]."""
    g = torch.Generator().manual_seed(width)
    decay, u = torch.randn(width, generator=g).to(DEVICE), torch.randn(width, generator=g).to(DEVICE)
    both = torch.randn(2, SEQ, 2 * width, generator=g).to(DEVICE)
    k, v = (4 * both[..., :width]).to(dtype), both[..., width:].to(dtype)
    expected, final = rwkv_linear_attention_cpu(decay, u, k, v, return_state=True)
    return -torch.exp(decay), u, k, v, expected, torch.stack(final, dim=1)


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Callable[[tuple], ModuleType]:
    return template_builder(tmp_path_factory.mktemp("wkv_kernels"), "wkv",
                            lambda spec, name, header: emit_wkv_module(*spec, name, header))


def _assert_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, where: object) -> None:
    error = ((got.float() - want.float()).abs() / (1 + want.float().abs())).max()
    assert error <= TOLERANCE[dtype], (where, float(error))


@pytest.mark.parametrize("run_kernel", [True, False], ids=["kernel", "reference"])
@pytest.mark.parametrize(("dtype", "width"), [
    (torch.float32, 64),
    (torch.bfloat16, 300),  # over two blocks, not a power of two
])
def test_wkv_in_pieces_equals_hf_whole_sequence(build, run_kernel: bool, dtype: torch.dtype,  # noqa: ANN001
                                                width: int) -> None:
    w, u, k, v, expected, final = _inputs(dtype, width)
    state = torch.randn(3, 3, width, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    module = build((dtype, False)) if run_kernel else None
    done = [0, 0]
    for piece in PIECES:
        ck, cv = (torch.stack([t[r, done[r]:e] for r, e in piece]) for t in (k, v))
        slots = torch.tensor([SLOTS[r] for r, _ in piece], device=DEVICE)
        starts = torch.tensor([done[r] for r, _ in piece], device=DEVICE)
        if module is not None:
            out = module.launch(getattr(module, module.kernel_name), [w, u, ck, cv, state, slots, starts], [])[0]
        else:
            out = torch_ops.cached_wkv(w, u, ck, cv, state, slots, starts)
        assert out.dtype == dtype
        for i, (r, e) in enumerate(piece):
            _assert_close(out[i], expected[r, done[r]:e], dtype, (piece, r))
            done[r] = e
    for r, slot in enumerate(SLOTS):
        _assert_close(state[slot, :2], final[r, :2], torch.float32, r)
        assert torch.equal(state[slot, 2], final[r, 2]), r  # the maximum: a max of sums, no rounding apart


@pytest.mark.parametrize("run_kernel", [True, False], ids=["kernel", "reference"])
def test_wkv_over_flattened_sequences_equals_hf_whole_sequence(build, run_kernel: bool) -> None:  # noqa: ANN001
    """The paged form (`query_starts`): the varlen kernel (one launch over both sequences) or the
    reference, against HF's whole sequences."""
    width = 64
    w, u, k, v, expected, final = _inputs(torch.float32, width)
    state = torch.randn(3, 3, width, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    module = build((torch.float32, True))
    done = [0, 0]
    for piece in FLAT_PIECES:
        lengths = [e - done[r] for r, e in piece]
        fk, fv = (torch.cat([t[r:r + 1, done[r]:e] for r, e in piece], dim=1) for t in (k, v))
        meta = [torch.tensor([SLOTS[r] for r, _ in piece], device=DEVICE),
                torch.tensor([done[r] for r, _ in piece], device=DEVICE),
                torch.tensor([0, *lengths], device=DEVICE).cumsum(0)]
        if run_kernel:
            out = module.launch(getattr(module, module.kernel_name), [w, u, fk, fv, state, *meta], [])[0]
        else:
            out = torch_ops.cached_wkv(w, u, fk, fv, state, *meta)
        for got, (r, e) in zip(out[0].split(lengths, dim=0), piece, strict=True):
            _assert_close(got, expected[r, done[r]:e], torch.float32, (piece, r))
            done[r] = e
    for r, slot in enumerate(SLOTS):
        _assert_close(state[slot], final[r], torch.float32, r)


@pytest.mark.parametrize("step", STEPS)
def test_varlen_wkv_equals_the_reference_on_a_ragged_step(build, step: str) -> None:  # noqa: ANN001
    """One flattened step (`ragged_steps.STEPS`) in one launch of the paged form's kernel (300
    channels over two blocks), against the op's reference on the same inputs and the same stale
    pool (its maxima real ones), within `TOLERANCE`: outputs and every slot."""
    lengths, width = STEPS[step].lengths, 300
    g = torch.Generator().manual_seed(len(lengths))
    w, u = -torch.rand(width, generator=g).to(DEVICE), torch.randn(width, generator=g).to(DEVICE)
    k, v = (torch.randn(1, sum(lengths), width, generator=g).to(DEVICE) for _ in range(2))
    pool = torch.rand(POOL_SLOTS, 3, width, generator=g).to(DEVICE) + 0.1
    meta = STEPS[step].metadata(DEVICE)
    module = build((torch.float32, True))
    state, expected_state = pool.clone(), pool.clone()
    out = module.launch(getattr(module, module.kernel_name), [w, u, k, v, state, *meta], [])[0]
    expected = torch_ops.cached_wkv(w, u, k, v, expected_state, *meta)
    _assert_close(out, expected, torch.float32, step)
    _assert_close(state, expected_state, torch.float32, step)
    assert not torch.equal(state, pool), "the step wrote its sequences' slots"


def _ptx_specs(module: ModuleType, shapes: list[tuple[int, ...]], varlen: bool) -> list:
    """RWKV-4 1.5B's time mixing (width 2048) in bf16, recorded on meta tensors."""
    width, launches = 2048, []
    for seqs, tokens in shapes:
        batch, seq = (1, tokens) if varlen else (seqs, tokens)
        tensors = [*[torch.empty(width, dtype=torch.bfloat16, device="meta")] * 2,
                   *[torch.empty(batch, seq, width, dtype=torch.bfloat16, device="meta")] * 2,
                   torch.empty(16, 3, width, dtype=torch.float32, device="meta"),
                   *[torch.empty(seqs, dtype=torch.int64, device="meta")] * 2,
                   *([torch.empty(seqs + 1, dtype=torch.int64, device="meta")] if varlen else [])]
        launches += record_launches(module, tensors, [])
    fn = getattr(module, module.kernel_name)
    return [specialize_launch(module.kernel_name, Path(module.__file__), fn, launch) for launch in launches]


def test_wkv_ptx_for_sm90_at_rwkv4_1b5_width_has_no_spills(build) -> None:  # noqa: ANN001
    """A 1024-token prefill of 1 row and a decode step of 8, compiled for sm_90."""
    specs = _ptx_specs(build((torch.bfloat16, False)), [(1, 1024), (8, 1)], varlen=False)
    assert [s.grid for s in specs] == [(1, 2048 // 256), (8, 2048 // 256)]
    for report in compile_all(specs):
        assert report.spills == 0, report


def test_varlen_wkv_ptx_for_sm90_at_rwkv4_1b5_width_has_no_spills(build) -> None:  # noqa: ANN001
    """The paged form's kernel: a step of 1024 tokens over 25 sequences and a decode step of 8."""
    specs = _ptx_specs(build((torch.bfloat16, True)), [(25, 1024), (8, 8)], varlen=True)
    assert [s.grid for s in specs] == [(25, 2048 // 256), (8, 2048 // 256)]
    for report in compile_all(specs):
        assert report.spills == 0, report
