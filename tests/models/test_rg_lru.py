"""RecurrentGemma's RG-LRU (its recurrent blocks' linear recurrence h_t = a_t h_{t-1} + x_t per
channel, beside a padded temporal convolution; its other layers sliding-window attention). HF's
`RecurrentGemmaRglru._rnn_scan` loops over time steps in Python; while exporting it is routed
through the opaque `ad_mlir.rg_lru_scan` (`frontends/export_patches.py`), everything before the
scan (the gates, the reset at position 0, the input normalization) left as ordinary ops."""

from __future__ import annotations

import torch
from transformers.models.recurrent_gemma.modeling_recurrent_gemma import RecurrentGemmaRglru

from ad_mlir.bench.families import sweep_family
from ad_mlir.semantics import torch_ops


def test_the_opaque_scan_is_hf_rnn_scan_with_its_resets() -> None:
    """Two rows, one restarting mid-sequence (a packed document boundary): the op on HF's gate
    times `~reset` equals HF's loop, bit for bit (the same fp32 products and sums in the same order)."""
    gen = torch.Generator().manual_seed(0)
    x, a = torch.randn(2, 9, 16, generator=gen), torch.rand(2, 9, 16, generator=gen)
    reset = torch.zeros(2, 9, 1, dtype=torch.bool)
    reset[:, 0], reset[1, 4] = True, True
    expected, _ = RecurrentGemmaRglru._rnn_scan(None, x, a, reset, None)
    assert torch.equal(torch_ops.rg_lru_scan(x, a * ~reset), expected)
    assert not torch.equal(torch_ops.rg_lru_scan(x, a), expected), "the reset mid-sequence matters"


def test_recurrent_gemma_exports_with_a_dynamic_length_and_matches_eager() -> None:
    """The family sweep's fp32 check (two lengths, one export): within torch.testing's fp32
    defaults on the logits, as every family of the matrix."""
    row = sweep_family("recurrent_gemma", bf16=False)
    assert row.status == "ok", row.reason
    assert sorted(row.reference_error) == sorted(row.interpreter_error) == [5, 11]
    for error in (*row.reference_error.values(), *row.interpreter_error.values()):
        assert error <= 1e-5
