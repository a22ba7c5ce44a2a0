// The default pipeline on two-layer tiny HF models (bf16): per decoder layer one RMSNorm op per
// norm (the residual add fused into every norm that follows one), one rope_attention (RoPE,
// repeat_kv and SDPA in one kernel) and one silu_and_mul (the SiLU MLPs) or gelu_and_mul
// (Gemma's tanh GELU) over the fused gate/up GEMM; the spellings they replace are gone.
// RUN: ad-opt --model llama --layers 2 --dtype bfloat16 -p default --print-debuginfo > %t.llama
// RUN: filecheck %s --check-prefixes=CHECK,SILU < %t.llama
// RUN: filecheck %s --check-prefix=GONE < %t.llama
// RUN: filecheck %s --check-prefix=CAUSAL < %t.llama
// RUN: ad-opt --model qwen2 --layers 2 --dtype bfloat16 -p default --print-debuginfo | filecheck %s --check-prefixes=CHECK,SILU
// RUN: ad-opt --model mistral --layers 2 --dtype bfloat16 -p default --print-debuginfo > %t.mistral
// RUN: filecheck %s --check-prefixes=CHECK,SILU < %t.mistral
// RUN: filecheck %s --check-prefix=WINDOW < %t.mistral
// RUN: ad-opt --model gemma --layers 2 --dtype bfloat16 -p default --print-debuginfo > %t.gemma
// RUN: filecheck %s --check-prefixes=CHECK,GELU < %t.gemma
// RUN: filecheck %s --check-prefix=GONE < %t.gemma
// RUN: ad-opt --model gemma2 --layers 2 --dtype bfloat16 -p default --print-debuginfo | filecheck %s --check-prefix=GEMMA2

// Nothing of the replaced spellings is left anywhere (regions included).
// GONE:      func.func @forward
// GONE-NOT:  ad.rsqrt
// GONE-NOT:  ad.mean
// GONE-NOT:  ad.attention
// GONE-NOT:  ad.silu{{ }}
// GONE-NOT:  ad.gelu{{ }}
// GONE-NOT:  ad.neg

// CHECK:      ad.rms_norm %{{.*}} weight %p_model_layers_0_input_layernorm_weight {{.*}} loc("model.layers.0.input_layernorm")
// CHECK:      ad.cat %p_model_layers_0_self_attn_q_proj_weight, %p_model_layers_0_self_attn_k_proj_weight, %p_model_layers_0_self_attn_v_proj_weight dim 0
// CHECK:      ad.rope_attention {{.*}} loc("model.layers.0.self_attn")
// CHECK:      ad.add_rms_norm %{{.*}}, %{{.*}} weight %p_model_layers_0_post_attention_layernorm_weight {{.*}} loc("model.layers.0.post_attention_layernorm")
// CHECK:      ad.cat %p_model_layers_0_mlp_gate_proj_weight, %p_model_layers_0_mlp_up_proj_weight dim 0
// CHECK-NEXT: %[[GU:.*]] = ad.linear
// CHECK-NEXT: %[[G:.*]] = ad.slice %[[GU]] dim 2 [0, 128, 1]
// CHECK-NEXT: %[[U:.*]] = ad.slice %[[GU]] dim 2 [128, 256, 1]
// SILU-NEXT:  ad.silu_and_mul %[[G]], %[[U]] {{.*}} loc("model.layers.0.mlp")
// GELU-NEXT:  ad.gelu_and_mul %[[G]], %[[U]] approximate "tanh" {{.*}} loc("model.layers.0.mlp")
// CHECK:      ad.add_rms_norm %{{.*}}, %{{.*}} weight %p_model_layers_1_input_layernorm_weight {{.*}} loc("model.layers.1.input_layernorm")
// CHECK:      ad.rope_attention {{.*}} loc("model.layers.1.self_attn")
// CHECK:      ad.add_rms_norm %{{.*}}, %{{.*}} weight %p_model_layers_1_post_attention_layernorm_weight
// SILU:       ad.silu_and_mul
// GELU:       ad.gelu_and_mul
// CHECK:      ad.add_rms_norm %{{.*}}, %{{.*}} weight %p_model_norm_weight {{.*}} loc("model.norm")
// CHECK-NOT:  ad.rms_norm
// CHECK-NOT:  ad.rope_attention
// CHECK-NOT:  ad.silu

// Gemma2 computes attention with a logit soft-cap (HF's eager matmul, tanh, softmax), not SDPA:
// fuse-rope-attention matches that chain too, one rope_attention soft-capped at 50 (layer 0's
// in its sliding window of 4096), the scale query_pre_attn_scalar^-0.5 = 256^-0.5. Its four
// norms per layer are matched; the pre-feedforward and the next layer's input norm take the
// residual adds. The only tanh left is the final logit soft-capping.
// GEMMA2:      func.func @forward
// GEMMA2-NOT:  aten.diff
// GEMMA2-NOT:  ad.exp
// GEMMA2:      ad.rms_norm %{{.*}} weight %p_model_layers_0_input_layernorm_weight
// GEMMA2-NOT:  ad.matmul
// GEMMA2-NOT:  ad.exp
// GEMMA2:      ad.rope_attention %{{.*}}, %{{.*}}, %{{.*}} rope %{{.*}}, %{{.*}} causal window 4096 softcap 5.000000e+01 scale 6.250000e-02 : {{.*}} loc("model.layers.0.self_attn")
// GEMMA2-NOT:  ad.exp
// GEMMA2:      ad.rms_norm %{{.*}} weight %p_model_layers_0_post_attention_layernorm_weight
// GEMMA2-NEXT: ad.add_rms_norm %{{.*}}, %{{.*}} weight %p_model_layers_0_pre_feedforward_layernorm_weight
// GEMMA2:      ad.rms_norm %{{.*}} weight %p_model_layers_0_post_feedforward_layernorm_weight
// GEMMA2-NEXT: ad.add_rms_norm %{{.*}}, %{{.*}} weight %p_model_layers_1_input_layernorm_weight
// GEMMA2:      ad.rope_attention %{{.*}}, %{{.*}}, %{{.*}} rope %{{.*}}, %{{.*}} causal softcap 5.000000e+01 scale 6.250000e-02 : {{.*}} loc("model.layers.1.self_attn")
// GEMMA2-NOT:  ad.rope{{ }}
// GEMMA2-NOT:  ad.matmul
// GEMMA2-NOT:  ad.exp
// GEMMA2-NOT:  ad.rsqrt
// GEMMA2:      ad.tanh
// GEMMA2-NOT:  ad.tanh

// fuse-rope-attention: the attention masks HF builds from the positions become the op's own
// masking. Mistral's sliding window (its config's 4096) becomes `causal window 4096` and Llama's
// causal mask `causal`; nothing of their computation (position comparisons, packed-sequence
// checks) is left.
// WINDOW:      func.func @forward
// WINDOW-NOT:  aten.diff
// WINDOW-NOT:  aten.cumsum
// WINDOW-NOT:  aten.index
// WINDOW-NOT:  ad.le
// WINDOW-NOT:  ad.gt
// WINDOW:      ad.rope_attention %{{.*}}, %{{.*}}, %{{.*}} rope %{{.*}}, %{{.*}} causal window 4096 scale 0.17677669529663689 : (tensor<1x2x?x32xbf16>, tensor<1x1x?x32xbf16>, tensor<1x1x?x32xbf16>, tensor<1x?x32xbf16>, tensor<1x?x32xbf16>) -> tensor<1x2x?x32xbf16>
// WINDOW:      ad.rope_attention %{{.*}} causal window 4096 scale
// WINDOW-NOT:  ad.rope_attention

// CAUSAL:      func.func @forward
// CAUSAL-NOT:  aten.diff
// CAUSAL-NOT:  ad.le
// CAUSAL:      ad.rope_attention %{{.*}}, %{{.*}}, %{{.*}} rope %{{.*}}, %{{.*}} causal scale 0.17677669529663689 : (tensor<1x2x?x32xbf16>, tensor<1x1x?x32xbf16>, tensor<1x1x?x32xbf16>, tensor<1x?x32xbf16>, tensor<1x?x32xbf16>) -> tensor<1x2x?x32xbf16>
// CAUSAL:      ad.rope_attention %{{.*}} causal scale
// CAUSAL-NOT:  ad.rope_attention
