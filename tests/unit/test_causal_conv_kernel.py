"""The cached causal-convolution kernel template (a prefill, a chunked prefill, decode steps;
the state written in place) against eager torch, in the Triton interpreter on CPU (conftest sets
TRITON_INTERPRET=1 where CUDA is absent) or on the GPU; and its PTX for sm_90 at LFM2-1.2B's
sizes, compiled without a GPU: no spills.

The expectation is HF's whole-sequence form, independent of the kernel and of the op's reference
(`torch_ops.cached_causal_conv1d`, also checked against it): `conv1d` with padding kernel - 1 over
each row's whole sequence, cut to its length, as LFM2's prefill computes it. A sequence is fed
in pieces (a prefill, a chunk, single tokens) through slots whose state starts as random values
(a stale sequence's), so a row starting at 0 that read its state would be seen."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F
from ragged_steps import POOL_SLOTS, STEPS
from template_modules import template_builder

from ad_mlir.codegen.ptx import compile_all, record_launches, specialize_launch
from ad_mlir.codegen.templates.causal_conv_kernel import emit_causal_conv_module
from ad_mlir.semantics import torch_ops

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# |kernel - eager| <= k eps (1 + |eager|): a sum of K products in fp32, in another order than
# torch's conv1d (measured: at most 2 fp32 ulps); bf16 rounds the fp32 sum once at the store, as
# torch's CPU bf16 conv1d (fp32 accumulation) does: 1 ulp apart, and the interpreter truncates.
TOLERANCE = {torch.float32: 4 * 2.0**-23, torch.bfloat16: 2 * 2.0**-7}


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Callable[[tuple], ModuleType]:
    return template_builder(tmp_path_factory.mktemp("causal_conv_kernels"), "causal_conv",
                            lambda spec, name, header: emit_causal_conv_module(*spec, name, header))


def _whole_sequence(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    k = weight.shape[2]
    return F.conv1d(x.float(), weight.float(), None if bias is None else bias.float(), padding=k - 1,
                    groups=weight.shape[0])[..., : x.shape[2]]


def _run(module: ModuleType, run_kernel: bool, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
         state: torch.Tensor, slots: list[int], starts: list[int]) -> torch.Tensor:
    meta = [torch.tensor(slots, device=DEVICE), torch.tensor(starts, device=DEVICE)]
    if run_kernel:
        tensors = [x, weight, *([bias] if bias is not None else []), state, *meta]
        return module.launch(getattr(module, module.kernel_name), tensors, [])[0]
    return torch_ops.cached_causal_conv1d(x, weight, bias, state, *meta)


@pytest.mark.parametrize("run_kernel", [True, False], ids=["kernel", "reference"])
@pytest.mark.parametrize(("dtype", "kernel_size", "channels", "has_bias"),
                         [(torch.float32, 3, 40, False), (torch.float32, 4, 130, True), (torch.bfloat16, 3, 64, True),
                          (torch.float32, 2, 16, False)])
def test_pieces_of_two_sequences_equal_the_whole_sequence_conv(build, run_kernel: bool, dtype: torch.dtype,  # noqa: ANN001
                                                               kernel_size: int, channels: int, has_bias: bool) -> None:
    """Two sequences of 45 tokens in slots 2 and 0 of 3, fed as: prefills of 37 and 30 tokens
    (more than one time block), one token of one row, a chunk of 5 of the other, two decode steps
    of both rows together, then chunks of 5 and 8 to the end; every piece's output and the state
    left behind against the whole sequence's conv."""
    module = build((kernel_size, dtype, has_bias, False))
    g = torch.Generator().manual_seed(kernel_size * channels)
    seq = 45
    # x is a transposed view, as HF's in_proj(...).transpose(-1, -2) gives it
    x = torch.randn(2, seq, channels, generator=g).to(dtype).to(DEVICE).transpose(1, 2)
    weight = torch.randn(channels, 1, kernel_size, generator=g).to(dtype).to(DEVICE)
    bias = torch.randn(channels, generator=g).to(dtype).to(DEVICE) if has_bias else None
    state = torch.randn(3, channels, kernel_size - 1, generator=g).to(dtype).to(DEVICE)
    slots = [2, 0]
    expected = _whole_sequence(x, weight, bias)
    pieces = [[(0, 37)], [(1, 30)], [(0, 38)], [(1, 35)], [(0, 39), (1, 36)], [(0, 40), (1, 37)], [(0, 45)],
              [(1, 45)]]
    done = [0, 0]
    tol = TOLERANCE[dtype]
    for piece in pieces:
        rows = [r for r, _ in piece]
        ends = [e for _, e in piece]
        length = ends[0] - done[rows[0]]
        assert all(e - done[r] == length for r, e in piece)
        chunk = torch.stack([x[r, :, done[r]:e] for r, e in piece])
        out = _run(module, run_kernel, chunk, weight, bias, state, [slots[r] for r in rows], [done[r] for r in rows])
        for i, (r, e) in enumerate(piece):
            want = expected[r, :, done[r]:e]
            assert ((out[i].float() - want).abs() <= tol * (1 + want.abs())).all(), (piece, r)
            last = x[r, :, :e][:, -(kernel_size - 1):]
            torch.testing.assert_close(state[slots[r]], last, rtol=0, atol=0)
            done[r] = e
    assert done == [seq, seq]


@pytest.mark.parametrize("run_kernel", [True, False], ids=["kernel", "reference"])
def test_flattened_sequences_equal_the_whole_sequence_conv(build, run_kernel: bool) -> None:  # noqa: ANN001
    """The paged form (`query_starts`): each step one batch of both sequences' tokens, of unequal
    lengths (first chunks of 9 and 4, a decode beside a chunk of 5, then 7 and 1, then the rest),
    the varlen kernel (one launch over both) or the reference; every sequence's output and state
    against the whole sequence's conv, as above."""
    module = build((3, torch.float32, True, True))
    g = torch.Generator().manual_seed(3)
    seq, channels = 20, 40
    x = torch.randn(2, seq, channels, generator=g).to(DEVICE).transpose(1, 2)
    weight, bias = torch.randn(channels, 1, 3, generator=g).to(DEVICE), torch.randn(channels, generator=g).to(DEVICE)
    state = torch.randn(3, channels, 2, generator=g).to(DEVICE)
    slots, expected, done = [2, 0], _whole_sequence(x, weight, bias), [0, 0]
    for piece in [[(0, 9), (1, 4)], [(1, 5), (0, 14)], [(0, 15), (1, 12)], [(1, seq), (0, seq)]]:
        lengths = [e - done[r] for r, e in piece]
        flat = torch.cat([x[r:r + 1, :, done[r]:e] for r, e in piece], dim=2)
        meta = [torch.tensor([slots[r] for r, _ in piece], device=DEVICE),
                torch.tensor([done[r] for r, _ in piece], device=DEVICE),
                torch.tensor([0, *lengths], device=DEVICE).cumsum(0)]
        if run_kernel:
            out = module.launch(getattr(module, module.kernel_name), [flat, weight, bias, state, *meta], [])[0]
        else:
            out = torch_ops.cached_causal_conv1d(flat, weight, bias, state, *meta)
        for got, (r, e) in zip(out[0].split(lengths, dim=1), piece, strict=True):
            want = expected[r, :, done[r]:e]
            assert ((got - want).abs() <= TOLERANCE[torch.float32] * (1 + want.abs())).all(), (piece, r)
            torch.testing.assert_close(state[slots[r]], x[r, :, e - 2:e], rtol=0, atol=0)
            done[r] = e


@pytest.mark.parametrize("run_kernel", [True, False], ids=["kernel", "reference"])
def test_a_row_starting_at_zero_ignores_a_stale_state(build, run_kernel: bool) -> None:  # noqa: ANN001
    """A one-token prompt (start 0) in a slot that holds a finished sequence's state."""
    module = build((3, torch.float32, False, False))
    g = torch.Generator().manual_seed(0)
    x, weight = torch.randn(1, 8, 1, generator=g).to(DEVICE), torch.randn(8, 1, 3, generator=g).to(DEVICE)
    state = torch.randn(1, 8, 2, generator=g).to(DEVICE) * 100
    out = _run(module, run_kernel, x, weight, None, state, [0], [0])
    torch.testing.assert_close(out, _whole_sequence(x, weight, None), rtol=0, atol=TOLERANCE[torch.float32])
    torch.testing.assert_close(state[0], torch.cat([torch.zeros(8, 1, device=DEVICE), x[0]], dim=1))


def test_ptx_for_sm90_at_lfm2_sizes_has_no_spills(build) -> None:  # noqa: ANN001
    """LFM2-1.2B's conv layers (hidden 2048, 3 taps) in bf16: a 1024-token prefill of 1 row and
    a decode step of 8, compiled for sm_90 as the runtime specializes them."""
    module = build((3, torch.bfloat16, False, False))
    launches = []
    for batch, seq in ((1, 1024), (8, 1)):
        tensors = [torch.empty(batch, 2048, seq, dtype=torch.bfloat16, device="meta"),
                   torch.empty(2048, 1, 3, dtype=torch.bfloat16, device="meta"),
                   torch.empty(16, 2048, 2, dtype=torch.bfloat16, device="meta"),
                   *[torch.empty(batch, dtype=torch.int64, device="meta")] * 2]
        launches += record_launches(module, tensors, [])
    fn = getattr(module, module.kernel_name)
    specs = [specialize_launch(module.kernel_name, Path(module.__file__), fn, launch) for launch in launches]
    assert [s.grid for s in specs] == [(1, 16, 32), (8, 16, 1)]
    for report in compile_all(specs):
        assert report.spills == 0, report


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize(("dtype", "kernel_size", "channels", "has_bias"),
                         [(torch.float32, 4, 130, True), (torch.bfloat16, 3, 40, False)])
def test_varlen_kernel_equals_the_reference_on_a_ragged_step(build, step: str, dtype: torch.dtype,  # noqa: ANN001
                                                             kernel_size: int, channels: int, has_bias: bool) -> None:
    """One flattened step (`ragged_steps.STEPS`: sequences of 1, 5 and 3 tokens, decodes only, one
    sequence) in one launch of the paged form's kernel, against the op's reference on the same
    inputs and the same stale pool: every output and every slot of the pool. fp32 within
    `TOLERANCE` (the same taps summed in another order); bf16 too: both sum in fp32 and round
    once, and may round an ulp apart (the interpreter truncates); a state copies inputs: exact."""
    lengths = STEPS[step].lengths
    g = torch.Generator().manual_seed(len(lengths))
    x = torch.randn(1, sum(lengths), channels, generator=g).to(dtype).to(DEVICE).transpose(1, 2)
    weight = torch.randn(channels, 1, kernel_size, generator=g).to(dtype).to(DEVICE)
    bias = torch.randn(channels, generator=g).to(dtype).to(DEVICE) if has_bias else None
    pool = torch.randn(POOL_SLOTS, channels, kernel_size - 1, generator=g).to(dtype).to(DEVICE)
    meta = STEPS[step].metadata(DEVICE)
    state = pool.clone()
    module = build((kernel_size, dtype, has_bias, True))
    out = module.launch(getattr(module, module.kernel_name), [x, weight, *([bias] if has_bias else []), state, *meta],
                        [])[0]
    expected_state = pool.clone()
    expected = torch_ops.cached_causal_conv1d(x, weight, bias, expected_state, *meta)
    assert out.shape == expected.shape == (1, channels, sum(lengths))
    tol = TOLERANCE[dtype]
    assert ((out.float() - expected.float()).abs() <= tol * (1 + expected.float().abs())).all()
    torch.testing.assert_close(state, expected_state, rtol=0, atol=0)
    assert not torch.equal(state, pool), "the step wrote its sequences' slots"


def test_varlen_ptx_for_sm90_at_lfm2_sizes_has_no_spills(build) -> None:  # noqa: ANN001
    """The paged form's kernel at LFM2-1.2B's sizes in bf16 (hidden 2048, 3 taps; a pool of 16
    slots), recorded on meta tensors (the launcher reads no tensor's values: meta tensors have
    none): a step of 1024 tokens over 25 sequences (at most 1000 in one: 32 token blocks of 32)
    and a decode step of 8 (one token block of 2)."""
    module = build((3, torch.bfloat16, False, True))
    launches = []
    for seqs, tokens in ((25, 1024), (8, 8)):
        tensors = [torch.empty(1, 2048, tokens, dtype=torch.bfloat16, device="meta"),
                   torch.empty(2048, 1, 3, dtype=torch.bfloat16, device="meta"),
                   torch.empty(16, 2048, 2, dtype=torch.bfloat16, device="meta"),
                   *[torch.empty(seqs, dtype=torch.int64, device="meta")] * 2,
                   torch.empty(seqs + 1, dtype=torch.int64, device="meta")]
        launches += record_launches(module, tensors, [])
    fn = getattr(module, module.kernel_name)
    specs = [specialize_launch(module.kernel_name, Path(module.__file__), fn, launch) for launch in launches]
    assert [s.grid for s in specs] == [(25, 16, 32), (8, 16, 1)]
    for report in compile_all(specs):
        assert report.spills == 0, report
