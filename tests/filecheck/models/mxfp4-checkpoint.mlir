// An MXFP4 checkpoint as gpt-oss ships it (a one-layer gpt-oss built small, 4 experts, top 2,
// written by ad_mlir.zoo.mxfp4) through `ad-opt --model PATH -p default`: the experts are the
// checkpoint's ui8 blocks [E, out, in / 32, 16] and E8M0 scales [E, out, in / 32] (function
// arguments), and the MoE block is one `ad.moe_mxfp4` from the router's logits: no dequantized
// expert weight, no grouped GEMM, no top-k left of it.
// RUN: rm -rf %t && %python -m ad_mlir.zoo.mxfp4 gpt_oss %t --layers 1
// RUN: ad-opt --model %t -p default > %t.mlir
// RUN: filecheck %s < %t.mlir
// RUN: filecheck %s --check-prefix=GONE < %t.mlir

// CHECK: func.func @forward(
// CHECK-SAME: %p_model_layers_0_mlp_experts_gate_up_proj_blocks: tensor<4x512x4x16xui8> {ad.param = "model.layers.0.mlp.experts.gate_up_proj_blocks"}
// CHECK-SAME: %p_model_layers_0_mlp_experts_gate_up_proj_scales: tensor<4x512x4xui8>
// CHECK-SAME: %p_model_layers_0_mlp_experts_gate_up_proj_bias: tensor<4x512xf32>
// CHECK-SAME: %p_model_layers_0_mlp_experts_down_proj_blocks: tensor<4x128x8x16xui8>
// CHECK-SAME: %p_model_layers_0_mlp_experts_down_proj_scales: tensor<4x128x8xui8>
// CHECK: %[[LOGITS:.*]] = ad.linear %[[X:.*]], %p_model_layers_0_mlp_router_weight bias %p_model_layers_0_mlp_router_bias
// CHECK-NEXT: ad.moe_mxfp4 %[[X]], %[[LOGITS]] gate_up %p_model_layers_0_mlp_experts_gate_up_proj_blocks, %p_model_layers_0_mlp_experts_gate_up_proj_scales, %p_model_layers_0_mlp_experts_gate_up_proj_bias down %p_model_layers_0_mlp_experts_down_proj_blocks, %p_model_layers_0_mlp_experts_down_proj_scales, %p_model_layers_0_mlp_experts_down_proj_bias top_k 2 alpha 1.702000e+00 limit 7.000000e+00 : (tensor<?x128xf32>, tensor<?x4xf32>, tensor<4x512x4x16xui8>, tensor<4x512x4xui8>, tensor<4x512xf32>, tensor<4x128x8x16xui8>, tensor<4x128x8xui8>, tensor<4x128xf32>) -> tensor<?x128xf32>

// GONE-NOT: grouped_mm
// GONE-NOT: aten.topk
// GONE-NOT: aten.histc
