"""Every causal-LM model type that transformers maps in `AutoModelForCausalLM`, built small
from its config class (random weights): the sizes of the family sweep (`ad_mlir.bench.families`)."""

from __future__ import annotations

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
    "unpadded_vocab_size": SIZES["vocab_size"],
}
"""Set where the config has them: the LM head's vocabulary where it is a field of its own
(Inkling2's `unpadded_vocab_size`: left at its default, the head's ids run past the embedding's), head sizes its defaults would not derive from SIZES (a
default head_dim of 128 or rotary_dim of 64 with 4 heads of hidden 128 does not build or
export), and a few experts (a default of 64-256 experts is slow to export) with a small shared
expert (Qwen2-MoE's default of 5632 runs as 88 virtual experts of 64 in `ad.moe`). MLA's
(DeepSeek-V2/V3) head parts keep DeepSeek-V3's ratios, rope 64 : nope 128 : value 128 : latent 512
(here 16 : 32 : 32 : 64), so that the query/key head dim (48) differs from the value's (32)."""

HYBRID_LAYERS: dict[str, dict[str, Any]] = {
    "lfm2": {"layer_types": ["conv", "full_attention"]},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"]},
    "bamba": {"attn_layer_indices": [1]},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1},
    "zamba": {"layer_types": ["linear_attention", "hybrid"]},
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},
}
"""Hybrids whose two layers get one of each kind through other settings than `layer_types`, or
whose default `layer_types` does not show their kinds (all attention, or all Mamba)."""
NOT_ATTENTION = ("linear_attention", "conv", "mamba", "recurrent")
"""Layer kinds that mix positions without softmax attention (`layer_types` spellings)."""


def causal_lm_families() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


SCALED_WITH_HIDDEN = ("head_dim", "rotary_dim", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
                      "kv_lora_rank", "q_lora_rank", "moe_intermediate_size", "shared_expert_intermediate_size")
"""WHERE_PRESENT's sizes (set for SIZES' hidden 128) that scale with another hidden size, so that
heads times head_dim stays the hidden size."""


def small_config(family: str, layers: int | None = None, hidden_size: int | None = None) -> Any:
    """The family's config with the sweep's sizes (WHERE_PRESENT's where the config has them as
    settings, not as properties derived from others: Falcon's head_dim); `layers` and
    `hidden_size` (a multiple of 32: 4 heads, rotary dims of hidden / 8) replace the sweep's,
    the intermediate and head sizes following the hidden size."""
    from transformers import AutoConfig

    if family not in causal_lm_families():
        raise ValueError(f"'{family}' is not a causal-LM model type of transformers (see "
                         "`python -m ad_mlir.bench.families --help`; e.g. llama, qwen3, phi3, gpt2)")
    sizes, where_present = dict(SIZES), dict(WHERE_PRESENT)
    if layers is not None:
        sizes["num_hidden_layers"] = layers
    if hidden_size is not None:
        if hidden_size <= 0 or hidden_size % 32:
            raise ValueError(f"hidden size {hidden_size} must be a positive multiple of 32 (4 heads, rotary "
                             "dims of hidden / 8)")
        sizes.update(hidden_size=hidden_size, intermediate_size=2 * hidden_size)
        scale = hidden_size // 32
        where_present.update({k: where_present[k] * scale // 4 for k in SCALED_WITH_HIDDEN})
    defaults = AutoConfig.for_model(family)
    derived = {k for k in where_present if isinstance(getattr(type(defaults), k, None), property)}
    present = {k: v for k, v in where_present.items() if hasattr(defaults, k) and k not in derived}
    if "kv_lora_rank" in present:  # MLA: one latent for all heads, RoPE over the rope part of a head
        sizes["num_key_value_heads"] = sizes["num_attention_heads"]
        if "head_dim" in present:
            present["head_dim"] = present["qk_rope_head_dim"]
    if family == "gpt_neo":  # its default alternates global and local attention over 24 layers
        n = sizes["num_hidden_layers"]
        present["attention_types"] = [[["global", "local"], n // 2], *([[["global"], 1]] if n % 2 else [])]
    if sizes["num_hidden_layers"] == 2:
        present.update(hybrid_layers(family, defaults))
    return AutoConfig.for_model(family, **sizes, **present)


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
