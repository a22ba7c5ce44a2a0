// shard on ad.moe (after match-moe): each expert's FFN cut like the dense MLP over 2 ranks,
// gate/up column-wise over the intermediate size I, down row-wise, an all_reduce after the op.
// The stacked gate_up [E, 2I, H] holds two chunks (gate, up) along dim 1, cut alike
// (ad.shard_chunks = 2); the shared expert's weights hold S chunks of I (its S virtual
// experts), and the weight-only ops stacking them get the local sizes.
// RUN: ad-opt %s --split-input-file -p 'shard{world-size=2}' | filecheck %s

// Qwen2-MoE's block (I = 32, a shared expert of 2 x 32) after match-moe.
// CHECK-LABEL: func.func @qwen2_moe_experts
// CHECK-SAME:    %p_gate_weight: tensor<4x16xf32> {ad.param = "gate.weight"}
// CHECK-SAME:    %p_experts_gate_up_proj: tensor<4x32x16xf32> {ad.param = "experts.gate_up_proj", ad.shard_dim = 1 : i64, ad.shard_chunks = 2 : i64}
// CHECK-SAME:    %p_experts_down_proj: tensor<4x16x16xf32> {ad.param = "experts.down_proj", ad.shard_dim = 2 : i64}
// CHECK-SAME:    %p_shared_expert_gate_proj_weight: tensor<32x16xf32> {ad.param = "shared_expert.gate_proj.weight", ad.shard_dim = 0 : i64, ad.shard_chunks = 2 : i64}
// CHECK-SAME:    %p_shared_expert_up_proj_weight: tensor<32x16xf32> {ad.param = "shared_expert.up_proj.weight", ad.shard_dim = 0 : i64, ad.shard_chunks = 2 : i64}
// CHECK-SAME:    %p_shared_expert_down_proj_weight: tensor<16x32xf32> {ad.param = "shared_expert.down_proj.weight", ad.shard_dim = 1 : i64, ad.shard_chunks = 2 : i64}
// CHECK-SAME:    %p_shared_expert_gate_weight: tensor<1x16xf32> {ad.param = "shared_expert_gate.weight"}
// CHECK:         ad.reshape %p_shared_expert_gate_proj_weight [2, 16, 16] : tensor<32x16xf32> -> tensor<2x16x16xf32>
// CHECK-NEXT:    ad.reshape %p_shared_expert_up_proj_weight [2, 16, 16] : tensor<32x16xf32> -> tensor<2x16x16xf32>
// CHECK-NEXT:    ad.cat {{.*}} dim 1 : (tensor<2x16x16xf32>, tensor<2x16x16xf32>) -> tensor<2x32x16xf32>
// CHECK-NEXT:    ad.reshape %p_shared_expert_down_proj_weight [16, 2, 16] : tensor<16x32xf32> -> tensor<16x2x16xf32>
// CHECK-NEXT:    ad.permute {{.*}} [1, 0, 2] : tensor<16x2x16xf32> -> tensor<2x16x16xf32>
// CHECK-NEXT:    %[[GU:.*]] = ad.cat %p_experts_gate_up_proj, {{.*}} -> tensor<6x32x16xf32>
// CHECK-NEXT:    %[[D:.*]] = ad.cat %p_experts_down_proj, {{.*}} -> tensor<6x16x16xf32>
// CHECK-NEXT:    %[[M:.*]] = ad.moe %view, %linear experts %[[GU]], %[[D]] shared 2 gate %linear_1 top_k 2 : (tensor<?x16xf32>, tensor<?x4xf32>, tensor<6x32x16xf32>, tensor<6x16x16xf32>, tensor<?x1xf32>) -> tensor<?x16xf32>
// CHECK-NEXT:    %[[R:.*]] = ad.all_reduce %[[M]] "sum" group "0" : tensor<?x16xf32> -> tensor<?x16xf32>
// CHECK-NEXT:    %[[W:.*]] = ad.wait_tensor %[[R]]
// CHECK-NEXT:    ad.reshape %[[W]] [1, %sym_size_int, 16]
func.func @qwen2_moe_experts(%p_gate_weight: tensor<4x16xf32> {ad.param = "gate.weight"}, %p_experts_gate_up_proj: tensor<4x64x16xf32> {ad.param = "experts.gate_up_proj"}, %p_experts_down_proj: tensor<4x16x32xf32> {ad.param = "experts.down_proj"}, %p_shared_expert_gate_proj_weight: tensor<64x16xf32> {ad.param = "shared_expert.gate_proj.weight"}, %p_shared_expert_up_proj_weight: tensor<64x16xf32> {ad.param = "shared_expert.up_proj.weight"}, %p_shared_expert_down_proj_weight: tensor<16x64xf32> {ad.param = "shared_expert.down_proj.weight"}, %p_shared_expert_gate_weight: tensor<1x16xf32> {ad.param = "shared_expert_gate.weight"}, %hidden_states: tensor<1x?x16xf32> {ad.input = "hidden_states"}) -> tensor<1x?x16xf32> {
  %sym_size_int = ad.sym_size %hidden_states dim 1 : tensor<1x?x16xf32>
  %view = ad.reshape %hidden_states [-1, 16] : tensor<1x?x16xf32> -> tensor<?x16xf32>
  %linear = ad.linear %view, %p_gate_weight : (tensor<?x16xf32>, tensor<4x16xf32>) -> tensor<?x4xf32>
  %linear_1 = ad.linear %view, %p_shared_expert_gate_weight : (tensor<?x16xf32>, tensor<1x16xf32>) -> tensor<?x1xf32>
  %0 = ad.reshape %p_shared_expert_gate_proj_weight [2, 32, 16] : tensor<64x16xf32> -> tensor<2x32x16xf32>
  %1 = ad.reshape %p_shared_expert_up_proj_weight [2, 32, 16] : tensor<64x16xf32> -> tensor<2x32x16xf32>
  %2 = ad.cat %0, %1 dim 1 : (tensor<2x32x16xf32>, tensor<2x32x16xf32>) -> tensor<2x64x16xf32>
  %3 = ad.reshape %p_shared_expert_down_proj_weight [16, 2, 32] : tensor<16x64xf32> -> tensor<16x2x32xf32>
  %4 = ad.permute %3 [1, 0, 2] : tensor<16x2x32xf32> -> tensor<2x16x32xf32>
  %5 = ad.cat %p_experts_gate_up_proj, %2 dim 0 : (tensor<4x64x16xf32>, tensor<2x64x16xf32>) -> tensor<6x64x16xf32>
  %6 = ad.cat %p_experts_down_proj, %4 dim 0 : (tensor<4x16x32xf32>, tensor<2x16x32xf32>) -> tensor<6x16x32xf32>
  %add = ad.moe %view, %linear experts %5, %6 shared 2 gate %linear_1 top_k 2 : (tensor<?x16xf32>, tensor<?x4xf32>, tensor<6x64x16xf32>, tensor<6x16x32xf32>, tensor<?x1xf32>) -> tensor<?x16xf32>
  %reshape = ad.reshape %add [1, %sym_size_int, 16] : tensor<?x16xf32> -> tensor<1x?x16xf32>
  func.return %reshape : tensor<1x?x16xf32>
}

// -----

// Experts of an odd I = 9 do not split in 2: replicated, no all_reduce (the log says why).
// CHECK-LABEL: func.func @odd_intermediate
// CHECK-SAME:    %p_experts_gate_up_proj: tensor<4x18x16xf32> {ad.param = "experts.gate_up_proj"}
// CHECK-SAME:    %p_experts_down_proj: tensor<4x16x9xf32> {ad.param = "experts.down_proj"}
// CHECK:         ad.moe {{.*}} -> tensor<?x16xf32>
// CHECK-NOT:     ad.all_reduce
func.func @odd_intermediate(%p_gate_weight: tensor<4x16xf32> {ad.param = "gate.weight"}, %p_experts_gate_up_proj: tensor<4x18x16xf32> {ad.param = "experts.gate_up_proj"}, %p_experts_down_proj: tensor<4x16x9xf32> {ad.param = "experts.down_proj"}, %hidden_states: tensor<1x?x16xf32> {ad.input = "hidden_states"}) -> tensor<1x?x16xf32> {
  %sym_size_int = ad.sym_size %hidden_states dim 1 : tensor<1x?x16xf32>
  %view = ad.reshape %hidden_states [-1, 16] : tensor<1x?x16xf32> -> tensor<?x16xf32>
  %linear = ad.linear %view, %p_gate_weight : (tensor<?x16xf32>, tensor<4x16xf32>) -> tensor<?x4xf32>
  %sum = ad.moe %view, %linear experts %p_experts_gate_up_proj, %p_experts_down_proj top_k 2 normalize : (tensor<?x16xf32>, tensor<?x4xf32>, tensor<4x18x16xf32>, tensor<4x16x9xf32>) -> tensor<?x16xf32>
  %reshape = ad.reshape %sum [1, %sym_size_int, 16] : tensor<?x16xf32> -> tensor<1x?x16xf32>
  func.return %reshape : tensor<1x?x16xf32>
}

// -----

// gate_up [4, 64, 16] read from a weight [8, 32, 16]: expert e's gate rows are input row 2e and
// its up rows input row 2e + 1, so the gate/up chunks interleave along the input's dim 0 and no
// input dim holds them as chunks: refused, the experts replicated (no shard marks, no
// all_reduce; the log says why).
// CHECK-LABEL: func.func @interleaved_gate_up
// CHECK-SAME:    %p_experts_gate_up_proj: tensor<8x32x16xf32> {ad.param = "experts.gate_up_proj"}
// CHECK-SAME:    %p_experts_down_proj: tensor<4x16x32xf32> {ad.param = "experts.down_proj"}
// CHECK:         ad.reshape %p_experts_gate_up_proj [4, 64, 16] : tensor<8x32x16xf32> -> tensor<4x64x16xf32>
// CHECK:         ad.moe {{.*}} -> tensor<?x16xf32>
// CHECK-NOT:     ad.all_reduce
func.func @interleaved_gate_up(%p_gate_weight: tensor<4x16xf32> {ad.param = "gate.weight"}, %p_experts_gate_up_proj: tensor<8x32x16xf32> {ad.param = "experts.gate_up_proj"}, %p_experts_down_proj: tensor<4x16x32xf32> {ad.param = "experts.down_proj"}, %hidden_states: tensor<1x?x16xf32> {ad.input = "hidden_states"}) -> tensor<1x?x16xf32> {
  %sym_size_int = ad.sym_size %hidden_states dim 1 : tensor<1x?x16xf32>
  %view = ad.reshape %hidden_states [-1, 16] : tensor<1x?x16xf32> -> tensor<?x16xf32>
  %linear = ad.linear %view, %p_gate_weight : (tensor<?x16xf32>, tensor<4x16xf32>) -> tensor<?x4xf32>
  %gate_up = ad.reshape %p_experts_gate_up_proj [4, 64, 16] : tensor<8x32x16xf32> -> tensor<4x64x16xf32>
  %sum = ad.moe %view, %linear experts %gate_up, %p_experts_down_proj top_k 2 normalize : (tensor<?x16xf32>, tensor<?x4xf32>, tensor<4x64x16xf32>, tensor<4x16x32xf32>) -> tensor<?x16xf32>
  %reshape = ad.reshape %sum [1, %sym_size_int, 16] : tensor<?x16xf32> -> tensor<1x?x16xf32>
  func.return %reshape : tensor<1x?x16xf32>
}
