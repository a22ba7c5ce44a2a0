"""The family sweep's small configs (`zoo/small.py`): a hybrid's two layers are one of each kind
(a layer without attention, then an attention layer), and MLA's heads keep DeepSeek-V3's shape
(K/V heads = heads, a query/key head dim other than the value's)."""

from __future__ import annotations

import pytest

from ad_mlir.zoo.small import FAMILY_SIZES, small_config

HYBRIDS = {
    "lfm2": ["conv", "full_attention"],
    "nemotron_h": ["linear_attention", "full_attention"],  # its MoE and MLP layer kinds skipped
    "qwen3_next": ["linear_attention", "full_attention"],
    "granitemoehybrid": ["linear_attention", "full_attention"],
    "bamba": ["linear_attention", "full_attention"],
    "jamba": ["linear_attention", "full_attention"],
    "zamba2": ["linear_attention", "hybrid"],
    "recurrent_gemma": ["linear_attention", "sliding_attention"],
    "qwen4_exp": ["linear_attention", "indexed_attention"],  # sized in its text_config
}


@pytest.mark.parametrize("family", list(HYBRIDS))
def test_a_hybrid_gets_one_layer_of_each_kind(family: str) -> None:
    config = small_config(family)
    config = getattr(config, "text_config", config)
    assert config.num_hidden_layers == 2 and list(config.layer_types) == HYBRIDS[family]


def test_what_zamba2_derives_from_its_layer_kinds_follows_them() -> None:
    """Zamba2's hybrid layer ids come from `layers_block_type` (set by its own name, not through
    the `layer_types` alias, after which they would still be the default's)."""
    assert small_config("zamba2").hybrid_layer_ids == [1]


def test_a_model_of_one_kind_keeps_its_layers() -> None:
    assert small_config("llama").num_hidden_layers == 2
    assert list(small_config("gemma2").layer_types) == ["sliding_attention", "full_attention"]


def test_mla_configs_keep_deepseek_v3s_head_shape() -> None:
    config = small_config("deepseek_v3")
    assert config.num_key_value_heads == config.num_attention_heads
    assert (config.qk_rope_head_dim, config.qk_nope_head_dim, config.v_head_dim) == (16, 32, 32)
    assert config.qk_nope_head_dim + config.qk_rope_head_dim != config.v_head_dim


def _parameters_on_meta(family: str) -> int:
    """The family's small model built on the meta device (its constructors run, where these
    families failed; no memory): its parameter count."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(small_config(family))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("family", sorted(FAMILY_SIZES))
def test_a_family_with_its_own_settings_builds_small(family: str) -> None:
    """Each family that needs settings of its own (FAMILY_SIZES) builds at the sweep's sizes, small
    (DeepSeek-V4 at 3.7M: its output LoRA rank of 1024 and 64 indexer heads are its defaults)."""
    assert 100_000 < _parameters_on_meta(family) < 4_000_000


def test_gemma4s_full_attention_layer_keeps_twice_the_head_dim() -> None:
    """Gemma 4's head dim is per layer (a heterogeneous config): its full-attention layer's
    follows the sliding layers' as in its default (512 : 256)."""
    config = small_config("gemma4_text")
    assert list(config.layer_types) == ["sliding_attention", "full_attention"]
    assert [config.per_layer_config[i].head_dim for i in range(2)] == [32, 64]


def test_zambas_two_layers_are_hybrid_and_build() -> None:
    """With one hybrid layer transformers cannot tie its shared attention block to another's."""
    assert list(small_config("zamba").layers_block_type) == ["hybrid", "hybrid"]
    assert _parameters_on_meta("zamba") < 1_000_000


@pytest.mark.parametrize("family", ["deepseek_v32", "glm_moe_dsa", "axk2", "hy_v4", "dots3_note_text"])
def test_a_token_indexer_keeps_fewer_keys_than_the_sweeps_lengths(family: str) -> None:
    """DeepSeek sparse attention's indexer keeps `min(index_topk, keys)` keys: below the sweep's
    lengths the selection drops keys (the default of 2048 would keep every one)."""
    from ad_mlir.bench.families import SEQ_LENS

    assert small_config(family).index_topk < min(SEQ_LENS)


def test_the_sweep_builds_the_dense_forms_hf_runs_at_its_lengths() -> None:
    """BigBird runs full attention below 704 tokens whatever its setting; X-MOD needs a language."""
    from ad_mlir.bench.families import MAX_SEQ, SEQ_LENS

    big_bird = small_config("big_bird")
    assert big_bird.attention_type == "original_full"
    assert max(SEQ_LENS) < (5 + 2 * big_bird.num_random_blocks) * big_bird.block_size  # HF's own switch
    assert MAX_SEQ > 704  # so the export needs the setting
    xmod = small_config("xmod")
    assert xmod.default_language in xmod.languages


@pytest.mark.parametrize("family", ["big_bird", "xmod"])
def test_the_sweeps_model_exports_with_a_dynamic_length(family: str) -> None:
    """The sizes above are what lets these families export (each failed before: BigBird's block-sparse
    guard `seq <= 704`, X-MOD's missing language); the exported program equals eager at another
    length than it was traced at. The indexer's and DeepSeek-V4's settings export in the committed
    sweep (`ad-bench --parts families --families hy_v4,deepseek_v4` checks them again: ~12 s here)."""
    import torch

    from ad_mlir.bench.families import _export
    from ad_mlir.zoo.small import model_from_config

    model = model_from_config(small_config(family))
    ids = torch.randint(1, 1000, (1, 11), generator=torch.Generator().manual_seed(0))
    ep = _export(model, ids[:, :5])
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(input_ids=ids).logits, model(input_ids=ids).logits)


@pytest.mark.parametrize("family", ["inkling2_text", "inkling2_loop_text"])
def test_the_lm_head_predicts_the_vocabulary(family: str) -> None:
    """Inkling's LM head has an output size of its own (`unpadded_vocab_size`): it is the
    vocabulary's, or greedy tokens fall outside the embedding (HF's own generate raised)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(small_config(family))
    assert model.get_output_embeddings().out_features == model.get_input_embeddings().num_embeddings == 1000


def test_the_generation_columns_layer_kinds_reach_what_the_config_derives() -> None:
    """The generation column gives Dory both of its layer kinds through the config's
    constructor, so its RoPE parameters per kind cover both (set afterwards, the model's
    rotary embedding found none for full attention and failed to build)."""
    import torch
    from transformers import AutoModelForCausalLM

    from ad_mlir.bench.families import generation_config

    config = generation_config("dory")
    assert list(config.layer_types) == ["sliding_attention", "full_attention"]
    assert set(config.rope_parameters) == {"sliding_attention", "full_attention"}
    with torch.device("meta"):
        AutoModelForCausalLM.from_config(config)


def test_the_sweeps_bf16_model_keeps_what_hf_keeps_in_fp32() -> None:
    """The sweep's bf16 model is loaded as `from_pretrained(dtype=torch.bfloat16)` loads it:
    Inkling2's router stays fp32 (`_keep_in_fp32_modules_strict`; after a plain
    `.to(torch.bfloat16)` its fp32 input met a bf16 weight and eager raised), the rest is the
    fp32 weights rounded to bf16."""
    import torch

    from ad_mlir.bench.families import _in_bf16
    from ad_mlir.zoo.small import small_model

    model = small_model("inkling2_text")
    bf16 = _in_bf16(model)
    gate = bf16.model.layers[0].mlp.gate.weight
    assert gate.dtype == torch.float32 and torch.equal(gate, model.model.layers[0].mlp.gate.weight)
    embedding = bf16.get_input_embeddings().weight
    assert torch.equal(embedding, model.get_input_embeddings().weight.to(torch.bfloat16))
    with torch.no_grad():  # eager runs (its softcapped logits come out in fp32)
        assert bf16(input_ids=torch.tensor([[5, 9, 13]])).logits.isfinite().all()
