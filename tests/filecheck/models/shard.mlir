// shard{world-size=2} on a two-layer tiny Llama (hidden 128: 4 query heads, 2 key/value heads of
// 32). Per decoder layer: Q/K/V and gate/up column-wise (weights [out/2, in], ad.shard_dim = 0),
// o_proj and down_proj row-wise ([out, in/2], ad.shard_dim = 1), local head counts in the head
// views and repeat_kv, exactly one all_reduce after o_proj and one after down_proj; embedding,
// norms and lm_head replicated.
// The model is exported once (its locations kept) and each pipeline runs on that IR.
// RUN: ad-opt --model llama --layers 2 --hidden-size 128 -p canonicalize --print-debuginfo > %t.mlir
// RUN: ad-opt %t.mlir -p 'shard{world-size=2}' | filecheck %s
// RUN: ad-opt %t.mlir -p 'shard{world-size=2},default' | filecheck %s --check-prefix=FUSED
// RUN: ad-opt %t.mlir -p 'shard{world-size=2 shard-layers=mlp}' | filecheck %s --check-prefix=MLP
// RUN: not ad-opt %t.mlir -p 'shard{world-size=4}' 2>&1 | filecheck %s --check-prefix=KV

// CHECK:      %p_model_embed_tokens_weight: tensor<128x128xf32> {ad.param = "model.embed_tokens.weight"}
// CHECK-SAME: %p_model_layers_0_self_attn_q_proj_weight: tensor<64x128xf32> {ad.param = "model.layers.0.self_attn.q_proj.weight", ad.shard_dim = 0 : i64}
// CHECK-SAME: %p_model_layers_0_self_attn_k_proj_weight: tensor<32x128xf32> {ad.param = "model.layers.0.self_attn.k_proj.weight", ad.shard_dim = 0 : i64}
// CHECK-SAME: %p_model_layers_0_self_attn_v_proj_weight: tensor<32x128xf32> {ad.param = "model.layers.0.self_attn.v_proj.weight", ad.shard_dim = 0 : i64}
// CHECK-SAME: %p_model_layers_0_self_attn_o_proj_weight: tensor<128x64xf32> {ad.param = "model.layers.0.self_attn.o_proj.weight", ad.shard_dim = 1 : i64}
// CHECK-SAME: %p_model_layers_0_mlp_gate_proj_weight: tensor<128x128xf32> {ad.param = "model.layers.0.mlp.gate_proj.weight", ad.shard_dim = 0 : i64}
// CHECK-SAME: %p_model_layers_0_mlp_up_proj_weight: tensor<128x128xf32> {ad.param = "model.layers.0.mlp.up_proj.weight", ad.shard_dim = 0 : i64}
// CHECK-SAME: %p_model_layers_0_mlp_down_proj_weight: tensor<128x128xf32> {ad.param = "model.layers.0.mlp.down_proj.weight", ad.shard_dim = 1 : i64}
// CHECK-SAME: %p_model_layers_0_input_layernorm_weight: tensor<128xf32> {ad.param = "model.layers.0.input_layernorm.weight"}
// CHECK-SAME: %p_lm_head_weight: tensor<128x128xf32> {ad.param = "lm_head.weight"}
// CHECK-NOT:  ad.all_reduce
// CHECK:      %[[Q:.*]] = ad.linear %{{.*}}, %p_model_layers_0_self_attn_q_proj_weight : (tensor<1x?x128xf32>, tensor<64x128xf32>) -> tensor<1x?x64xf32>
// CHECK-NEXT: ad.reshape %[[Q]] [1, %sym_size_int, -1, 32] : tensor<1x?x64xf32> -> tensor<1x?x2x32xf32>
// CHECK:      %[[K:.*]] = ad.linear %{{.*}}, %p_model_layers_0_self_attn_k_proj_weight : (tensor<1x?x128xf32>, tensor<32x128xf32>) -> tensor<1x?x32xf32>
// CHECK-NEXT: ad.reshape %[[K]] [1, %sym_size_int, -1, 32] : tensor<1x?x32xf32> -> tensor<1x?x1x32xf32>
// repeat_kv: one local K/V head expanded to the two local query heads
// CHECK:      ad.expand %{{.*}} [1, 1, 2, %sym_size_int, 32] : tensor<1x1x1x?x32xf32> -> tensor<1x1x2x?x32xf32>
// CHECK-NEXT: ad.reshape %{{.*}} [1, 2, %sym_size_int, 32] : tensor<1x1x2x?x32xf32> -> tensor<1x2x?x32xf32>
// CHECK:      ad.attention {{.*}} : (tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x1x?x?xi1>) -> tensor<1x2x?x32xf32>
// CHECK:      ad.reshape %{{.*}} [1, %sym_size_int, -1] : tensor<1x?x2x32xf32> -> tensor<1x?x64xf32>
// CHECK-NEXT: %[[O:.*]] = ad.linear %{{.*}}, %p_model_layers_0_self_attn_o_proj_weight : (tensor<1x?x64xf32>, tensor<128x64xf32>) -> tensor<1x?x128xf32>
// CHECK-NEXT: %[[OR:.*]] = ad.all_reduce %[[O]] "sum" group "0" : tensor<1x?x128xf32> -> tensor<1x?x128xf32>
// CHECK-NEXT: %[[OW:.*]] = ad.wait_tensor %[[OR]]
// CHECK-NEXT: ad.add %{{.*}}, %[[OW]] : tensor<1x?x128xf32>, tensor<1x?x128xf32> -> tensor<1x?x128xf32>
// CHECK-NOT:  ad.all_reduce
// CHECK:      ad.linear %{{.*}}, %p_model_layers_0_mlp_gate_proj_weight : (tensor<1x?x128xf32>, tensor<128x128xf32>) -> tensor<1x?x128xf32>
// CHECK:      %[[D:.*]] = ad.linear %{{.*}}, %p_model_layers_0_mlp_down_proj_weight : (tensor<1x?x128xf32>, tensor<128x128xf32>) -> tensor<1x?x128xf32>
// CHECK-NEXT: %[[DR:.*]] = ad.all_reduce %[[D]] "sum" group "0"
// CHECK-NEXT: %[[DW:.*]] = ad.wait_tensor %[[DR]]
// CHECK-NEXT: ad.add %{{.*}}, %[[DW]]
// CHECK-NOT:  ad.all_reduce
// CHECK:      ad.linear %{{.*}}, %p_model_layers_1_self_attn_o_proj_weight
// CHECK-NEXT: ad.all_reduce
// CHECK-NOT:  ad.all_reduce
// CHECK:      ad.linear %{{.*}}, %p_model_layers_1_mlp_down_proj_weight
// CHECK-NEXT: ad.all_reduce
// CHECK-NOT:  ad.all_reduce
// CHECK:      %[[LOGITS:.*]] = ad.linear %{{.*}}, %p_lm_head_weight : (tensor<1x?x128xf32>, tensor<128x128xf32>) -> tensor<1x?x128xf32>
// CHECK-NEXT: func.return %[[LOGITS]]

// The fusions fire on the local shapes: Q/K/V and gate/up concatenate the local shards, RoPE +
// repeat_kv + SDPA become one causal rope_attention (HF's causal mask dropped) over 2 query and
// 1 key/value head, the reduced o_proj/down_proj results feed add + RMSNorm.
// FUSED:      ad.cat %p_model_layers_0_self_attn_q_proj_weight, %p_model_layers_0_self_attn_k_proj_weight, %p_model_layers_0_self_attn_v_proj_weight dim 0 : (tensor<64x128xf32>, tensor<32x128xf32>, tensor<32x128xf32>) -> tensor<128x128xf32>
// FUSED:      ad.rope_attention {{.*}} causal scale {{.*}} : (tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32>, tensor<1x1x?x32xf32>, tensor<1x?x32xf32>, tensor<1x?x32xf32>) -> tensor<1x2x?x32xf32>
// FUSED:      %[[O:.*]] = ad.linear %{{.*}}, %p_model_layers_0_self_attn_o_proj_weight : (tensor<1x?x64xf32>, tensor<128x64xf32>) -> tensor<1x?x128xf32>
// FUSED-NEXT: %[[OR:.*]] = ad.all_reduce %[[O]]
// FUSED-NEXT: %[[OW:.*]] = ad.wait_tensor %[[OR]]
// FUSED-NEXT: ad.add_rms_norm %{{.*}}, %[[OW]] weight %p_model_layers_0_post_attention_layernorm_weight
// FUSED-NEXT: ad.cat %p_model_layers_0_mlp_gate_proj_weight, %p_model_layers_0_mlp_up_proj_weight dim 0 : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<256x128xf32>
// FUSED:      ad.silu_and_mul {{.*}} : (tensor<1x?x128xf32>, tensor<1x?x128xf32>) -> tensor<1x?x128xf32>
// FUSED-NEXT: %[[D:.*]] = ad.linear %{{.*}}, %p_model_layers_0_mlp_down_proj_weight : (tensor<1x?x128xf32>, tensor<128x128xf32>)
// FUSED-NEXT: ad.all_reduce %[[D]]

// shard-layers=mlp: the attention keeps whole weights and no collective.
// MLP:        %p_model_layers_0_self_attn_q_proj_weight: tensor<128x128xf32> {ad.param = "model.layers.0.self_attn.q_proj.weight"}
// MLP-SAME:   %p_model_layers_0_mlp_gate_proj_weight: tensor<128x128xf32> {ad.param = "model.layers.0.mlp.gate_proj.weight", ad.shard_dim = 0 : i64}
// MLP-NOT:    ad.all_reduce
// MLP:        ad.linear %{{.*}}, %p_model_layers_0_mlp_down_proj_weight
// MLP-NEXT:   ad.all_reduce
// MLP-NOT:    ad.all_reduce
// MLP:        ad.linear %{{.*}}, %p_model_layers_1_mlp_down_proj_weight
// MLP-NEXT:   ad.all_reduce
// MLP-NOT:    ad.all_reduce

// Two key/value heads over four ranks: refused, naming the layer and the numbers.
// KV-NOT: Traceback
// KV: {{^}}error: model.layers.0.self_attn: ad.reshape 1x?x64 -> 1x?x2x32 splits 64 features into 2 heads, which 4 ranks cannot split: the world size must divide the query and the key/value head counts (replicating K/V heads is not supported)
