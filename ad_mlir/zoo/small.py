"""Every causal-LM model type that transformers maps in `AutoModelForCausalLM`, built small
from its config class (random weights): the sizes of the family sweep (`ad_mlir.bench.families`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SIZES: dict[str, Any] = {
    "num_hidden_layers": 2,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "pad_token_id": 0,
    "max_position_embeddings": 2048,
    "use_cache": False,
}
"""Config keywords every family gets (HF maps them to the family's own names)."""


WHERE_PRESENT: dict[str, Any] = {
    "head_dim": 32,
    "rotary_dim": 16,
    "qk_rope_head_dim": 16,
    "qk_nope_head_dim": 32,
    "v_head_dim": 32,
    "kv_lora_rank": 64,
    "q_lora_rank": 64,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 128,
    "n_group": 1,
    "topk_group": 1,
    "index_topk": 2,
    "unpadded_vocab_size": SIZES["vocab_size"],
}
"""Set where the config has them: head sizes its defaults would not derive from SIZES (a
default head_dim of 128 or rotary_dim of 64 with 4 heads of hidden 128 does not build or
export), and a few experts (a default of 64-256 experts is slow to export) with a small shared
expert (Qwen2-MoE's default of 5632 runs as 88 virtual experts of 64 in `ad.moe`). MLA's
(DeepSeek-V2/V3) head parts keep DeepSeek-V3's ratios, rope 64 : nope 128 : value 128 : latent 512
(here 16 : 32 : 32 : 64), so that the query/key head dim (48) differs from the value's (32).
The token indexer of DeepSeek sparse attention (DeepSeek-V3.2, GLM-5, dots.3 note...) keeps the
`index_topk` best keys of each query (2048 by default), `min(index_topk, keys)` of them: with 2,
at the sweep's lengths the selection is really sparse (with 2048 HF would select every key). Inkling's LM head has an output size of its own
(`unpadded_vocab_size`, default 200058): the vocabulary's, or greedy tokens fall outside the
embedding."""

HYBRID_LAYERS: dict[str, dict[str, Any]] = {
    "lfm2": {"layer_types": ["conv", "full_attention"]},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"]},
    "bamba": {"attn_layer_indices": [1]},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1},
    "zamba": {"layer_types": ["hybrid", "hybrid"]},
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},
}
"""Hybrids whose two layers get one of each kind through other settings than `layer_types`, or
whose default `layer_types` does not show their kinds (all attention, or all Mamba). Zamba's are
two "hybrid" layers (each a Mamba block and the shared attention block): with one, transformers
5.24 cannot tie the shared block's weights to another layer's and fails to build it."""

FAMILY_SIZES: dict[str, dict[str, Any]] = {
    "mamba2": {"num_heads": 8, "n_groups": 2, "state_size": 16},
    "gemma3n_text": {"num_kv_shared_layers": 0, "vocab_size_per_layer_input": 1000,
                     "hidden_size_per_layer_input": 16, "laurel_rank": 16,
                     "layer_types": ["sliding_attention", "full_attention"], "activation_sparsity_pattern": [0.95, 0.0]},
    "gemma4_text": {"global_head_dim": 64, "vocab_size_per_layer_input": 1000, "hidden_size_per_layer_input": 16},
    "gemma4_unified_text": {"global_head_dim": 64, "vocab_size_per_layer_input": 1000,
                            "hidden_size_per_layer_input": 16},
    "dots1": {"n_shared_experts": 1},
    "zaya": {"num_experts_per_tok": 1},
    "qwen4_exp": {"indexer_n_heads": 4, "indexer_kv_heads": 1, "indexer_head_dim": 32, "indexer_budget": 64,
                  "indexer_compress_ratio": 4, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                  "linear_key_head_dim": 32, "linear_value_head_dim": 32, "hc_lowrank": 32},
    "cohere_compass_text": {"layer_types": ["sliding_attention", "full_attention"],
                            "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0,
                                                                      "mrope_section": [8, 4, 4]},
                                                "full_attention": None}},
    "dots3_note_text": {"layer_types": ["sliding_attention", "indexed_attention"], "index_n_heads": 4,
                        "index_head_dim": 32, "shared_experts_intermediate_size": 128,
                        "swa_num_attention_heads": 4, "swa_num_key_value_heads": 4, "swa_q_lora_rank": 64,
                        "swa_kv_lora_rank": 64, "swa_head_dim": 48, "swa_qk_nope_head_dim": 32, "swa_v_head_dim": 32},
    "deepseek_v4": {"compress_rates": {"compressed_sparse_attention": 1, "heavily_compressed_attention": 1}},
    "longcat_flash": {"zero_expert_num": 2},
    "cpmant": {"dim_ff": 256, "dim_head": 32, "init_std": 0.02},
    "big_bird": {"attention_type": "original_full"},
    "xmod": {"default_language": "en_XX"},
    "dbrx": {"attn_config": {"kv_n_heads": 2, "rope_theta": 500000.0, "clip_qkv": 8.0},
             "ffn_config": {"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2}},
}
"""A family's own settings that SIZES and WHERE_PRESENT do not reach or that their sizes break:
Mamba2's heads (hidden * expand = heads * head_dim, its default of 128 heads does not build) and
its groups and state; Gemma 3n's layer kinds (its default's first two are both sliding), one of
its first layers' sparse activations (a Gaussian top-k), its KV sharing over its last 15 layers
(with 2 layers no layer of a kind is left to produce the shared cache) and its per-layer input
embeddings (a default of 262144 x
256 per layer: 134M parameters); Gemma 4's full-attention head dim (default 512; kept at twice the
sliding layers' head dim, as in the default); Dots1's shared experts (None by default, which does not
build); ZAYA's one expert per token (its only supported routing); DBRX's K/V heads and experts,
which live in its sub-configs, and two settings without which transformers 5.24 cannot build or
run a DBRX of any size: a `rope_theta` in its attention sub-config, which its attention reads but
its attention config does not define (RoPE itself reads `rope_parameters`), and the QKV clip of
DBRX's checkpoints (8; its attention clamps with the default of None, which torch refuses);
Qwen4-Exp's token indexer (its indexed-attention layers build one, and with the default of no
indexer settings fail to), its gated-delta-rule heads and its hyper-connections' rank (defaults of
16 x 128 key and 32 x 128 value heads, and a rank of 320, for hidden 2048); Cohere Compass's RoPE
per layer kind (its default has none, which does not build): RoPE on its sliding layers and none
on its full ones, as Cohere's Command models, with multimodal RoPE sections that fit a head dim
of 32 (the default's 24 + 20 + 20 fit 128); dots.3 note's (text) layer kinds (its default's first
two are both indexed), its token indexer and shared experts, and the MLA heads of its sliding
layers, which it sets apart from the others (`swa_*`: 64 heads, latent 1024, for hidden 4096) with
the same shape as WHERE_PRESENT's (rope 16, nope 32, value 32, latent 64); BigBird's full
attention, which HF itself runs in place of its block-sparse one below 704 tokens (`(5 + 2 * num_random_blocks) * block_size`, with a warning),
so at the sweep's lengths in both; X-MOD's language adapter (HF raises without one); DeepSeek-V4's
KV compression rates (4 and 128 tokens a window by default): 1, the one rate at which the export
can keep the length dynamic (its compressor slices the longest multiple of the rate and branches
on whether any window is full, which torch.export fixes for one length with any other rate), so
each window is one token; LongCat-Flash's zero-compute (identity) experts beside its routed ones:
2 (256 by default), few like WHERE_PRESENT's routed experts, as its export runs every expert on
every token (`frontends/export_patches.METHODS`); CPM-Ant's FFN and head sizes, which it names
apart (`dim_ff`, default 10240; `dim_head`, default 128: 4 heads of 128 for hidden 128), as SIZES',
and its init's std, 0.02 as the other families' `initializer_range` (its default of 1.0 draws
weights N(0, 1): activations reach ~1500 and the logits ~42, where fp32 rounding alone, each
kernel within an ulp of its reference, passes the sweep's absolute tolerance of 1e-5)"""

SIZED_IN_TEXT_CONFIG = ("qwen4_exp",)
"""Families whose config wraps the causal LM's in `text_config` and does not pass the sizes on
to it (the sizes and settings go there instead)."""
NOT_ATTENTION = ("linear_attention", "conv", "mamba", "recurrent")
"""Layer kinds that mix positions without softmax attention (`layer_types` spellings)."""


def causal_lm_families() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


SCALED_WITH_HIDDEN = ("head_dim", "global_head_dim", "rotary_dim", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
                      "kv_lora_rank", "q_lora_rank", "moe_intermediate_size", "shared_expert_intermediate_size")
"""WHERE_PRESENT's sizes (set for SIZES' hidden 128) that scale with another hidden size, so that
heads times head_dim stays the hidden size."""


def small_config(family: str, layers: int | None = None, hidden_size: int | None = None,
                 overrides: Mapping[str, Any] | None = None) -> Any:
    """The family's config with the sweep's sizes (WHERE_PRESENT's where the config has them as
    settings, not as properties derived from others: Falcon's head_dim); `layers` and
    `hidden_size` (a multiple of 32: 4 heads, rotary dims of hidden / 8) replace the sweep's,
    the intermediate and head sizes following the hidden size. `overrides` are settings over
    all of those, given to the config's constructor so that what it derives from them follows
    (Dory's RoPE parameters per kind of `layer_types`)."""
    from transformers import AutoConfig

    if family not in causal_lm_families():
        raise ValueError(f"'{family}' is not a causal-LM model type of transformers (see "
                         "`python -m ad_mlir.bench.families --help`; e.g. llama, qwen3, phi3, gpt2)")
    sizes, where_present, own = dict(SIZES), dict(WHERE_PRESENT), dict(FAMILY_SIZES.get(family, {}))
    if layers is not None:
        sizes["num_hidden_layers"] = layers
    if hidden_size is not None:
        if hidden_size <= 0 or hidden_size % 32:
            raise ValueError(f"hidden size {hidden_size} must be a positive multiple of 32 (4 heads, rotary "
                             "dims of hidden / 8)")
        sizes.update(hidden_size=hidden_size, intermediate_size=2 * hidden_size)
        scale = hidden_size // 32
        where_present.update({k: where_present[k] * scale // 4 for k in SCALED_WITH_HIDDEN if k in where_present})
        own.update({k: v * scale // 4 for k, v in own.items() if k in SCALED_WITH_HIDDEN})
    defaults = AutoConfig.for_model(family)
    if family in SIZED_IN_TEXT_CONFIG:
        defaults = defaults.text_config
    derived = {k for k in where_present if isinstance(getattr(type(defaults), k, None), property)}
    present = {k: v for k, v in where_present.items() if _has_setting(defaults, k) and k not in derived}
    if "kv_lora_rank" in present:  # MLA: one latent for all heads, RoPE over the rope part of a head
        sizes["num_key_value_heads"] = sizes["num_attention_heads"]
        if "head_dim" in present:
            present["head_dim"] = present["qk_rope_head_dim"]
    if family == "dbrx":  # its experts take their hidden size from `d_model`, not from the `hidden_size` alias
        own["d_model"] = sizes["hidden_size"]
    if family == "gpt_neo":  # its default alternates global and local attention over 24 layers
        n = sizes["num_hidden_layers"]
        present["attention_types"] = [[["global", "local"], n // 2], *([[["global"], 1]] if n % 2 else [])]
    if sizes["num_hidden_layers"] == 2:
        present.update(hybrid_layers(family, defaults))
    settings = {**sizes, **present, **own, **(overrides or {})}
    if family in SIZED_IN_TEXT_CONFIG:
        return AutoConfig.for_model(family, text_config=settings)
    return AutoConfig.for_model(family, **settings)


def _has_setting(config: Any, name: str) -> bool:
    """Whether `config` has the setting `name`; a per-layer setting of a heterogeneous config
    (Gemma 4's head_dim) counts, though reading it from the whole config raises."""
    from transformers.integrations.heterogeneity.configuration_utils import (
        AmbiguousGlobalPerLayerAttributeError,
    )

    try:
        return hasattr(config, name)
    except AmbiguousGlobalPerLayerAttributeError:
        return True


def hybrid_layers(family: str, defaults: Any) -> dict[str, Any]:
    """Config keywords that give a hybrid's two layers one of each kind: its first layer kind
    without attention (Mamba, a convolution, a linear recurrence) and then its first attention
    kind (Zamba2's "hybrid": Mamba + shared attention; Nemotron-H's MoE and MLP layers skipped);
    {} for a model of one kind."""
    found = HYBRID_LAYERS.get(family)
    if found is None:
        kinds = list(dict.fromkeys(getattr(defaults, "layer_types", None) or []))
        mixer = next((k for k in kinds if k in NOT_ATTENTION), None)
        other = next((k for k in kinds if k not in NOT_ATTENTION and ("attention" in k or k == "hybrid")), None)
        found = {"layer_types": [mixer, other]} if mixer and other else {}
    # the config's own name for an aliased `layer_types` (Zamba2's `layers_block_type`): set
    # through the alias, what the config derives from it (its hybrid layer ids) would be stale
    aliases = getattr(type(defaults), "attribute_map", {})
    return {aliases.get(k, k): v for k, v in found.items()}


def small_model(family: str, layers: int | None = None, hidden_size: int | None = None) -> Any:
    """The family's causal LM built from `small_config` (random weights, biases not zero, fp32,
    eval mode)."""
    return model_from_config(small_config(family, layers, hidden_size))


def model_from_config(config: Any) -> Any:
    """A causal LM of `config` (random weights, biases not zero, fp32, eval mode)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # HF zero-initializes biases: a misplaced bias would go unseen
        for m in model.modules():
            if isinstance(m, torch.nn.Linear) and m.bias is not None:
                m.bias.normal_(std=0.02)
    return model.eval().float()
