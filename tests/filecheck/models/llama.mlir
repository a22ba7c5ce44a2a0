// A one-layer tiny HF Llama, exported with a dynamic sequence length and imported: weights
// are named arguments, every decoder op is present with the HF module path as its location,
// and the printed IR re-parses (through ad-opt and through stock xdsl-opt via the entry point).
// RUN: ad-opt --model llama --layers 1 --print-debuginfo > %t.mlir
// RUN: filecheck %s < %t.mlir
// RUN: ad-opt %t.mlir -p canonicalize --print-debuginfo | filecheck %s --check-prefix=CANON
// RUN: ad-opt %t.mlir | xdsl-opt | filecheck %s --check-prefix=XDSL
// RUN: ad-opt --model llama --layers 1 --decompose | filecheck %s --check-prefix=CORE

// CHECK: func.func @forward(
// CHECK-SAME: %p_model_embed_tokens_weight: tensor<128x64xf32> {ad.param = "model.embed_tokens.weight"}
// CHECK-SAME: %p_model_layers_0_self_attn_q_proj_weight: tensor<64x64xf32> {ad.param = "model.layers.0.self_attn.q_proj.weight"}
// CHECK-SAME: %b_model_rotary_emb_inv_freq: tensor<16xf32> {ad.buffer = "model.rotary_emb.inv_freq"}
// CHECK-SAME: %input_ids: tensor<1x?xi64> {ad.input = "input_ids"}
// CHECK-SAME: -> tensor<1x?x128xf32>
// CHECK: %sym_size_int = ad.sym_size %input_ids dim 1
// CHECK: ad.embedding %p_model_embed_tokens_weight, %input_ids : (tensor<128x64xf32>, tensor<1x?xi64>) -> tensor<1x?x64xf32> loc("model.embed_tokens")
// CHECK: ad.cos {{.*}} loc("model.rotary_emb")
// CHECK: ad.sin {{.*}} loc("model.rotary_emb")
// RMSNorm in its HF spelling: pow 2, mean over the last dim, + eps, rsqrt, scale, weight.
// CHECK: %[[POW:.*]] = ad.pow %[[X:.*]], %{{.*}} : tensor<1x?x64xf32>, i64 -> tensor<1x?x64xf32> loc("model.layers.0.input_layernorm")
// CHECK-NEXT: %[[MEAN:.*]] = ad.mean %[[POW]] dim [-1] keepdim : tensor<1x?x64xf32> -> tensor<1x?x1xf32> loc("model.layers.0.input_layernorm")
// CHECK-NEXT: %[[EPS:.*]] = ad.constant 1.000000e-06 : f64
// CHECK-NEXT: %[[VAR:.*]] = ad.add %[[MEAN]], %[[EPS]]
// CHECK-NEXT: %[[RSQRT:.*]] = ad.rsqrt %[[VAR]]
// CHECK-NEXT: ad.mul %[[X]], %[[RSQRT]]
// CHECK: %[[NORMED:.*]] = ad.mul %p_model_layers_0_input_layernorm_weight, %{{.*}} loc("model.layers.0.input_layernorm")
// CHECK: %[[Q:.*]] = ad.linear %[[NORMED]], %p_model_layers_0_self_attn_q_proj_weight : (tensor<1x?x64xf32>, tensor<64x64xf32>) -> tensor<1x?x64xf32> loc("model.layers.0.self_attn.q_proj")
// CHECK-NEXT: ad.reshape %[[Q]] [1, %sym_size_int, -1, 32] : tensor<1x?x64xf32> -> tensor<1x?x2x32xf32> loc("model.layers.0.self_attn")
// CHECK: ad.linear %[[NORMED]], %p_model_layers_0_self_attn_k_proj_weight : (tensor<1x?x64xf32>, tensor<32x64xf32>) -> tensor<1x?x32xf32> loc("model.layers.0.self_attn.k_proj")
// CHECK: ad.linear %[[NORMED]], %p_model_layers_0_self_attn_v_proj_weight : (tensor<1x?x64xf32>, tensor<32x64xf32>) -> tensor<1x?x32xf32> loc("model.layers.0.self_attn.v_proj")
// RoPE: rotate_half is slice/neg/cat.
// CHECK: ad.slice %{{.*}} dim 3 [0, 16, 1]
// CHECK-NEXT: ad.slice %{{.*}} dim 3 [16, 9223372036854775807, 1]
// CHECK-NEXT: ad.neg
// CHECK-NEXT: ad.cat {{.*}} dim -1
// CHECK: ad.attention %{{.*}}, %{{.*}}, %{{.*}} mask %{{.*}} scale 0.17677669529663689 : f64 : (tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x1x?x?xi1>) -> tensor<1x2x?x32xf32> loc("model.layers.0.self_attn")
// CHECK: ad.linear %{{.*}}, %p_model_layers_0_self_attn_o_proj_weight {{.*}} loc("model.layers.0.self_attn.o_proj")
// CHECK: %[[GATE:.*]] = ad.linear %{{.*}}, %p_model_layers_0_mlp_gate_proj_weight {{.*}} loc("model.layers.0.mlp.gate_proj")
// CHECK-NEXT: %[[ACT:.*]] = ad.silu %[[GATE]] : tensor<1x?x128xf32> -> tensor<1x?x128xf32> loc("model.layers.0.mlp.act_fn")
// CHECK-NEXT: %[[UP:.*]] = ad.linear %{{.*}}, %p_model_layers_0_mlp_up_proj_weight {{.*}} loc("model.layers.0.mlp.up_proj")
// CHECK-NEXT: %[[PROD:.*]] = ad.mul %[[ACT]], %[[UP]] {{.*}} loc("model.layers.0.mlp")
// CHECK-NEXT: ad.linear %[[PROD]], %p_model_layers_0_mlp_down_proj_weight {{.*}} loc("model.layers.0.mlp.down_proj")
// CHECK: ad.rsqrt {{.*}} loc("model.norm")
// CHECK: %[[LOGITS:.*]] = ad.linear %{{.*}}, %p_lm_head_weight : (tensor<1x?x64xf32>, tensor<128x64xf32>) -> tensor<1x?x128xf32> loc("lm_head")
// CHECK-NEXT: func.return %[[LOGITS]] : tensor<1x?x128xf32>

// canonicalize keeps the locations and the model ops.
// CANON: ad.silu {{.*}} loc("model.layers.0.mlp.act_fn")
// CANON: ad.linear {{.*}} loc("lm_head")

// XDSL: builtin.module
// XDSL: ad.attention
// XDSL: ad.linear %{{.*}}, %p_lm_head_weight

// After run_decompositions() the graph is core ATen: linear is permute+mm, attention is
// bmm/softmax/bmm, silu is x * sigmoid(x).
// CORE: func.func @forward(
// CORE-NOT: ad.linear
// CORE-NOT: ad.attention
// CORE-NOT: ad.silu
// CORE: ad.mm
// CORE: ad.bmm
// CORE-NEXT: ad.reshape
// CORE: ad.softmax %{{.*}} dim -1
// CORE: ad.bmm
// CORE: %[[SIG:.*]] = ad.sigmoid %[[GATE_CORE:[a-z_0-9]*]] :
// CORE-NEXT: ad.mul %[[GATE_CORE]], %[[SIG]]
// CORE: func.return
