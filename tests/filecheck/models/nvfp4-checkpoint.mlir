// A ModelOpt NVFP4 checkpoint (a one-layer tiny Qwen2, biases on q/k/v, written by
// ad_mlir.zoo.modelopt in nvidia/Llama-3.1-8B-Instruct-FP4's layout) through `ad-opt --model PATH
// -p default`: every projection is `ad.linear_nvfp4` on its ui8 packed codes, f8E4M3FN block
// scales and f32 global scale (function arguments, the checkpoint's tensors; `input_scale` is an
// argument no op reads), none is left a plain `ad.linear`; Q/K/V and gate/up are merged GEMMs over
// the concatenated codes, block scales and biases, the parts' global scales folded into one per
// row (`fuse-gemms`; computed once, at compile time); the norms and SiLU-mul around them fuse as in
// a bf16 model, and the LM head stays unquantized.
// RUN: rm -rf %t && %python -m ad_mlir.zoo.modelopt qwen2 %t --layers 1
// RUN: ad-opt --model %t -p default > %t.mlir
// RUN: filecheck %s < %t.mlir
// RUN: filecheck %s --check-prefix=GONE < %t.mlir

// CHECK: func.func @forward(
// CHECK-SAME: %p_model_layers_0_self_attn_q_proj_weight: tensor<64x32xui8> {ad.param = "model.layers.0.self_attn.q_proj.weight"}
// CHECK-SAME: %p_model_layers_0_self_attn_q_proj_weight_scale: tensor<64x4xf8E4M3FN> {ad.param = "model.layers.0.self_attn.q_proj.weight_scale"}
// CHECK-SAME: %[[QG:[a-z0-9_]+]]: tensor<f32> {ad.param = "model.layers.0.self_attn.q_proj.weight_scale_2"}
// CHECK-SAME: %p_model_layers_0_self_attn_q_proj_input_scale: tensor<f32> {ad.param = "model.layers.0.self_attn.q_proj.input_scale"}
// CHECK-SAME: %p_lm_head_weight: tensor<128x64xf32>
// CHECK: %[[N:.*]] = ad.rms_norm
// CHECK: %[[QKV_W:.*]] = ad.cat %p_model_layers_0_self_attn_q_proj_weight, %p_model_layers_0_self_attn_k_proj_weight, %p_model_layers_0_self_attn_v_proj_weight dim 0 : (tensor<64x32xui8>, tensor<32x32xui8>, tensor<32x32xui8>) -> tensor<128x32xui8>
// CHECK: %[[QG_ROWS:.*]] = ad.expand %[[QG]] [64] : tensor<f32> -> tensor<64xf32>
// CHECK: %[[QKV_S:.*]] = ad.cat %p_model_layers_0_self_attn_q_proj_weight_scale, %p_model_layers_0_self_attn_k_proj_weight_scale, %p_model_layers_0_self_attn_v_proj_weight_scale dim 0 : (tensor<64x4xf8E4M3FN>, tensor<32x4xf8E4M3FN>, tensor<32x4xf8E4M3FN>) -> tensor<128x4xf8E4M3FN>
// CHECK: %[[QKV_G:.*]] = ad.cat %[[QG_ROWS]], %{{.*}}, %{{.*}} dim 0 : (tensor<64xf32>, tensor<32xf32>, tensor<32xf32>) -> tensor<128xf32>
// CHECK: %[[QKV_B:.*]] = ad.cat %p_model_layers_0_self_attn_q_proj_bias, %p_model_layers_0_self_attn_k_proj_bias, %p_model_layers_0_self_attn_v_proj_bias dim 0
// CHECK: %[[QKV:.*]] = ad.linear_nvfp4 %[[N]], %[[QKV_W]], %[[QKV_S]], %[[QKV_G]] bias %[[QKV_B]] : (tensor<1x?x64xf32>, tensor<128x32xui8>, tensor<128x4xf8E4M3FN>, tensor<128xf32>, tensor<128xf32>) -> tensor<1x?x128xf32>
// CHECK: ad.slice %[[QKV]] dim 2 [0, 64, 1]
// CHECK: %[[O:.*]] = ad.linear_nvfp4 %{{.*}}, %p_model_layers_0_self_attn_o_proj_weight, %p_model_layers_0_self_attn_o_proj_weight_scale, %{{.*}} : (tensor<1x?x64xf32>, tensor<64x32xui8>, tensor<64x4xf8E4M3FN>, tensor<f32>) -> tensor<1x?x64xf32>
// CHECK: %[[H:.*]], %{{.*}} = ad.add_rms_norm %{{.*}}, %[[O]]
// CHECK: %[[GU_W:.*]] = ad.cat %p_model_layers_0_mlp_gate_proj_weight, %p_model_layers_0_mlp_up_proj_weight dim 0
// CHECK: %[[GU_S:.*]] = ad.cat %p_model_layers_0_mlp_gate_proj_weight_scale, %p_model_layers_0_mlp_up_proj_weight_scale dim 0
// CHECK: %[[GU_G:.*]] = ad.cat %{{.*}}, %{{.*}} dim 0 : (tensor<128xf32>, tensor<128xf32>) -> tensor<256xf32>
// CHECK: %[[GU:.*]] = ad.linear_nvfp4 %[[H]], %[[GU_W]], %[[GU_S]], %[[GU_G]] : (tensor<1x?x64xf32>, tensor<256x32xui8>, tensor<256x4xf8E4M3FN>, tensor<256xf32>) -> tensor<1x?x256xf32>
// CHECK: %[[G:.*]] = ad.slice %[[GU]] dim 2 [0, 128, 1]
// CHECK: %[[U:.*]] = ad.slice %[[GU]] dim 2 [128, 256, 1]
// CHECK: %[[A:.*]] = ad.silu_and_mul %[[G]], %[[U]]
// CHECK: ad.linear_nvfp4 %[[A]], %p_model_layers_0_mlp_down_proj_weight, %p_model_layers_0_mlp_down_proj_weight_scale, %{{.*}} : (tensor<1x?x128xf32>, tensor<64x64xui8>, tensor<64x8xf8E4M3FN>, tensor<f32>) -> tensor<1x?x64xf32>
// CHECK: ad.linear %{{.*}}, %p_lm_head_weight

// GONE-NOT: ad.linear %{{.*}}, %p_model_layers
// GONE-NOT: {{= ad\..*_input_scale}}
// GONE: ad.linear %{{.*}}, %p_lm_head_weight
// GONE-NOT: ad.linear
