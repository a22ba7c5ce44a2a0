// A fine-grained FP8 checkpoint of a MoE model (a one-layer Qwen3-MoE built small, 4 experts, top
// 2, written by ad_mlir.zoo.quantized as Qwen3-MoE-FP8 ships it: each expert's gate/up/down an fp8
// linear with its block scales, blocks [16, 16]) through `ad-opt --model PATH -p default`: the
// loader stacks the experts, whose fp8 weights [E, 2I, H] / [E, H, I] and f32 block scales are
// function arguments of one `ad.moe_fp8_block`, fed by the router's softmax top-k (weights,
// ids); the attention's projections are `ad.linear_fp8_block`, nothing is a plain `ad.linear` but
// the LM head and the router (unquantized in the checkpoint, as transformers leaves it).
// RUN: rm -rf %t && %python -m ad_mlir.zoo.quantized qwen3_moe %t --layers 1 --block-size 16 16
// RUN: ad-opt --model %t -p default > %t.mlir
// RUN: filecheck %s < %t.mlir
// RUN: filecheck %s --check-prefix=GONE < %t.mlir

// CHECK: func.func @forward(
// CHECK-SAME: %p_model_layers_0_mlp_experts_gate_up_proj: tensor<4x128x128xf8E4M3FN> {ad.param = "model.layers.0.mlp.experts.gate_up_proj"}
// CHECK-SAME: %p_model_layers_0_mlp_experts_gate_up_proj_scale_inv: tensor<4x8x8xf32> {ad.param = "model.layers.0.mlp.experts.gate_up_proj_scale_inv"}
// CHECK-SAME: %p_model_layers_0_mlp_experts_down_proj: tensor<4x128x64xf8E4M3FN>
// CHECK-SAME: %p_model_layers_0_mlp_experts_down_proj_scale_inv: tensor<4x8x4xf32>
// CHECK: ad.linear_fp8_block
// CHECK: %[[W:.*]], %[[IDS:.*]] = ad.torch_op "aten.topk.default"
// CHECK: %{{.*}} = ad.moe_fp8_block %{{.*}}, %[[IDS]], %[[W]] gate_up %p_model_layers_0_mlp_experts_gate_up_proj, %p_model_layers_0_mlp_experts_gate_up_proj_scale_inv down %p_model_layers_0_mlp_experts_down_proj, %p_model_layers_0_mlp_experts_down_proj_scale_inv block [16, 16] : (tensor<?x128xf32>, tensor<?x2xi64>, tensor<?x2xf32>, tensor<4x128x128xf8E4M3FN>, tensor<4x8x8xf32>, tensor<4x128x64xf8E4M3FN>, tensor<4x8x4xf32>) -> tensor<?x128xf32>
// CHECK: ad.linear %{{.*}}, %p_lm_head_weight

// GONE-NOT: grouped_mm
// GONE-NOT: ad.linear %{{.*}}, %p_model_layers_0_self_attn
// GONE-NOT: ad.linear %{{.*}}, %p_model_layers_0_mlp_experts
// GONE: ad.linear %{{.*}}, %p_lm_head_weight
