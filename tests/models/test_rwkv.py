"""RWKV's time mixing (the WKV recurrence: per channel a decayed sum of e^k v over the past
tokens, divided by the same sum of e^k, the current token weighted by its bonus e^u, with a
running maximum for stability; beside it a shift by one token into the key, value and
receptance). HF's `rwkv_linear_attention_cpu` loops over time steps in Python; while exporting,
`RwkvSelfAttention.forward` without a state routes it through the opaque `ad_mlir.wkv_scan`
(`frontends/export_patches.py`), the token shift, the projections and the decay `-exp(time_decay)`
left as ordinary ops."""

from __future__ import annotations

import torch
from transformers.models.rwkv.modeling_rwkv import rwkv_linear_attention_cpu

from ad_mlir.bench.families import sweep_family
from ad_mlir.semantics import torch_ops


def test_the_opaque_scan_is_hf_wkv_loop() -> None:
    """Keys wide enough that the running maximum moves both ways: the op equals HF's loop bit
    for bit (the same fp32 operations in the same order)."""
    gen = torch.Generator().manual_seed(0)
    decay, bonus = torch.randn(16, generator=gen), torch.randn(16, generator=gen)
    k, v = 8 * torch.randn(2, 9, 16, generator=gen), torch.randn(2, 9, 16, generator=gen)
    expected, _ = rwkv_linear_attention_cpu(decay, bonus, k, v)
    assert torch.equal(torch_ops.wkv_scan(-torch.exp(decay), bonus, k, v), expected)


def test_rwkv_exports_with_a_dynamic_length_and_matches_eager() -> None:
    """The family sweep's fp32 check (two lengths, one export): within torch.testing's fp32
    defaults on the logits, as every family of the matrix."""
    row = sweep_family("rwkv", bf16=False)
    assert row.status == "ok", row.reason
    assert sorted(row.reference_error) == sorted(row.interpreter_error) == [5, 11]
    for error in (*row.reference_error.values(), *row.interpreter_error.values()):
        assert error <= 1e-5
