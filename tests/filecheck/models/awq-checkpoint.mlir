// An AWQ int4 checkpoint (a one-layer tiny Qwen2 written by ad_mlir.zoo.awq in AWQ's "gemm"
// layout, groups of 32) through `ad-opt --model PATH -p default`: the loader repacks AWQ's words
// into `ad.linear_int4`'s layout (along K: [K / 8, N]) and keeps its zero points as they are (zero
// offset 0, no g_idx); Q/K/V fuse with their biases, gate/up fuse, no plain `ad.linear` is left
// but the LM head.
// RUN: rm -rf %t && %python -m ad_mlir.zoo.awq qwen2 %t --layers 1 --group-size 32
// RUN: ad-opt --model %t -p default > %t.mlir
// RUN: filecheck %s < %t.mlir
// RUN: filecheck %s --check-prefix=GONE < %t.mlir

// CHECK: %[[QKV_B:.*]] = ad.cat %p_model_layers_0_self_attn_q_proj_bias, %p_model_layers_0_self_attn_k_proj_bias, %p_model_layers_0_self_attn_v_proj_bias dim 0
// CHECK: ad.linear_int4 %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} bias %[[QKV_B]] group 32 zero_offset 0 : (tensor<1x?x64xf32>, tensor<8x128xi32>, tensor<2x16xi32>, tensor<2x128xf16>, tensor<128xf32>) -> tensor<1x?x128xf32>
// CHECK: ad.linear_int4 %{{.*}}, %p_model_layers_0_self_attn_o_proj_qweight, %p_model_layers_0_self_attn_o_proj_qzeros, %p_model_layers_0_self_attn_o_proj_scales group 32 zero_offset 0 : (tensor<1x?x64xf32>, tensor<8x64xi32>, tensor<2x8xi32>, tensor<2x64xf16>) -> tensor<1x?x64xf32>
// CHECK: ad.linear_int4 %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} group 32 zero_offset 0 : (tensor<1x?x64xf32>, tensor<8x256xi32>, tensor<2x32xi32>, tensor<2x256xf16>) -> tensor<1x?x256xf32>
// CHECK: ad.linear_int4 %{{.*}}, %p_model_layers_0_mlp_down_proj_qweight

// GONE-NOT: ad.linear %{{.*}}, %p_model_layers
// GONE-NOT: g_idx
// GONE: ad.linear %{{.*}}, %p_lm_head_weight
