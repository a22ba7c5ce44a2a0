"""The RG-LRU kernel template (`ad.cached_rg_lru`) and the op's torch reference, fed as prefills,
a chunked prefill and decode steps with the state written in place, against HF's own
whole-sequence `RecurrentGemmaRglru._rnn_scan` (transformers' RecurrentGemma): in the Triton
interpreter on CPU (conftest sets TRITON_INTERPRET=1 where CUDA is absent) or on the GPU; and its
PTX for sm_90 at recurrent-gemma-2b's width (2560), compiled without a GPU: no spills. The paged
form (`query_starts`) is one launch over a step's flattened sequences (`state_rows.SEQUENCE`).

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
from transformers.models.recurrent_gemma.modeling_recurrent_gemma import RecurrentGemmaRglru

from ad_mlir.codegen.ptx import compile_all, record_launches, specialize_launch
from ad_mlir.codegen.templates.rg_lru_kernel import emit_rg_lru_module
from ad_mlir.semantics import torch_ops

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SEQ = 21
PIECES = [[(0, 9)], [(1, 7)], [(0, 10)], [(1, 12)], [(0, 11), (1, 13)], [(0, 12), (1, 14)], [(0, SEQ)], [(1, SEQ)]]
"""(row, end) of each call: prefills of 9 and 7 tokens, one token of one row, a chunk of 5 of the
other, two decode steps of both rows together, then chunks to the end."""
FLAT_PIECES = [[(0, 9), (1, 4)], [(1, 5), (0, 14)], [(0, 15), (1, 12)], [(1, SEQ), (0, SEQ)]]
"""The paged form's steps: both sequences' tokens in one batch row, of unequal lengths."""
SLOTS = [2, 0]
TOLERANCE = {torch.float32: 1e-6, torch.bfloat16: 2.0**-7}
"""Relative to 1 + |value|. fp32: HF's products and sums in HF's order, a fused multiply-add
at most rounding once less (measured: 0 in the interpreter). bf16: each output is the same fp32
state rounded once to bf16, to nearest by torch and on a GPU, truncated by the interpreter's
store: one bf16 ulp (2^-7 relative) apart at most."""


def _inputs(dtype: torch.dtype, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x and a [2, SEQ, width] (a in (0, 1), 0 at position 0 as HF's reset makes it; x and a cut from
    one [2, SEQ, 2 width] tensor: strided) and HF's whole-sequence output and final state."""
    g = torch.Generator().manual_seed(width)
    both = torch.randn(2, SEQ, 2 * width, generator=g).to(DEVICE)
    x, a = both[..., :width].to(dtype), torch.sigmoid(both[..., width:])
    reset = torch.zeros(2, SEQ, 1, dtype=torch.bool, device=DEVICE)
    reset[:, 0] = True
    expected, final = RecurrentGemmaRglru._rnn_scan(None, x, a, reset, None)
    return x, a * ~reset, expected, final


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Callable[[tuple], ModuleType]:
    return template_builder(tmp_path_factory.mktemp("rg_lru_kernels"), "rg_lru",
                            lambda spec, name, header: emit_rg_lru_module(*spec, name, header))


def _assert_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, where: object) -> None:
    assert ((got.float() - want.float()).abs() <= TOLERANCE[dtype] * (1 + want.float().abs())).all(), where


@pytest.mark.parametrize("run_kernel", [True, False], ids=["kernel", "reference"])
@pytest.mark.parametrize(("dtype", "width"), [
    (torch.float32, 64),
    (torch.bfloat16, 300),  # over two blocks, not a power of two
])
def test_rg_lru_in_pieces_equals_hf_whole_sequence(build, run_kernel: bool, dtype: torch.dtype,  # noqa: ANN001
                                                   width: int) -> None:
    x, a, expected, final = _inputs(dtype, width)
    state = torch.randn(3, width, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    module = build((dtype, False)) if run_kernel else None
    done = [0, 0]
    for piece in PIECES:
        cx, ca = (torch.stack([v[r, done[r]:e] for r, e in piece]) for v in (x, a))
        slots = torch.tensor([SLOTS[r] for r, _ in piece], device=DEVICE)
        starts = torch.tensor([done[r] for r, _ in piece], device=DEVICE)
        if module is not None:
            out = module.launch(getattr(module, module.kernel_name), [cx, ca, state, slots, starts], [])[0]
        else:
            out = torch_ops.cached_rg_lru(cx, ca, state, slots, starts)
        assert out.dtype == dtype
        for i, (r, e) in enumerate(piece):
            _assert_close(out[i], expected[r, done[r]:e], dtype, (piece, r))
            done[r] = e
    for r, slot in enumerate(SLOTS):
        _assert_close(state[slot], final[r], torch.float32, r)


@pytest.mark.parametrize("run_kernel", [True, False], ids=["kernel", "reference"])
def test_rg_lru_over_flattened_sequences_equals_hf_whole_sequence(build, run_kernel: bool) -> None:  # noqa: ANN001
    """The paged form (`query_starts`): the varlen kernel (one launch over both sequences) or the
    reference, against HF's whole sequences."""
    width = 64
    x, a, expected, final = _inputs(torch.float32, width)
    state = torch.randn(3, width, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    module = build((torch.float32, True))
    done = [0, 0]
    for piece in FLAT_PIECES:
        lengths = [e - done[r] for r, e in piece]
        fx, fa = (torch.cat([v[r:r + 1, done[r]:e] for r, e in piece], dim=1) for v in (x, a))
        meta = [torch.tensor([SLOTS[r] for r, _ in piece], device=DEVICE),
                torch.tensor([done[r] for r, _ in piece], device=DEVICE),
                torch.tensor([0, *lengths], device=DEVICE).cumsum(0)]
        if run_kernel:
            out = module.launch(getattr(module, module.kernel_name), [fx, fa, state, *meta], [])[0]
        else:
            out = torch_ops.cached_rg_lru(fx, fa, state, *meta)
        for got, (r, e) in zip(out[0].split(lengths, dim=0), piece, strict=True):
            _assert_close(got, expected[r, done[r]:e], torch.float32, (piece, r))
            done[r] = e
    for r, slot in enumerate(SLOTS):
        _assert_close(state[slot], final[r], torch.float32, r)


def test_rg_lru_ptx_for_sm90_at_recurrent_gemma_2b_width_has_no_spills(build) -> None:  # noqa: ANN001
    """recurrent-gemma-2b's RG-LRU (lru_width 2560) in bf16: a 1024-token prefill of 1 row and a
    decode step of 8, compiled for sm_90."""
    module = build((torch.bfloat16, False))
    width = 2560
    launches = []
    for batch, seq in ((1, 1024), (8, 1)):
        x = torch.empty(batch, seq, width, dtype=torch.bfloat16, device="meta")
        a = torch.empty(batch, seq, width, dtype=torch.float32, device="meta")
        tensors = [x, a, torch.empty(16, width, dtype=torch.float32, device="meta"),
                   *[torch.empty(batch, dtype=torch.int64, device="meta")] * 2]
        launches += record_launches(module, tensors, [])
    fn = getattr(module, module.kernel_name)
    specs = [specialize_launch(module.kernel_name, Path(module.__file__), fn, launch) for launch in launches]
    assert [s.grid for s in specs] == [(1, width // 256), (8, width // 256)]
    for report in compile_all(specs):
        assert report.spills == 0, report


@pytest.mark.parametrize("step", STEPS)
def test_varlen_rg_lru_equals_the_reference_on_a_ragged_step(build, step: str) -> None:  # noqa: ANN001
    """One flattened step (`ragged_steps.STEPS`) in one launch of the paged form's kernel (300
    channels over two blocks), against the op's reference on the same inputs and the same stale
    pool, within `TOLERANCE` (the same recurrence in fp32): outputs and every slot."""
    lengths, width = STEPS[step].lengths, 300
    g = torch.Generator().manual_seed(len(lengths))
    x, a = torch.randn(1, sum(lengths), width, generator=g).to(DEVICE), torch.rand(1, sum(lengths), width, generator=g)
    pool = torch.randn(POOL_SLOTS, width, generator=g).to(DEVICE)
    meta = STEPS[step].metadata(DEVICE)
    module = build((torch.float32, True))
    state, expected_state = pool.clone(), pool.clone()
    out = module.launch(getattr(module, module.kernel_name), [x, a.to(DEVICE), state, *meta], [])[0]
    expected = torch_ops.cached_rg_lru(x, a.to(DEVICE), expected_state, *meta)
    _assert_close(out, expected, torch.float32, step)
    _assert_close(state, expected_state, torch.float32, step)
    assert not torch.equal(state, pool), "the step wrote its sequences' slots"


def test_varlen_rg_lru_ptx_for_sm90_at_recurrent_gemma_2b_width_has_no_spills(build) -> None:  # noqa: ANN001
    """The paged form's kernel at recurrent-gemma-2b's width (2560, bf16), recorded on meta
    tensors: a step of 1024 tokens over 25 sequences and a decode step of 8."""
    module = build((torch.bfloat16, True))
    width = 2560
    launches = []
    for seqs, tokens in ((25, 1024), (8, 8)):
        tensors = [torch.empty(1, tokens, width, dtype=torch.bfloat16, device="meta"),
                   torch.empty(1, tokens, width, dtype=torch.float32, device="meta"),
                   torch.empty(16, width, dtype=torch.float32, device="meta"),
                   *[torch.empty(seqs, dtype=torch.int64, device="meta")] * 2,
                   torch.empty(seqs + 1, dtype=torch.int64, device="meta")]
        launches += record_launches(module, tensors, [])
    fn = getattr(module, module.kernel_name)
    specs = [specialize_launch(module.kernel_name, Path(module.__file__), fn, launch) for launch in launches]
    assert [s.grid for s in specs] == [(25, width // 256), (8, width // 256)]
    for report in compile_all(specs):
        assert report.spills == 0, report
