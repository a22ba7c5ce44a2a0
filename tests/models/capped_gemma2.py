"""A tiny Gemma2 whose logit soft cap and sliding window decide its outputs, for the tests of
the fused (test_fused_attention.py) and cached (test_generate.py) attention: as built, its scores
stay far under Gemma2's cap of 50 (random init) and a short test never leaves its window, so
either could be dropped unseen. Q and K scaled by `qk_gain` give scores of several units against
`softcap`."""

from __future__ import annotations

import torch

from ad_mlir.zoo.tiny import TinyConfig, build_model


def capped_gemma2(window: int, softcap: float = 2.0, qk_gain: float = 12.0) -> torch.nn.Module:
    model = build_model(TinyConfig(family="gemma2"))
    model.config.sliding_window, model.config.attn_logit_softcapping = window, softcap
    with torch.no_grad():
        for layer in model.model.layers:
            attention = layer.self_attn
            attention.attn_logit_softcapping = softcap
            if attention.sliding_window is not None:
                attention.sliding_window = window
            attention.q_proj.weight.mul_(qk_gain)
            attention.k_proj.weight.mul_(qk_gain)
    return model
