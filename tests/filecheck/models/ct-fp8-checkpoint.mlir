// A compressed-tensors FP8-dynamic checkpoint (a one-layer tiny Llama written by ad_mlir.zoo.ct_fp8
// in Red Hat / Neural Magic's layout: fp8 weights, per-channel weight_scale) through
// `ad-opt --model PATH -p default`: every projection is `ad.linear_fp8` on its f8E4M3FN weight and
// its f32 [N, 1] scale (function arguments, the checkpoint's tensors) and on an activation
// quantized per token (`ad.quantize_fp8_dynamic per_token`), fused into the RMSNorm before
// (input and post-attention norms) and into SiLU-mul before down; Q/K/V and gate/up are fused
// GEMMs over the concatenated fp8 weights and [N, 1] scales (`fuse-gemms`); no projection is left
// a plain `ad.linear` and nothing is dequantized; the LM head stays unquantized.
// RUN: rm -rf %t && %python -m ad_mlir.zoo.ct_fp8 llama %t --layers 1
// RUN: ad-opt --model %t -p default > %t.mlir
// RUN: filecheck %s < %t.mlir
// RUN: filecheck %s --check-prefix=GONE < %t.mlir

// CHECK: func.func @forward(
// CHECK-SAME: %p_model_layers_0_self_attn_q_proj_weight: tensor<64x64xf8E4M3FN> {ad.param = "model.layers.0.self_attn.q_proj.weight"}
// CHECK-SAME: %p_model_layers_0_self_attn_q_proj_weight_scale: tensor<64x1xf32> {ad.param = "model.layers.0.self_attn.q_proj.weight_scale"}
// CHECK-SAME: %p_lm_head_weight: tensor<128x64xf32>
// CHECK: %[[Q:[a-z0-9_]+]], %[[S:[a-z0-9_]+]] = ad.fused(%{{.*}}, %p_model_layers_0_input_layernorm_weight)
// CHECK: ad.rms_norm
// CHECK-NEXT: ad.quantize_fp8_dynamic %{{.*}} per_token : tensor<1x?x64xf32> -> (tensor<1x?x64xf8E4M3FN>, tensor<1x?x1xf32>)
// CHECK: %[[QKV_W:[a-z0-9_]+]] = ad.cat %p_model_layers_0_self_attn_q_proj_weight, %p_model_layers_0_self_attn_k_proj_weight, %p_model_layers_0_self_attn_v_proj_weight dim 0 : (tensor<64x64xf8E4M3FN>, tensor<32x64xf8E4M3FN>, tensor<32x64xf8E4M3FN>) -> tensor<128x64xf8E4M3FN>
// CHECK: %[[QKV_S:[a-z0-9_]+]] = ad.cat %p_model_layers_0_self_attn_q_proj_weight_scale, %p_model_layers_0_self_attn_k_proj_weight_scale, %p_model_layers_0_self_attn_v_proj_weight_scale dim 0 : (tensor<64x1xf32>, tensor<32x1xf32>, tensor<32x1xf32>) -> tensor<128x1xf32>
// CHECK: %[[QKV:[a-z0-9_]+]] = ad.linear_fp8 %[[Q]], %[[QKV_W]], %[[S]], %[[QKV_S]] : (tensor<1x?x64xf8E4M3FN>, tensor<128x64xf8E4M3FN>, tensor<1x?x1xf32>, tensor<128x1xf32>) -> tensor<1x?x128xf32>
// CHECK: ad.slice %[[QKV]] dim 2 [0, 64, 1]
// CHECK: %[[OQ:[a-z0-9_]+]], %[[OS:[a-z0-9_]+]] = ad.quantize_fp8_dynamic %{{.*}} per_token
// CHECK: %[[O:[a-z0-9_]+]] = ad.linear_fp8 %[[OQ]], %p_model_layers_0_self_attn_o_proj_weight, %[[OS]], %p_model_layers_0_self_attn_o_proj_weight_scale
// CHECK: %{{.*}}, %[[HQ:[a-z0-9_]+]], %[[HS:[a-z0-9_]+]] = ad.fused(%{{.*}}, %[[O]],
// CHECK: ad.add_rms_norm
// CHECK-NEXT: ad.quantize_fp8_dynamic %{{.*}} per_token
// CHECK: %[[GU_W:[a-z0-9_]+]] = ad.cat %p_model_layers_0_mlp_gate_proj_weight, %p_model_layers_0_mlp_up_proj_weight dim 0
// CHECK: %[[GU_S:[a-z0-9_]+]] = ad.cat %p_model_layers_0_mlp_gate_proj_weight_scale, %p_model_layers_0_mlp_up_proj_weight_scale dim 0 : (tensor<128x1xf32>, tensor<128x1xf32>) -> tensor<256x1xf32>
// CHECK: %[[GU:[a-z0-9_]+]] = ad.linear_fp8 %[[HQ]], %[[GU_W]], %[[HS]], %[[GU_S]] : (tensor<1x?x64xf8E4M3FN>, tensor<256x64xf8E4M3FN>, tensor<1x?x1xf32>, tensor<256x1xf32>) -> tensor<1x?x256xf32>
// CHECK: %[[G:[a-z0-9_]+]] = ad.slice %[[GU]] dim 2 [0, 128, 1]
// CHECK: %[[U:[a-z0-9_]+]] = ad.slice %[[GU]] dim 2 [128, 256, 1]
// CHECK: %[[AQ:[a-z0-9_]+]], %[[AS:[a-z0-9_]+]] = ad.fused(%[[G]], %[[U]])
// CHECK: ad.silu_and_mul
// CHECK-NEXT: ad.quantize_fp8_dynamic %{{.*}} per_token : tensor<1x?x128xf32> -> (tensor<1x?x128xf8E4M3FN>, tensor<1x?x1xf32>)
// CHECK: ad.linear_fp8 %[[AQ]], %p_model_layers_0_mlp_down_proj_weight, %[[AS]], %p_model_layers_0_mlp_down_proj_weight_scale : (tensor<1x?x128xf8E4M3FN>, tensor<64x128xf8E4M3FN>, tensor<1x?x1xf32>, tensor<64x1xf32>) -> tensor<1x?x64xf32>
// CHECK: ad.linear %{{.*}}, %p_lm_head_weight

// GONE-NOT: ad.linear %{{.*}}, %p_model_layers
// GONE-NOT: ad.dequantize_fp8
// GONE: ad.linear %{{.*}}, %p_lm_head_weight
// GONE-NOT: ad.linear
