// fuse-rope-attention on tiny HF models (default pipeline): the attention masks HF builds from
// the positions become the op's own masking (Mistral's sliding window and Llama's causal mask:
// llm-fusions.mlir checks them, WINDOW and CAUSAL, on its bf16 outputs of those models, and
// Gemma2's soft-capped attention, GEMMA2, on its bf16 output).
// Qwen3's and Gemma3's QK-norms (an RMSNorm of each q and k head before RoPE) run in the
// attention's prologue: the op takes their weights, and the only norms left are the layers'
// own. OLMo2's QK-norm normalizes the whole q/k projection, which a per-head prologue cannot:
// its two norms stay kernels of their own.
// RUN: ad-opt --model qwen3 --layers 1 -p default | filecheck %s --check-prefix=QWEN3
// RUN: ad-opt --model gemma3_text --layers 1 -p default | filecheck %s --check-prefix=GEMMA3
// RUN: ad-opt --model olmo2 --layers 1 -p default | filecheck %s --check-prefix=OLMO2

// QWEN3:      ad.rms_norm %{{.*}} weight %p_model_layers_0_input_layernorm_weight
// QWEN3-NOT:  ad.rms_norm
// QWEN3:      ad.rope_attention %{{.*}}, %{{.*}}, %{{.*}} rope %{{.*}}, %{{.*}} qk_norm(%p_model_layers_0_self_attn_q_norm_weight, %p_model_layers_0_self_attn_k_norm_weight : tensor<32xf32>, tensor<32xf32>) eps 1.000000e-06 causal scale 0.17677669529663689 : (tensor<1x4x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x?x32xf32>, tensor<1x?x32xf32>) -> tensor<1x4x?x32xf32>
// QWEN3-NOT:  ad.rms_norm %{{.*}} weight %p_model_layers_0_self_attn

// GEMMA3:     ad.rms_norm %{{.*}} weight %p_model_layers_0_input_layernorm_weight
// GEMMA3-NOT: ad.rms_norm
// GEMMA3:     ad.rope_attention %{{.*}}, %{{.*}}, %{{.*}} rope %{{.*}}, %{{.*}} qk_norm(%p_model_layers_0_self_attn_q_norm_weight, %p_model_layers_0_self_attn_k_norm_weight : tensor<32xf32>, tensor<32xf32>) eps 1.000000e-06 offset 1.000000e+00 weight_in_fp32 causal window 4096 scale 6.250000e-02 :
// GEMMA3-NOT: ad.rms_norm %{{.*}} weight %p_model_layers_0_self_attn

// OLMO2:      ad.rms_norm %{{.*}} weight %p_model_layers_0_self_attn_q_norm_weight eps 1.000000e-05 : (tensor<1x?x128xf32>, tensor<128xf32>) -> tensor<1x?x128xf32>
// OLMO2-NEXT: ad.rms_norm %{{.*}} weight %p_model_layers_0_self_attn_k_norm_weight eps 1.000000e-05 : (tensor<1x?x64xf32>, tensor<64xf32>) -> tensor<1x?x64xf32>
// OLMO2:      ad.rope_attention %{{.*}}, %{{.*}}, %{{.*}} rope %{{.*}}, %{{.*}} causal scale
