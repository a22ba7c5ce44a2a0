// The default pipeline on two-layer LayerNorm families (bf16, built small from their HF configs):
// GPT-2 (pre-norm, LayerNorm with bias) has one add_layer_norm per norm: the residual add (or,
// for the first, the embeddings' sum) joins every norm, the sum going on to the next residual.
// Falcon (parallel attention: one norm feeds attention and MLP) has one norm per layer; from the
// second layer on it takes the residual add, and its one result feeds both branches (one linear:
// fuse-gemms concatenates Q/K/V (192 rows) and the MLP's up projection (512)). The
// graph of core ATen ops (`--decompose`: native_layer_norm) reaches the same ops.
// RUN: ad-opt --model gpt2 --layers 2 --dtype bfloat16 -p default --print-debuginfo | filecheck %s --check-prefix=GPT2
// RUN: ad-opt --model gpt2 --layers 2 --dtype bfloat16 --decompose -p default | filecheck %s --check-prefix=GONE
// RUN: ad-opt --model falcon --layers 2 --dtype bfloat16 -p default --print-debuginfo > %t.falcon
// RUN: filecheck %s --check-prefix=FALCON < %t.falcon
// RUN: filecheck %s --check-prefix=GONE < %t.falcon

// No LayerNorm is left to torch, and nothing of its math is spelled out.
// GONE:      func.func @forward
// GONE-NOT:  aten.layer_norm
// GONE-NOT:  aten.native_layer_norm
// GONE-NOT:  ad.rsqrt
// GONE-NOT:  ad.mean

// GPT2:      %[[N0:.*]], %[[H0:.*]] = ad.add_layer_norm %embedding, %embedding_1 weight %p_transformer_h_0_ln_1_weight bias %p_transformer_h_0_ln_1_bias eps 1.000000e-05 : (tensor<1x?x128xbf16>, tensor<1x?x128xbf16> weight tensor<128xbf16> bias tensor<128xbf16>) -> (tensor<1x?x128xbf16>, tensor<1x?x128xbf16>) loc("transformer.h.0.ln_1")
// GPT2:      ad.addmm {{.*}} loc("transformer.h.0.attn.c_attn")
// GPT2:      ad.attention
// GPT2:      ad.addmm {{.*}} loc("transformer.h.0.attn.c_proj")
// GPT2:      %[[N1:.*]], %[[H1:.*]] = ad.add_layer_norm %{{.*}}, %[[H0]] weight %p_transformer_h_0_ln_2_weight bias %p_transformer_h_0_ln_2_bias {{.*}} loc("transformer.h.0.ln_2")
// GPT2:      ad.addmm {{.*}} loc("transformer.h.0.mlp.c_fc")
// GPT2:      ad.fused
// GPT2:      ad.addmm {{.*}} loc("transformer.h.0.mlp.c_proj")
// GPT2-NEXT: ad.reshape
// GPT2-NEXT: %{{.*}}, %[[H2:.*]] = ad.add_layer_norm %[[H1]], %{{.*}} weight %p_transformer_h_1_ln_1_weight bias %p_transformer_h_1_ln_1_bias {{.*}} loc("transformer.h.1.ln_1")
// GPT2:      ad.add_layer_norm %{{.*}}, %[[H2]] weight %p_transformer_h_1_ln_2_weight {{.*}} loc("transformer.h.1.ln_2")
// GPT2:      %[[NF:.*]], %{{.*}} = ad.add_layer_norm {{.*}} weight %p_transformer_ln_f_weight bias %p_transformer_ln_f_bias {{.*}} loc("transformer.ln_f")
// GPT2-NEXT: ad.linear %[[NF]], %p_lm_head_weight

// FALCON:      %[[N0:.*]] = ad.layer_norm %embedding weight %p_transformer_h_0_input_layernorm_weight bias %p_transformer_h_0_input_layernorm_bias eps 1.000000e-05 : (tensor<1x?x128xbf16> weight tensor<128xbf16> bias tensor<128xbf16>) -> tensor<1x?x128xbf16> loc("transformer.h.0.input_layernorm")
// FALCON:      ad.linear %[[N0]], %{{.*}} : (tensor<1x?x128xbf16>, tensor<704x128xbf16>) -> tensor<1x?x704xbf16> loc("transformer.h.0.self_attention.query_key_value")
// FALCON:      %[[N1:.*]], %[[H1:.*]] = ad.add_layer_norm %embedding, %{{.*}} weight %p_transformer_h_1_input_layernorm_weight {{.*}} loc("transformer.h.1.input_layernorm")
// FALCON:      ad.linear %[[N1]], %{{.*}} : (tensor<1x?x128xbf16>, tensor<704x128xbf16>) -> tensor<1x?x704xbf16> loc("transformer.h.1.self_attention.query_key_value")
// FALCON:      ad.add_layer_norm %[[H1]], %{{.*}} weight %p_transformer_ln_f_weight {{.*}} loc("transformer.ln_f")
