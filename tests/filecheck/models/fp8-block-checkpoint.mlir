// A fine-grained FP8 checkpoint (a one-layer tiny Llama written by ad_mlir.zoo.quantized in
// Qwen3-FP8's layout, blocks [16, 32]) through `ad-opt --model PATH -p default`: every projection
// is `ad.linear_fp8_block` on its f8E4M3FN weight and f32 block scales (function arguments, the
// checkpoint's tensors), none is left a plain `ad.linear`; Q/K/V and gate/up are fused GEMMs over
// the concatenated fp8 weights and scales (`fuse-gemms`; computed once, at compile time); the norms
// and SiLU-mul around them fuse as in a bf16 model, and the LM head stays unquantized.
// RUN: rm -rf %t && %python -m ad_mlir.zoo.quantized llama %t --layers 1 --block-size 16 32
// RUN: ad-opt --model %t -p default > %t.mlir
// RUN: filecheck %s < %t.mlir
// RUN: filecheck %s --check-prefix=GONE < %t.mlir

// CHECK: func.func @forward(
// CHECK-SAME: %p_model_layers_0_self_attn_q_proj_weight: tensor<64x64xf8E4M3FN> {ad.param = "model.layers.0.self_attn.q_proj.weight"}
// CHECK-SAME: %p_model_layers_0_self_attn_q_proj_weight_scale_inv: tensor<4x2xf32> {ad.param = "model.layers.0.self_attn.q_proj.weight_scale_inv"}
// CHECK-SAME: %p_lm_head_weight: tensor<128x64xf32>
// CHECK: %[[N:.*]] = ad.rms_norm
// CHECK: %[[QKV_W:.*]] = ad.cat %p_model_layers_0_self_attn_q_proj_weight, %p_model_layers_0_self_attn_k_proj_weight, %p_model_layers_0_self_attn_v_proj_weight dim 0 : (tensor<64x64xf8E4M3FN>, tensor<32x64xf8E4M3FN>, tensor<32x64xf8E4M3FN>) -> tensor<128x64xf8E4M3FN>
// CHECK: %[[QKV_S:.*]] = ad.cat %p_model_layers_0_self_attn_q_proj_weight_scale_inv, %p_model_layers_0_self_attn_k_proj_weight_scale_inv, %p_model_layers_0_self_attn_v_proj_weight_scale_inv dim 0 : (tensor<4x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<8x2xf32>
// CHECK: %[[QKV:.*]] = ad.linear_fp8_block %[[N]], %[[QKV_W]], %[[QKV_S]] block [16, 32] : (tensor<1x?x64xf32>, tensor<128x64xf8E4M3FN>, tensor<8x2xf32>) -> tensor<1x?x128xf32>
// CHECK: ad.slice %[[QKV]] dim 2 [0, 64, 1]
// CHECK: %[[O:.*]] = ad.linear_fp8_block %{{.*}}, %p_model_layers_0_self_attn_o_proj_weight, %p_model_layers_0_self_attn_o_proj_weight_scale_inv block [16, 32] : (tensor<1x?x64xf32>, tensor<64x64xf8E4M3FN>, tensor<4x2xf32>) -> tensor<1x?x64xf32>
// CHECK: %[[H:.*]], %{{.*}} = ad.add_rms_norm %{{.*}}, %[[O]]
// CHECK: %[[GU_W:.*]] = ad.cat %p_model_layers_0_mlp_gate_proj_weight, %p_model_layers_0_mlp_up_proj_weight dim 0
// CHECK: %[[GU_S:.*]] = ad.cat %p_model_layers_0_mlp_gate_proj_weight_scale_inv, %p_model_layers_0_mlp_up_proj_weight_scale_inv dim 0
// CHECK: %[[GU:.*]] = ad.linear_fp8_block %[[H]], %[[GU_W]], %[[GU_S]] block [16, 32] : (tensor<1x?x64xf32>, tensor<256x64xf8E4M3FN>, tensor<16x2xf32>) -> tensor<1x?x256xf32>
// CHECK: %[[G:.*]] = ad.slice %[[GU]] dim 2 [0, 128, 1]
// CHECK: %[[U:.*]] = ad.slice %[[GU]] dim 2 [128, 256, 1]
// CHECK: %[[A:.*]] = ad.silu_and_mul %[[G]], %[[U]]
// CHECK: ad.linear_fp8_block %[[A]], %p_model_layers_0_mlp_down_proj_weight, %p_model_layers_0_mlp_down_proj_weight_scale_inv block [16, 32] : (tensor<1x?x128xf32>, tensor<64x128xf8E4M3FN>, tensor<4x4xf32>) -> tensor<1x?x64xf32>
// CHECK: ad.linear %{{.*}}, %p_lm_head_weight

// GONE-NOT: ad.linear %{{.*}}, %p_model_layers
// GONE-NOT: ad.dequantize_fp8
// GONE: ad.linear %{{.*}}, %p_lm_head_weight
// GONE-NOT: ad.linear
