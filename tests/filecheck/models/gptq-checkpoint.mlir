// A GPTQ int4 checkpoint (a one-layer tiny Llama written by ad_mlir.zoo.gptq in the format's
// layout: groups of 32 rows, act-order, the v1 zero points) through `ad-opt --model PATH -p default`:
// every projection is `ad.linear_int4` on its packed i32 words, i32 zero points and f16 scales
// (function arguments, the checkpoint's tensors), with the g_idx of its act-order and the v1
// zero offset of 1; none is left a plain `ad.linear`. Q/K/V and gate/up are fused GEMMs over the
// words, zero points and scales concatenated along N (`fuse-gemms`; computed once, at compile
// time), sharing one g_idx (projections of one input have one act-order); the norms and
// SiLU-mul around them fuse as in a float model, and the LM head stays unquantized.
// RUN: rm -rf %t && %python -m ad_mlir.zoo.gptq llama %t --layers 1 --group-size 32 --desc-act
// RUN: ad-opt --model %t -p default > %t.mlir
// RUN: filecheck %s < %t.mlir
// RUN: filecheck %s --check-prefix=GONE < %t.mlir

// CHECK: func.func @forward(
// CHECK-SAME: %p_model_layers_0_self_attn_q_proj_qweight: tensor<8x64xi32> {ad.param = "model.layers.0.self_attn.q_proj.qweight"}
// CHECK-SAME: %p_model_layers_0_self_attn_q_proj_qzeros: tensor<2x8xi32> {ad.param = "model.layers.0.self_attn.q_proj.qzeros"}
// CHECK-SAME: %p_model_layers_0_self_attn_q_proj_scales: tensor<2x64xf16> {ad.param = "model.layers.0.self_attn.q_proj.scales"}
// CHECK-SAME: %p_lm_head_weight: tensor<128x64xf32>
// CHECK: %[[N:.*]] = ad.rms_norm
// CHECK: %[[QKV_W:.*]] = ad.cat %p_model_layers_0_self_attn_q_proj_qweight, %p_model_layers_0_self_attn_k_proj_qweight, %p_model_layers_0_self_attn_v_proj_qweight dim 1 : (tensor<8x64xi32>, tensor<8x32xi32>, tensor<8x32xi32>) -> tensor<8x128xi32>
// CHECK: %[[QKV_Z:.*]] = ad.cat %p_model_layers_0_self_attn_q_proj_qzeros, %p_model_layers_0_self_attn_k_proj_qzeros, %p_model_layers_0_self_attn_v_proj_qzeros dim 1 : (tensor<2x8xi32>, tensor<2x4xi32>, tensor<2x4xi32>) -> tensor<2x16xi32>
// CHECK: %[[QKV_S:.*]] = ad.cat %p_model_layers_0_self_attn_q_proj_scales, %p_model_layers_0_self_attn_k_proj_scales, %p_model_layers_0_self_attn_v_proj_scales dim 1 : (tensor<2x64xf16>, tensor<2x32xf16>, tensor<2x32xf16>) -> tensor<2x128xf16>
// CHECK: %[[QKV:.*]] = ad.linear_int4 %[[N]], %[[QKV_W]], %[[QKV_Z]], %[[QKV_S]] g_idx %p_model_layers_0_self_attn_{{[qkv]}}_proj_g_idx group 32 zero_offset 1 : (tensor<1x?x64xf32>, tensor<8x128xi32>, tensor<2x16xi32>, tensor<2x128xf16>, tensor<64xi32>) -> tensor<1x?x128xf32>
// CHECK: ad.slice %[[QKV]] dim 2 [0, 64, 1]
// CHECK: %[[O:.*]] = ad.linear_int4 %{{.*}}, %p_model_layers_0_self_attn_o_proj_qweight, %p_model_layers_0_self_attn_o_proj_qzeros, %p_model_layers_0_self_attn_o_proj_scales g_idx %p_model_layers_0_self_attn_o_proj_g_idx group 32 zero_offset 1
// CHECK: %[[H:.*]], %{{.*}} = ad.add_rms_norm %{{.*}}, %[[O]]
// CHECK: %[[GU_W:.*]] = ad.cat %p_model_layers_0_mlp_gate_proj_qweight, %p_model_layers_0_mlp_up_proj_qweight dim 1
// CHECK: %[[GU_Z:.*]] = ad.cat %p_model_layers_0_mlp_gate_proj_qzeros, %p_model_layers_0_mlp_up_proj_qzeros dim 1
// CHECK: %[[GU_S:.*]] = ad.cat %p_model_layers_0_mlp_gate_proj_scales, %p_model_layers_0_mlp_up_proj_scales dim 1
// CHECK: %[[GU:.*]] = ad.linear_int4 %[[H]], %[[GU_W]], %[[GU_Z]], %[[GU_S]] g_idx %p_model_layers_0_mlp_{{gate|up}}_proj_g_idx group 32 zero_offset 1 : (tensor<1x?x64xf32>, tensor<8x256xi32>, tensor<2x32xi32>, tensor<2x256xf16>, tensor<64xi32>) -> tensor<1x?x256xf32>
// CHECK: %[[G:.*]] = ad.slice %[[GU]] dim 2 [0, 128, 1]
// CHECK: %[[U:.*]] = ad.slice %[[GU]] dim 2 [128, 256, 1]
// CHECK: %[[A:.*]] = ad.silu_and_mul %[[G]], %[[U]]
// CHECK: ad.linear_int4 %[[A]], %p_model_layers_0_mlp_down_proj_qweight, %p_model_layers_0_mlp_down_proj_qzeros, %p_model_layers_0_mlp_down_proj_scales g_idx %p_model_layers_0_mlp_down_proj_g_idx group 32 zero_offset 1 : (tensor<1x?x128xf32>, tensor<16x64xi32>, tensor<4x8xi32>, tensor<4x64xf16>, tensor<128xi32>) -> tensor<1x?x64xf32>
// CHECK: ad.linear %{{.*}}, %p_lm_head_weight

// GONE-NOT: ad.linear %{{.*}}, %p_model_layers
// GONE: ad.linear %{{.*}}, %p_lm_head_weight
// GONE-NOT: ad.linear
