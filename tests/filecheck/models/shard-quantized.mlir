// shard{world-size=2} on quantized checkpoints of one-layer Qwen3 built small (hidden 128: 4 query
// heads and 2 key/value heads of 32, intermediate 256), one per writer. Q/K/V and gate/up are cut
// column-wise (along N: the weight and each scale that follows N), o_proj and down_proj row-wise
// (along K: the weight and each scale that follows K; scales along N, and one-value scales, stay
// whole), and one all_reduce follows each row-wise linear.
// RUN: rm -rf %t.b %t.c %t.g %t.n %t.ga %t.b64
// RUN: %python -m ad_mlir.zoo.quantized qwen3 %t.b --layers 1 --block-size 32 32 > /dev/null
// RUN: ad-opt --model %t.b -p 'canonicalize,shard{world-size=2}' | filecheck %s --check-prefix=BLOCK
// RUN: %python -m ad_mlir.zoo.ct_fp8 qwen3 %t.c --layers 1 > /dev/null
// RUN: ad-opt --model %t.c -p 'canonicalize,shard{world-size=2}' | filecheck %s --check-prefix=CHANNEL
// RUN: %python -m ad_mlir.zoo.gptq qwen3 %t.g --layers 1 --group-size 32 > /dev/null
// RUN: ad-opt --model %t.g -p 'canonicalize,shard{world-size=2}' | filecheck %s --check-prefix=INT4
// RUN: %python -m ad_mlir.zoo.modelopt qwen3 %t.n --layers 1 > /dev/null
// RUN: ad-opt --model %t.n -p 'canonicalize,shard{world-size=2},fuse-gemms' | filecheck %s --check-prefix=NVFP4
// RUN: %python -m ad_mlir.zoo.gptq qwen3 %t.ga --layers 1 --group-size 32 --desc-act > /dev/null
// RUN: ad-opt --model %t.ga -p 'canonicalize,shard{world-size=2}' | filecheck %s --check-prefix=ACT-ORDER
// RUN: %python -m ad_mlir.zoo.quantized qwen3 %t.b64 --layers 1 --block-size 64 64 > /dev/null
// RUN: ad-opt --model %t.b64 -p 'canonicalize,shard{world-size=2}' | filecheck %s --check-prefix=BLOCK64

// Fine-grained FP8 in blocks [32, 32]: q_proj's [128, 128] weight and [4, 4] scales -> [64, 128]
// and [2, 4] (rows: 2 blocks a rank), o_proj's -> [128, 64] and [4, 2] (columns).
// BLOCK:      %p_model_layers_0_self_attn_q_proj_weight: tensor<64x128xf8E4M3FN> {ad.param = "model.layers.0.self_attn.q_proj.weight", ad.shard_dim = 0 : i64}
// BLOCK-SAME: %p_model_layers_0_self_attn_q_proj_weight_scale_inv: tensor<2x4xf32> {ad.param = "model.layers.0.self_attn.q_proj.weight_scale_inv", ad.shard_dim = 0 : i64}
// BLOCK-SAME: %p_model_layers_0_self_attn_o_proj_weight: tensor<128x64xf8E4M3FN> {ad.param = "model.layers.0.self_attn.o_proj.weight", ad.shard_dim = 1 : i64}
// BLOCK-SAME: %p_model_layers_0_self_attn_o_proj_weight_scale_inv: tensor<4x2xf32> {ad.param = "model.layers.0.self_attn.o_proj.weight_scale_inv", ad.shard_dim = 1 : i64}
// BLOCK:      ad.linear_fp8_block %{{.*}}, %p_model_layers_0_self_attn_q_proj_weight, %p_model_layers_0_self_attn_q_proj_weight_scale_inv block [32, 32] : (tensor<1x?x128xf32>, tensor<64x128xf8E4M3FN>, tensor<2x4xf32>) -> tensor<1x?x64xf32>
// BLOCK:      %[[O:.*]] = ad.linear_fp8_block %{{.*}}, %p_model_layers_0_self_attn_o_proj_weight, %p_model_layers_0_self_attn_o_proj_weight_scale_inv block [32, 32] : (tensor<1x?x64xf32>, tensor<128x64xf8E4M3FN>, tensor<4x2xf32>) -> tensor<1x?x128xf32>
// BLOCK-NEXT: %[[R:.*]] = ad.all_reduce %[[O]] "sum" group "0"
// BLOCK-NEXT: ad.wait_tensor %[[R]]
// BLOCK:      %[[D:.*]] = ad.linear_fp8_block %{{.*}}, %p_model_layers_0_mlp_down_proj_weight, %p_model_layers_0_mlp_down_proj_weight_scale_inv block [32, 32] : (tensor<1x?x128xf32>, tensor<128x128xf8E4M3FN>, tensor<4x4xf32>)
// BLOCK-NEXT: ad.all_reduce %[[D]] "sum"

// Compressed-tensors FP8, per-channel scales [N, 1]: cut with q_proj's rows, whole for o_proj;
// o_proj's input is quantized per token on the rank's share of the row ([1, ?, 64]).
// CHANNEL:      %p_model_layers_0_self_attn_q_proj_weight: tensor<64x128xf8E4M3FN> {ad.param = "model.layers.0.self_attn.q_proj.weight", ad.shard_dim = 0 : i64}
// CHANNEL-SAME: %p_model_layers_0_self_attn_q_proj_weight_scale: tensor<64x1xf32> {ad.param = "model.layers.0.self_attn.q_proj.weight_scale", ad.shard_dim = 0 : i64}
// CHANNEL-SAME: %p_model_layers_0_self_attn_o_proj_weight: tensor<128x64xf8E4M3FN> {ad.param = "model.layers.0.self_attn.o_proj.weight", ad.shard_dim = 1 : i64}
// CHANNEL-SAME: %p_model_layers_0_self_attn_o_proj_weight_scale: tensor<128x1xf32> {ad.param = "model.layers.0.self_attn.o_proj.weight_scale"}
// CHANNEL:      %[[Q:.*]], %[[S:.*]] = ad.quantize_fp8_dynamic %{{.*}} per_token : tensor<1x?x64xf32> -> (tensor<1x?x64xf8E4M3FN>, tensor<1x?x1xf32>)
// CHANNEL-NEXT: %[[O:.*]] = ad.linear_fp8 %[[Q]], %p_model_layers_0_self_attn_o_proj_weight, %[[S]], %p_model_layers_0_self_attn_o_proj_weight_scale : (tensor<1x?x64xf8E4M3FN>, tensor<128x64xf8E4M3FN>, tensor<1x?x1xf32>, tensor<128x1xf32>) -> tensor<1x?x128xf32>
// CHANNEL-NEXT: ad.all_reduce %[[O]] "sum"

// GPTQ int4, groups of 32: q_proj's qweight [16, 128] -> [16, 64], qzeros [4, 16] -> [4, 8],
// scales [4, 128] -> [4, 64] (along N); o_proj's [16, 128], [4, 16], [4, 128] -> [8, 128],
// [2, 16], [2, 128] (along K: 64 rows, 2 groups a rank).
// INT4:      %p_model_layers_0_self_attn_q_proj_qweight: tensor<16x64xi32> {ad.param = "model.layers.0.self_attn.q_proj.qweight", ad.shard_dim = 1 : i64}
// INT4-SAME: %p_model_layers_0_self_attn_q_proj_qzeros: tensor<4x8xi32> {ad.param = "model.layers.0.self_attn.q_proj.qzeros", ad.shard_dim = 1 : i64}
// INT4-SAME: %p_model_layers_0_self_attn_q_proj_scales: tensor<4x64xf16> {ad.param = "model.layers.0.self_attn.q_proj.scales", ad.shard_dim = 1 : i64}
// INT4-SAME: %p_model_layers_0_self_attn_o_proj_qweight: tensor<8x128xi32> {ad.param = "model.layers.0.self_attn.o_proj.qweight", ad.shard_dim = 0 : i64}
// INT4-SAME: %p_model_layers_0_self_attn_o_proj_qzeros: tensor<2x16xi32> {ad.param = "model.layers.0.self_attn.o_proj.qzeros", ad.shard_dim = 0 : i64}
// INT4-SAME: %p_model_layers_0_self_attn_o_proj_scales: tensor<2x128xf16> {ad.param = "model.layers.0.self_attn.o_proj.scales", ad.shard_dim = 0 : i64}
// INT4:      %[[O:.*]] = ad.linear_int4 %{{.*}}, %p_model_layers_0_self_attn_o_proj_qweight, %p_model_layers_0_self_attn_o_proj_qzeros, %p_model_layers_0_self_attn_o_proj_scales group 32 zero_offset 1 : (tensor<1x?x64xf32>, tensor<8x128xi32>, tensor<2x16xi32>, tensor<2x128xf16>) -> tensor<1x?x128xf32>
// INT4-NEXT: ad.all_reduce %[[O]] "sum"
// INT4:      %[[D:.*]] = ad.linear_int4 %{{.*}}, %p_model_layers_0_mlp_down_proj_qweight
// INT4-NEXT: ad.all_reduce %[[D]] "sum"

// With NVFP4, q_proj's codes [128, 64] and e4m3 scales [128, 8] -> [64, 64] and [64, 8]; o_proj's ->
// [128, 32] and [128, 4] (64 columns: 4 groups of 16 a rank); the one-value global scales stay
// whole. After fuse-gemms, Q/K/V is one GEMM over the local parts, each part's global scale
// repeated over its local rows ([64 + 32 + 32]).
// NVFP4:      %p_model_layers_0_self_attn_q_proj_weight: tensor<64x64xui8> {ad.param = "model.layers.0.self_attn.q_proj.weight", ad.shard_dim = 0 : i64}
// NVFP4-SAME: %p_model_layers_0_self_attn_q_proj_weight_scale: tensor<64x8xf8E4M3FN> {ad.param = "model.layers.0.self_attn.q_proj.weight_scale", ad.shard_dim = 0 : i64}
// NVFP4-SAME: tensor<f32> {ad.param = "model.layers.0.self_attn.q_proj.weight_scale_2"}
// NVFP4-SAME: %p_model_layers_0_self_attn_o_proj_weight: tensor<128x32xui8> {ad.param = "model.layers.0.self_attn.o_proj.weight", ad.shard_dim = 1 : i64}
// NVFP4-SAME: %p_model_layers_0_self_attn_o_proj_weight_scale: tensor<128x4xf8E4M3FN> {ad.param = "model.layers.0.self_attn.o_proj.weight_scale", ad.shard_dim = 1 : i64}
// NVFP4-SAME: tensor<f32> {ad.param = "model.layers.0.self_attn.o_proj.weight_scale_2"}
// NVFP4:      ad.linear_nvfp4 {{.*}} : (tensor<1x?x128xf32>, tensor<128x64xui8>, tensor<128x8xf8E4M3FN>, tensor<128xf32>) -> tensor<1x?x128xf32>
// NVFP4:      %[[O:.*]] = ad.linear_nvfp4 %{{.*}}, %p_model_layers_0_self_attn_o_proj_weight, {{.*}} : (tensor<1x?x64xf32>, tensor<128x32xui8>, tensor<128x4xf8E4M3FN>, tensor<f32>) -> tensor<1x?x128xf32>
// NVFP4-NEXT: ad.all_reduce %[[O]] "sum"

// GPTQ's act-order (g_idx): a rank's K rows hold groups from the whole of K, so o_proj and
// down_proj cannot be cut row-wise; both blocks stay whole, no collective.
// ACT-ORDER-NOT: ad.shard_dim
// ACT-ORDER-NOT: ad.all_reduce

// Blocks of 64: k_proj's and v_proj's 64 rows give a rank 32, half a block, so the attention
// stays whole; the MLP (gate/up 256 rows, down 256 columns: 2 blocks a rank) is cut.
// BLOCK64:     %p_model_layers_0_self_attn_k_proj_weight: tensor<64x128xf8E4M3FN> {ad.param = "model.layers.0.self_attn.k_proj.weight"}
// BLOCK64-SAME: %p_model_layers_0_self_attn_o_proj_weight: tensor<128x128xf8E4M3FN> {ad.param = "model.layers.0.self_attn.o_proj.weight"}
// BLOCK64-SAME: %p_model_layers_0_mlp_gate_proj_weight: tensor<128x128xf8E4M3FN> {ad.param = "model.layers.0.mlp.gate_proj.weight", ad.shard_dim = 0 : i64}
// BLOCK64-NOT: ad.all_reduce
// BLOCK64:     %[[D:.*]] = ad.linear_fp8_block %{{.*}}, %p_model_layers_0_mlp_down_proj_weight
// BLOCK64-NEXT: ad.all_reduce %[[D]] "sum"
// BLOCK64-NOT: ad.all_reduce
