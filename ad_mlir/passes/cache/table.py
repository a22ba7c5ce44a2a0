"""The table of cached mixers: one line per mixer, in the order `insert-cached-attention` caches
them, which is the order of their cache arguments after the metadata (paged, the mixers that keep
a state per sequence go first, next to `state_slots`). A new mixer is its own module here and
one line below."""

from __future__ import annotations

from ad_mlir.passes.cache import (
    attention,
    causal_conv,
    gated_delta_rule,
    mla,
    rg_lru,
    selective_scan,
    ssm_scan,
    token_window,
    wkv,
)
from ad_mlir.passes.cache.interface import CachedMixer

MIXERS: tuple[CachedMixer, ...] = (
    attention.MIXER,
    causal_conv.MIXER,
    ssm_scan.MIXER,
    gated_delta_rule.MIXER,
    selective_scan.MIXER,
    rg_lru.MIXER,
    wkv.MIXER,
    token_window.MIXER,
    mla.MIXER,
)
