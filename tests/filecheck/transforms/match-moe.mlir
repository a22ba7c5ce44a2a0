// match-moe on small real exports (torch.export of the HF block, canonicalized): the MoE
// block becomes one ad.moe on the router's logits and the stacked experts; the routing (softmax,
// topk, renormalization), the sort by expert, histc/cumsum offsets, gathers, grouped GEMMs and
// the combine are gone (CHECK-NOT from the label to the first match, CHECK-NEXT from there on:
// the whole function body is checked).
// RUN: ad-opt %s --split-input-file -p match-moe | filecheck %s

// Mixtral (fp32, 4 experts, top 2, renormalized): HF's grouped form over the stacked
// gate_up_proj [E, 2I, H] and down_proj [E, H, I] parameters, which ad.moe takes as they are.
// CHECK-LABEL: func.func @mixtral
// CHECK-NOT:     aten.topk
// CHECK-NOT:     aten.sort
// CHECK-NOT:     aten.histc
// CHECK-NOT:     grouped_mm
// CHECK-NOT:     aten.index
// CHECK:         %[[X:.*]] = ad.reshape %hidden_states [-1, 16]
// CHECK-NEXT:    %[[L:.*]] = ad.linear %[[X]], %p_gate_weight
// CHECK-NEXT:    %[[M:.*]] = ad.moe %[[X]], %[[L]] experts %p_experts_gate_up_proj, %p_experts_down_proj top_k 2 normalize : (tensor<?x16xf32>, tensor<?x4xf32>, tensor<4x16x16xf32>, tensor<4x16x8xf32>) -> tensor<?x16xf32>
// CHECK-NEXT:    %[[R:.*]] = ad.reshape %[[M]] [1, %sym_size_int, 16]
// CHECK-NEXT:    func.return %[[R]]
func.func @mixtral(%p_gate_weight: tensor<4x16xf32> {ad.param = "gate.weight"}, %p_experts_gate_up_proj: tensor<4x16x16xf32> {ad.param = "experts.gate_up_proj"}, %p_experts_down_proj: tensor<4x16x8xf32> {ad.param = "experts.down_proj"}, %hidden_states: tensor<1x?x16xf32> {ad.input = "hidden_states"}) -> tensor<1x?x16xf32> {
  %sym_size_int = ad.sym_size %hidden_states dim 1 : tensor<1x?x16xf32>
  %view = ad.reshape %hidden_states [-1, 16] : tensor<1x?x16xf32> -> tensor<?x16xf32>
  %linear = ad.linear %view, %p_gate_weight : (tensor<?x16xf32>, tensor<4x16xf32>) -> tensor<?x4xf32>
  %softmax = ad.softmax %linear dim -1 : tensor<?x4xf32> -> tensor<?x4xf32>
  %topk, %topk_1 = ad.torch_op "aten.topk.default"(%softmax) [#ad.ref<0>, 2 : i64] {} unpack : (tensor<?x4xf32>) -> (tensor<?x2xf32>, tensor<?x2xi64>)
  %sum = ad.sum %topk dim [-1] keepdim : tensor<?x2xf32> -> tensor<?x1xf32>
  %div_ = ad.torch_op "aten.div_.Tensor"(%topk, %sum) [#ad.ref<0>, #ad.ref<1>] {} : (tensor<?x2xf32>, tensor<?x1xf32>) -> tensor<?x2xf32>
  %reshape = ad.reshape %div_ [-1] : tensor<?x2xf32> -> tensor<?xf32>
  %reshape_1 = ad.reshape %topk_1 [-1] : tensor<?x2xi64> -> tensor<?xi64>
  %sort, %sort_1 = ad.torch_op "aten.sort.default"(%reshape_1) [#ad.ref<0>] {} unpack : (tensor<?xi64>) -> (tensor<?xi64>, tensor<?xi64>)
  %floor_divide = ad.torch_op "aten.floor_divide.default"(%sort_1) [#ad.ref<0>, 2 : i64] {} : (tensor<?xi64>) -> tensor<?xi64>
  %index = ad.torch_op "aten.index.Tensor"(%view, %floor_divide) [#ad.ref<0>, [#ad.ref<1>]] {} : (tensor<?x16xf32>, tensor<?xi64>) -> tensor<?x16xf32>
  %index_1 = ad.torch_op "aten.index.Tensor"(%reshape, %sort_1) [#ad.ref<0>, [#ad.ref<1>]] {} : (tensor<?xf32>, tensor<?xi64>) -> tensor<?xf32>
  %to = ad.cast %sort : tensor<?xi64> -> tensor<?xf32>
  %histc = ad.torch_op "aten.histc.default"(%to) [#ad.ref<0>, 4 : i64, 0 : i64, 3 : i64] {} : (tensor<?xf32>) -> tensor<4xf32>
  %cumsum = ad.torch_op "aten.cumsum.default"(%histc) [#ad.ref<0>, 0 : i64] {dtype = i32} : (tensor<4xf32>) -> tensor<4xi32>
  %transpose = ad.transpose %p_experts_gate_up_proj -2, -1 : tensor<4x16x16xf32> -> tensor<4x16x16xf32>
  %grouped_mm_fallback = ad.torch_op "transformers.grouped_mm_fallback.default"(%index, %transpose, %cumsum) [#ad.ref<0>, #ad.ref<1>, #ad.ref<2>] {} : (tensor<?x16xf32>, tensor<4x16x16xf32>, tensor<4xi32>) -> tensor<?x16xf32>
  %chunk, %chunk_1 = ad.torch_op "aten.chunk.default"(%grouped_mm_fallback) [#ad.ref<0>, 2 : i64, -1 : i64] {} unpack : (tensor<?x16xf32>) -> (tensor<?x8xf32>, tensor<?x8xf32>)
  %silu = ad.silu %chunk : tensor<?x8xf32> -> tensor<?x8xf32>
  %mul = ad.mul %silu, %chunk_1 : tensor<?x8xf32>, tensor<?x8xf32> -> tensor<?x8xf32>
  %transpose_1 = ad.transpose %p_experts_down_proj -2, -1 : tensor<4x16x8xf32> -> tensor<4x8x16xf32>
  %grouped_mm_fallback_1 = ad.torch_op "transformers.grouped_mm_fallback.default"(%mul, %transpose_1, %cumsum) [#ad.ref<0>, #ad.ref<1>, #ad.ref<2>] {} : (tensor<?x8xf32>, tensor<4x8x16xf32>, tensor<4xi32>) -> tensor<?x16xf32>
  %unsqueeze = ad.unsqueeze %index_1 dim -1 : tensor<?xf32> -> tensor<?x1xf32>
  %mul_1 = ad.mul %grouped_mm_fallback_1, %unsqueeze : tensor<?x16xf32>, tensor<?x1xf32> -> tensor<?x16xf32>
  %empty_like = ad.torch_op "aten.empty_like.default"(%sort_1) [#ad.ref<0>] {pin_memory = false} : (tensor<?xi64>) -> tensor<?xi64>
  %mul_2 = ad.torch_op "_operator.mul"(%sym_size_int) [2 : i64, #ad.ref<0>] {} : (index) -> index
  %0 = ad.constant 0 : i64
  %1 = ad.constant 1 : i64
  %arange = ad.arange %0, %mul_2, %1 device <device "cpu"> : i64, index, i64 -> tensor<?xi64>
  %index_put_ = ad.torch_op "aten.index_put_.default"(%empty_like, %sort_1, %arange) [#ad.ref<0>, [#ad.ref<1>], #ad.ref<2>] {} : (tensor<?xi64>, tensor<?xi64>, tensor<?xi64>) -> tensor<?xi64>
  %index_2 = ad.torch_op "aten.index.Tensor"(%mul_1, %index_put_) [#ad.ref<0>, [#ad.ref<1>]] {} : (tensor<?x16xf32>, tensor<?xi64>) -> tensor<?x16xf32>
  %view_1 = ad.reshape %index_2 [%sym_size_int, 2, 16] : tensor<?x16xf32> -> tensor<?x2x16xf32>
  %sum_1 = ad.sum %view_1 dim [1] : tensor<?x2x16xf32> -> tensor<?x16xf32>
  %reshape_2 = ad.reshape %sum_1 [1, %sym_size_int, 16] : tensor<?x16xf32> -> tensor<1x?x16xf32>
  func.return %reshape_2 : tensor<1x?x16xf32>
}

// -----

// Qwen2-MoE in bf16: the routing weights are cast to bf16 (round_weights); the shared expert
// (intermediate 16 = 2 x the experts' 8) becomes 2 virtual experts appended to the stacked
// weights by weight-only ops, weighted by the sigmoid of its gate's logits.
// CHECK-LABEL: func.func @qwen2_moe_bf16
// CHECK-NOT:     aten.topk
// CHECK-NOT:     aten.sort
// CHECK-NOT:     aten.histc
// CHECK-NOT:     grouped_mm
// CHECK-NOT:     aten.index
// CHECK:         %[[L:.*]] = ad.linear %[[X:.*]], %p_gate_weight
// CHECK-NEXT:    %[[G:.*]] = ad.linear %[[X]], %p_shared_expert_gate_weight : (tensor<?x16xbf16>, tensor<1x16xbf16>) -> tensor<?x1xbf16>
// CHECK-NEXT:    %[[SG:.*]] = ad.reshape %p_shared_expert_gate_proj_weight [2, 8, 16]
// CHECK-NEXT:    %[[SU:.*]] = ad.reshape %p_shared_expert_up_proj_weight [2, 8, 16]
// CHECK-NEXT:    %[[SGU:.*]] = ad.cat %[[SG]], %[[SU]] dim 1 : (tensor<2x8x16xbf16>, tensor<2x8x16xbf16>) -> tensor<2x16x16xbf16>
// CHECK-NEXT:    %[[SD:.*]] = ad.reshape %p_shared_expert_down_proj_weight [16, 2, 8]
// CHECK-NEXT:    %[[SDP:.*]] = ad.permute %[[SD]] [1, 0, 2] : tensor<16x2x8xbf16> -> tensor<2x16x8xbf16>
// CHECK-NEXT:    %[[GU:.*]] = ad.cat %p_experts_gate_up_proj, %[[SGU]] dim 0 : {{.*}} -> tensor<6x16x16xbf16>
// CHECK-NEXT:    %[[D:.*]] = ad.cat %p_experts_down_proj, %[[SDP]] dim 0 : {{.*}} -> tensor<6x16x8xbf16>
// CHECK-NEXT:    ad.moe %[[X]], %[[L]] experts %[[GU]], %[[D]] shared 2 gate %[[G]] top_k 2 round_weights : (tensor<?x16xbf16>, tensor<?x4xbf16>, tensor<6x16x16xbf16>, tensor<6x16x8xbf16>, tensor<?x1xbf16>) -> tensor<?x16xbf16>
// CHECK-NOT:     ad.sigmoid
// CHECK-NOT:     ad.silu
func.func @qwen2_moe_bf16(%p_gate_weight: tensor<4x16xbf16> {ad.param = "gate.weight"}, %p_experts_gate_up_proj: tensor<4x16x16xbf16> {ad.param = "experts.gate_up_proj"}, %p_experts_down_proj: tensor<4x16x8xbf16> {ad.param = "experts.down_proj"}, %p_shared_expert_gate_proj_weight: tensor<16x16xbf16> {ad.param = "shared_expert.gate_proj.weight"}, %p_shared_expert_up_proj_weight: tensor<16x16xbf16> {ad.param = "shared_expert.up_proj.weight"}, %p_shared_expert_down_proj_weight: tensor<16x16xbf16> {ad.param = "shared_expert.down_proj.weight"}, %p_shared_expert_gate_weight: tensor<1x16xbf16> {ad.param = "shared_expert_gate.weight"}, %hidden_states: tensor<1x?x16xbf16> {ad.input = "hidden_states"}) -> tensor<1x?x16xbf16> {
  %sym_size_int = ad.sym_size %hidden_states dim 1 : tensor<1x?x16xbf16>
  %view = ad.reshape %hidden_states [-1, 16] : tensor<1x?x16xbf16> -> tensor<?x16xbf16>
  %linear = ad.linear %view, %p_shared_expert_gate_proj_weight : (tensor<?x16xbf16>, tensor<16x16xbf16>) -> tensor<?x16xbf16>
  %silu = ad.silu %linear : tensor<?x16xbf16> -> tensor<?x16xbf16>
  %linear_1 = ad.linear %view, %p_shared_expert_up_proj_weight : (tensor<?x16xbf16>, tensor<16x16xbf16>) -> tensor<?x16xbf16>
  %mul = ad.mul %silu, %linear_1 : tensor<?x16xbf16>, tensor<?x16xbf16> -> tensor<?x16xbf16>
  %linear_2 = ad.linear %mul, %p_shared_expert_down_proj_weight : (tensor<?x16xbf16>, tensor<16x16xbf16>) -> tensor<?x16xbf16>
  %linear_3 = ad.linear %view, %p_gate_weight : (tensor<?x16xbf16>, tensor<4x16xbf16>) -> tensor<?x4xbf16>
  %softmax = ad.softmax %linear_3 dim -1 dtype f32 : tensor<?x4xbf16> -> tensor<?x4xf32>
  %topk, %topk_1 = ad.torch_op "aten.topk.default"(%softmax) [#ad.ref<0>, 2 : i64] {} unpack : (tensor<?x4xf32>) -> (tensor<?x2xf32>, tensor<?x2xi64>)
  %to = ad.cast %topk : tensor<?x2xf32> -> tensor<?x2xbf16>
  %reshape = ad.reshape %to [-1] : tensor<?x2xbf16> -> tensor<?xbf16>
  %reshape_1 = ad.reshape %topk_1 [-1] : tensor<?x2xi64> -> tensor<?xi64>
  %sort, %sort_1 = ad.torch_op "aten.sort.default"(%reshape_1) [#ad.ref<0>] {} unpack : (tensor<?xi64>) -> (tensor<?xi64>, tensor<?xi64>)
  %floor_divide = ad.torch_op "aten.floor_divide.default"(%sort_1) [#ad.ref<0>, 2 : i64] {} : (tensor<?xi64>) -> tensor<?xi64>
  %index = ad.torch_op "aten.index.Tensor"(%view, %floor_divide) [#ad.ref<0>, [#ad.ref<1>]] {} : (tensor<?x16xbf16>, tensor<?xi64>) -> tensor<?x16xbf16>
  %index_1 = ad.torch_op "aten.index.Tensor"(%reshape, %sort_1) [#ad.ref<0>, [#ad.ref<1>]] {} : (tensor<?xbf16>, tensor<?xi64>) -> tensor<?xbf16>
  %to_1 = ad.cast %sort : tensor<?xi64> -> tensor<?xf32>
  %histc = ad.torch_op "aten.histc.default"(%to_1) [#ad.ref<0>, 4 : i64, 0 : i64, 3 : i64] {} : (tensor<?xf32>) -> tensor<4xf32>
  %cumsum = ad.torch_op "aten.cumsum.default"(%histc) [#ad.ref<0>, 0 : i64] {dtype = i32} : (tensor<4xf32>) -> tensor<4xi32>
  %transpose = ad.transpose %p_experts_gate_up_proj -2, -1 : tensor<4x16x16xbf16> -> tensor<4x16x16xbf16>
  %_grouped_mm = ad.torch_op "aten._grouped_mm.default"(%index, %transpose, %cumsum) [#ad.ref<0>, #ad.ref<1>, #ad.ref<2>] {} : (tensor<?x16xbf16>, tensor<4x16x16xbf16>, tensor<4xi32>) -> tensor<?x16xbf16>
  %chunk, %chunk_1 = ad.torch_op "aten.chunk.default"(%_grouped_mm) [#ad.ref<0>, 2 : i64, -1 : i64] {} unpack : (tensor<?x16xbf16>) -> (tensor<?x8xbf16>, tensor<?x8xbf16>)
  %silu_1 = ad.silu %chunk : tensor<?x8xbf16> -> tensor<?x8xbf16>
  %mul_1 = ad.mul %silu_1, %chunk_1 : tensor<?x8xbf16>, tensor<?x8xbf16> -> tensor<?x8xbf16>
  %transpose_1 = ad.transpose %p_experts_down_proj -2, -1 : tensor<4x16x8xbf16> -> tensor<4x8x16xbf16>
  %_grouped_mm_1 = ad.torch_op "aten._grouped_mm.default"(%mul_1, %transpose_1, %cumsum) [#ad.ref<0>, #ad.ref<1>, #ad.ref<2>] {} : (tensor<?x8xbf16>, tensor<4x8x16xbf16>, tensor<4xi32>) -> tensor<?x16xbf16>
  %unsqueeze = ad.unsqueeze %index_1 dim -1 : tensor<?xbf16> -> tensor<?x1xbf16>
  %mul_2 = ad.mul %_grouped_mm_1, %unsqueeze : tensor<?x16xbf16>, tensor<?x1xbf16> -> tensor<?x16xbf16>
  %empty_like = ad.torch_op "aten.empty_like.default"(%sort_1) [#ad.ref<0>] {pin_memory = false} : (tensor<?xi64>) -> tensor<?xi64>
  %mul_3 = ad.torch_op "_operator.mul"(%sym_size_int) [2 : i64, #ad.ref<0>] {} : (index) -> index
  %0 = ad.constant 0 : i64
  %1 = ad.constant 1 : i64
  %arange = ad.arange %0, %mul_3, %1 device <device "cpu"> : i64, index, i64 -> tensor<?xi64>
  %index_put_ = ad.torch_op "aten.index_put_.default"(%empty_like, %sort_1, %arange) [#ad.ref<0>, [#ad.ref<1>], #ad.ref<2>] {} : (tensor<?xi64>, tensor<?xi64>, tensor<?xi64>) -> tensor<?xi64>
  %index_2 = ad.torch_op "aten.index.Tensor"(%mul_2, %index_put_) [#ad.ref<0>, [#ad.ref<1>]] {} : (tensor<?x16xbf16>, tensor<?xi64>) -> tensor<?x16xbf16>
  %view_1 = ad.reshape %index_2 [%sym_size_int, 2, 16] : tensor<?x16xbf16> -> tensor<?x2x16xbf16>
  %sum = ad.sum %view_1 dim [1] : tensor<?x2x16xbf16> -> tensor<?x16xbf16>
  %linear_4 = ad.linear %view, %p_shared_expert_gate_weight : (tensor<?x16xbf16>, tensor<1x16xbf16>) -> tensor<?x1xbf16>
  %sigmoid = ad.sigmoid %linear_4 : tensor<?x1xbf16> -> tensor<?x1xbf16>
  %mul_4 = ad.mul %sigmoid, %linear_2 : tensor<?x1xbf16>, tensor<?x16xbf16> -> tensor<?x16xbf16>
  %add = ad.add %sum, %mul_4 : tensor<?x16xbf16>, tensor<?x16xbf16> -> tensor<?x16xbf16>
  %reshape_2 = ad.reshape %add [1, %sym_size_int, 16] : tensor<?x16xbf16> -> tensor<1x?x16xbf16>
  func.return %reshape_2 : tensor<1x?x16xbf16>
}

// -----

// The same block with the shared expert's up projection weight an input of the graph, not a
// weight: the routed experts become ad.moe, the shared expert stays outside (no shared experts).
// CHECK-LABEL: func.func @qwen2_moe_shared_expert_of_inputs
// CHECK:         ad.linear %view, %p_shared_expert_up_proj_weight
// CHECK:         ad.moe %{{.*}} experts %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} top_k 2 round_weights :
// CHECK:         func.return
func.func @qwen2_moe_shared_expert_of_inputs(%p_gate_weight: tensor<4x16xbf16> {ad.param = "gate.weight"}, %p_experts_gate_up_proj: tensor<4x16x16xbf16> {ad.param = "experts.gate_up_proj"}, %p_experts_down_proj: tensor<4x16x8xbf16> {ad.param = "experts.down_proj"}, %p_shared_expert_gate_proj_weight: tensor<16x16xbf16> {ad.param = "shared_expert.gate_proj.weight"}, %p_shared_expert_up_proj_weight: tensor<16x16xbf16> {ad.input = "shared_up"}, %p_shared_expert_down_proj_weight: tensor<16x16xbf16> {ad.param = "shared_expert.down_proj.weight"}, %p_shared_expert_gate_weight: tensor<1x16xbf16> {ad.param = "shared_expert_gate.weight"}, %hidden_states: tensor<1x?x16xbf16> {ad.input = "hidden_states"}) -> tensor<1x?x16xbf16> {
  %sym_size_int = ad.sym_size %hidden_states dim 1 : tensor<1x?x16xbf16>
  %view = ad.reshape %hidden_states [-1, 16] : tensor<1x?x16xbf16> -> tensor<?x16xbf16>
  %linear = ad.linear %view, %p_shared_expert_gate_proj_weight : (tensor<?x16xbf16>, tensor<16x16xbf16>) -> tensor<?x16xbf16>
  %silu = ad.silu %linear : tensor<?x16xbf16> -> tensor<?x16xbf16>
  %linear_1 = ad.linear %view, %p_shared_expert_up_proj_weight : (tensor<?x16xbf16>, tensor<16x16xbf16>) -> tensor<?x16xbf16>
  %mul = ad.mul %silu, %linear_1 : tensor<?x16xbf16>, tensor<?x16xbf16> -> tensor<?x16xbf16>
  %linear_2 = ad.linear %mul, %p_shared_expert_down_proj_weight : (tensor<?x16xbf16>, tensor<16x16xbf16>) -> tensor<?x16xbf16>
  %linear_3 = ad.linear %view, %p_gate_weight : (tensor<?x16xbf16>, tensor<4x16xbf16>) -> tensor<?x4xbf16>
  %softmax = ad.softmax %linear_3 dim -1 dtype f32 : tensor<?x4xbf16> -> tensor<?x4xf32>
  %topk, %topk_1 = ad.torch_op "aten.topk.default"(%softmax) [#ad.ref<0>, 2 : i64] {} unpack : (tensor<?x4xf32>) -> (tensor<?x2xf32>, tensor<?x2xi64>)
  %to = ad.cast %topk : tensor<?x2xf32> -> tensor<?x2xbf16>
  %reshape = ad.reshape %to [-1] : tensor<?x2xbf16> -> tensor<?xbf16>
  %reshape_1 = ad.reshape %topk_1 [-1] : tensor<?x2xi64> -> tensor<?xi64>
  %sort, %sort_1 = ad.torch_op "aten.sort.default"(%reshape_1) [#ad.ref<0>] {} unpack : (tensor<?xi64>) -> (tensor<?xi64>, tensor<?xi64>)
  %floor_divide = ad.torch_op "aten.floor_divide.default"(%sort_1) [#ad.ref<0>, 2 : i64] {} : (tensor<?xi64>) -> tensor<?xi64>
  %index = ad.torch_op "aten.index.Tensor"(%view, %floor_divide) [#ad.ref<0>, [#ad.ref<1>]] {} : (tensor<?x16xbf16>, tensor<?xi64>) -> tensor<?x16xbf16>
  %index_1 = ad.torch_op "aten.index.Tensor"(%reshape, %sort_1) [#ad.ref<0>, [#ad.ref<1>]] {} : (tensor<?xbf16>, tensor<?xi64>) -> tensor<?xbf16>
  %to_1 = ad.cast %sort : tensor<?xi64> -> tensor<?xf32>
  %histc = ad.torch_op "aten.histc.default"(%to_1) [#ad.ref<0>, 4 : i64, 0 : i64, 3 : i64] {} : (tensor<?xf32>) -> tensor<4xf32>
  %cumsum = ad.torch_op "aten.cumsum.default"(%histc) [#ad.ref<0>, 0 : i64] {dtype = i32} : (tensor<4xf32>) -> tensor<4xi32>
  %transpose = ad.transpose %p_experts_gate_up_proj -2, -1 : tensor<4x16x16xbf16> -> tensor<4x16x16xbf16>
  %_grouped_mm = ad.torch_op "aten._grouped_mm.default"(%index, %transpose, %cumsum) [#ad.ref<0>, #ad.ref<1>, #ad.ref<2>] {} : (tensor<?x16xbf16>, tensor<4x16x16xbf16>, tensor<4xi32>) -> tensor<?x16xbf16>
  %chunk, %chunk_1 = ad.torch_op "aten.chunk.default"(%_grouped_mm) [#ad.ref<0>, 2 : i64, -1 : i64] {} unpack : (tensor<?x16xbf16>) -> (tensor<?x8xbf16>, tensor<?x8xbf16>)
  %silu_1 = ad.silu %chunk : tensor<?x8xbf16> -> tensor<?x8xbf16>
  %mul_1 = ad.mul %silu_1, %chunk_1 : tensor<?x8xbf16>, tensor<?x8xbf16> -> tensor<?x8xbf16>
  %transpose_1 = ad.transpose %p_experts_down_proj -2, -1 : tensor<4x16x8xbf16> -> tensor<4x8x16xbf16>
  %_grouped_mm_1 = ad.torch_op "aten._grouped_mm.default"(%mul_1, %transpose_1, %cumsum) [#ad.ref<0>, #ad.ref<1>, #ad.ref<2>] {} : (tensor<?x8xbf16>, tensor<4x8x16xbf16>, tensor<4xi32>) -> tensor<?x16xbf16>
  %unsqueeze = ad.unsqueeze %index_1 dim -1 : tensor<?xbf16> -> tensor<?x1xbf16>
  %mul_2 = ad.mul %_grouped_mm_1, %unsqueeze : tensor<?x16xbf16>, tensor<?x1xbf16> -> tensor<?x16xbf16>
  %empty_like = ad.torch_op "aten.empty_like.default"(%sort_1) [#ad.ref<0>] {pin_memory = false} : (tensor<?xi64>) -> tensor<?xi64>
  %mul_3 = ad.torch_op "_operator.mul"(%sym_size_int) [2 : i64, #ad.ref<0>] {} : (index) -> index
  %0 = ad.constant 0 : i64
  %1 = ad.constant 1 : i64
  %arange = ad.arange %0, %mul_3, %1 device <device "cpu"> : i64, index, i64 -> tensor<?xi64>
  %index_put_ = ad.torch_op "aten.index_put_.default"(%empty_like, %sort_1, %arange) [#ad.ref<0>, [#ad.ref<1>], #ad.ref<2>] {} : (tensor<?xi64>, tensor<?xi64>, tensor<?xi64>) -> tensor<?xi64>
  %index_2 = ad.torch_op "aten.index.Tensor"(%mul_2, %index_put_) [#ad.ref<0>, [#ad.ref<1>]] {} : (tensor<?x16xbf16>, tensor<?xi64>) -> tensor<?x16xbf16>
  %view_1 = ad.reshape %index_2 [%sym_size_int, 2, 16] : tensor<?x16xbf16> -> tensor<?x2x16xbf16>
  %sum = ad.sum %view_1 dim [1] : tensor<?x2x16xbf16> -> tensor<?x16xbf16>
  %linear_4 = ad.linear %view, %p_shared_expert_gate_weight : (tensor<?x16xbf16>, tensor<1x16xbf16>) -> tensor<?x1xbf16>
  %sigmoid = ad.sigmoid %linear_4 : tensor<?x1xbf16> -> tensor<?x1xbf16>
  %mul_4 = ad.mul %sigmoid, %linear_2 : tensor<?x1xbf16>, tensor<?x16xbf16> -> tensor<?x16xbf16>
  %add = ad.add %sum, %mul_4 : tensor<?x16xbf16>, tensor<?x16xbf16> -> tensor<?x16xbf16>
  %reshape_2 = ad.reshape %add [1, %sym_size_int, 16] : tensor<?x16xbf16> -> tensor<1x?x16xbf16>
  func.return %reshape_2 : tensor<1x?x16xbf16>
}

// -----

// A hand-written per-expert loop (torch.where on a one-hot mask, each expert's own w1/w3/w2
// linears, index_add_): the experts' weights are stacked by weight-only ops, w1 and w3 of each
// expert in turn; torch.export's range asserts on the unbacked sizes go too.
// CHECK-LABEL: func.func @per_expert_loop
// CHECK-NOT:     aten.topk
// CHECK-NOT:     aten.sort
// CHECK-NOT:     aten.histc
// CHECK-NOT:     grouped_mm
// CHECK-NOT:     aten.index
// CHECK-NOT:     aten.where
// CHECK-NOT:     aten._assert_scalar
// CHECK:         %[[L:.*]] = ad.linear %x, %p_gate_weight
// CHECK-NEXT:    %[[GU:.*]] = ad.cat %p_experts_0_w1_weight, %p_experts_0_w3_weight, %p_experts_1_w1_weight, %p_experts_1_w3_weight dim 0
// CHECK-NEXT:    %[[GU3:.*]] = ad.reshape %[[GU]] [2, 16, 16]
// CHECK-NEXT:    %[[D:.*]] = ad.cat %p_experts_0_w2_weight, %p_experts_1_w2_weight dim 0
// CHECK-NEXT:    %[[D3:.*]] = ad.reshape %[[D]] [2, 16, 8]
// CHECK-NEXT:    %[[M:.*]] = ad.moe %x, %[[L]] experts %[[GU3]], %[[D3]] top_k 2 normalize : (tensor<?x16xf32>, tensor<?x2xf32>, tensor<2x16x16xf32>, tensor<2x16x8xf32>) -> tensor<?x16xf32>
// CHECK-NEXT:    func.return %[[M]]
func.func @per_expert_loop(%p_gate_weight: tensor<2x16xf32> {ad.param = "gate.weight"}, %p_experts_0_w1_weight: tensor<8x16xf32> {ad.param = "experts.0.w1.weight"}, %p_experts_0_w3_weight: tensor<8x16xf32> {ad.param = "experts.0.w3.weight"}, %p_experts_0_w2_weight: tensor<16x8xf32> {ad.param = "experts.0.w2.weight"}, %p_experts_1_w1_weight: tensor<8x16xf32> {ad.param = "experts.1.w1.weight"}, %p_experts_1_w3_weight: tensor<8x16xf32> {ad.param = "experts.1.w3.weight"}, %p_experts_1_w2_weight: tensor<16x8xf32> {ad.param = "experts.1.w2.weight"}, %x: tensor<?x16xf32> {ad.input = "x"}) -> tensor<?x16xf32> {
  %linear = ad.linear %x, %p_gate_weight : (tensor<?x16xf32>, tensor<2x16xf32>) -> tensor<?x2xf32>
  %softmax = ad.softmax %linear dim 1 dtype f32 : tensor<?x2xf32> -> tensor<?x2xf32>
  %topk, %topk_1 = ad.torch_op "aten.topk.default"(%softmax) [#ad.ref<0>, 2 : i64] {} unpack : (tensor<?x2xf32>) -> (tensor<?x2xf32>, tensor<?x2xi64>)
  %sum = ad.sum %topk dim [-1] keepdim : tensor<?x2xf32> -> tensor<?x1xf32>
  %div_ = ad.torch_op "aten.div_.Tensor"(%topk, %sum) [#ad.ref<0>, #ad.ref<1>] {} : (tensor<?x2xf32>, tensor<?x1xf32>) -> tensor<?x2xf32>
  %zeros_like = ad.torch_op "aten.zeros_like.default"(%x) [#ad.ref<0>] {pin_memory = false} : (tensor<?x16xf32>) -> tensor<?x16xf32>
  %one_hot = ad.torch_op "aten.one_hot.default"(%topk_1) [#ad.ref<0>, 2 : i64] {} : (tensor<?x2xi64>) -> tensor<?x2x2xi64>
  %permute = ad.permute %one_hot [2, 1, 0] : tensor<?x2x2xi64> -> tensor<2x2x?xi64>
  %select = ad.torch_op "aten.select.int"(%permute) [#ad.ref<0>, 0 : i64, 0 : i64] {} : (tensor<2x2x?xi64>) -> tensor<2x?xi64>
  %where, %where_1 = ad.torch_op "aten.where.default"(%select) [#ad.ref<0>] {} unpack : (tensor<2x?xi64>) -> (tensor<?xi64>, tensor<?xi64>)
  %sym_size_int = ad.sym_size %where dim 0 : tensor<?xi64>
  %ge = ad.torch_op "_operator.ge"(%sym_size_int) [#ad.ref<0>, 0 : i64] {} : (index) -> i1
  ad.torch_op "aten._assert_scalar.default"(%ge) [#ad.ref<0>, "Runtime assertion failed for expression u0 >= 0 on node 'ge'"] {} : (i1) -> ()
  %le = ad.torch_op "_operator.le"(%sym_size_int) [#ad.ref<0>, 2048 : i64] {} : (index) -> i1
  ad.torch_op "aten._assert_scalar.default"(%le) [#ad.ref<0>, "Runtime assertion failed for expression u0 <= 2048 on node 'le'"] {} : (i1) -> ()
  %index = ad.torch_op "aten.index.Tensor"(%x, %where_1) [#ad.ref<0>, [#ad.ref<1>]] {} : (tensor<?x16xf32>, tensor<?xi64>) -> tensor<?x16xf32>
  %linear_1 = ad.linear %index, %p_experts_0_w1_weight : (tensor<?x16xf32>, tensor<8x16xf32>) -> tensor<?x8xf32>
  %silu = ad.silu %linear_1 : tensor<?x8xf32> -> tensor<?x8xf32>
  %linear_2 = ad.linear %index, %p_experts_0_w3_weight : (tensor<?x16xf32>, tensor<8x16xf32>) -> tensor<?x8xf32>
  %mul = ad.mul %silu, %linear_2 : tensor<?x8xf32>, tensor<?x8xf32> -> tensor<?x8xf32>
  %linear_3 = ad.linear %mul, %p_experts_0_w2_weight : (tensor<?x8xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>
  %unsqueeze = ad.unsqueeze %div_ dim 2 : tensor<?x2xf32> -> tensor<?x2x1xf32>
  %index_1 = ad.torch_op "aten.index.Tensor"(%unsqueeze, %where_1, %where) [#ad.ref<0>, [#ad.ref<1>, #ad.ref<2>]] {} : (tensor<?x2x1xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<?x1xf32>
  %mul_1 = ad.mul %linear_3, %index_1 : tensor<?x16xf32>, tensor<?x1xf32> -> tensor<?x16xf32>
  %index_add_ = ad.torch_op "aten.index_add_.default"(%zeros_like, %where_1, %mul_1) [#ad.ref<0>, 0 : i64, #ad.ref<1>, #ad.ref<2>] {} : (tensor<?x16xf32>, tensor<?xi64>, tensor<?x16xf32>) -> tensor<?x16xf32>
  %select_1 = ad.torch_op "aten.select.int"(%permute) [#ad.ref<0>, 0 : i64, 1 : i64] {} : (tensor<2x2x?xi64>) -> tensor<2x?xi64>
  %where_2, %where_3 = ad.torch_op "aten.where.default"(%select_1) [#ad.ref<0>] {} unpack : (tensor<2x?xi64>) -> (tensor<?xi64>, tensor<?xi64>)
  %sym_size_int_1 = ad.sym_size %where_2 dim 0 : tensor<?xi64>
  %ge_1 = ad.torch_op "_operator.ge"(%sym_size_int_1) [#ad.ref<0>, 0 : i64] {} : (index) -> i1
  ad.torch_op "aten._assert_scalar.default"(%ge_1) [#ad.ref<0>, "Runtime assertion failed for expression u1 >= 0 on node 'ge_1'"] {} : (i1) -> ()
  %le_1 = ad.torch_op "_operator.le"(%sym_size_int_1) [#ad.ref<0>, 2048 : i64] {} : (index) -> i1
  ad.torch_op "aten._assert_scalar.default"(%le_1) [#ad.ref<0>, "Runtime assertion failed for expression u1 <= 2048 on node 'le_1'"] {} : (i1) -> ()
  %index_2 = ad.torch_op "aten.index.Tensor"(%x, %where_3) [#ad.ref<0>, [#ad.ref<1>]] {} : (tensor<?x16xf32>, tensor<?xi64>) -> tensor<?x16xf32>
  %linear_4 = ad.linear %index_2, %p_experts_1_w1_weight : (tensor<?x16xf32>, tensor<8x16xf32>) -> tensor<?x8xf32>
  %silu_1 = ad.silu %linear_4 : tensor<?x8xf32> -> tensor<?x8xf32>
  %linear_5 = ad.linear %index_2, %p_experts_1_w3_weight : (tensor<?x16xf32>, tensor<8x16xf32>) -> tensor<?x8xf32>
  %mul_2 = ad.mul %silu_1, %linear_5 : tensor<?x8xf32>, tensor<?x8xf32> -> tensor<?x8xf32>
  %linear_6 = ad.linear %mul_2, %p_experts_1_w2_weight : (tensor<?x8xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>
  %index_3 = ad.torch_op "aten.index.Tensor"(%unsqueeze, %where_3, %where_2) [#ad.ref<0>, [#ad.ref<1>, #ad.ref<2>]] {} : (tensor<?x2x1xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<?x1xf32>
  %mul_3 = ad.mul %linear_6, %index_3 : tensor<?x16xf32>, tensor<?x1xf32> -> tensor<?x16xf32>
  %index_add__1 = ad.torch_op "aten.index_add_.default"(%index_add_, %where_3, %mul_3) [#ad.ref<0>, 0 : i64, #ad.ref<1>, #ad.ref<2>] {} : (tensor<?x16xf32>, tensor<?xi64>, tensor<?x16xf32>) -> tensor<?x16xf32>
  func.return %index_add__1 : tensor<?x16xf32>
}

// -----

// Not matched: experts with another activation than silu(gate) * up stay as they are.
// CHECK-LABEL: func.func @gelu_experts
// CHECK-NOT:     ad.moe
// CHECK:         aten.topk
// CHECK:         ad.gelu
// CHECK:         transformers.grouped_mm_fallback
func.func @gelu_experts(%p_gate_weight: tensor<4x16xf32> {ad.param = "gate.weight"}, %p_experts_gate_up_proj: tensor<4x16x16xf32> {ad.param = "experts.gate_up_proj"}, %p_experts_down_proj: tensor<4x16x8xf32> {ad.param = "experts.down_proj"}, %hidden_states: tensor<1x?x16xf32> {ad.input = "hidden_states"}) -> tensor<1x?x16xf32> {
  %sym_size_int = ad.sym_size %hidden_states dim 1 : tensor<1x?x16xf32>
  %view = ad.reshape %hidden_states [-1, 16] : tensor<1x?x16xf32> -> tensor<?x16xf32>
  %linear = ad.linear %view, %p_gate_weight : (tensor<?x16xf32>, tensor<4x16xf32>) -> tensor<?x4xf32>
  %softmax = ad.softmax %linear dim -1 : tensor<?x4xf32> -> tensor<?x4xf32>
  %topk, %topk_1 = ad.torch_op "aten.topk.default"(%softmax) [#ad.ref<0>, 2 : i64] {} unpack : (tensor<?x4xf32>) -> (tensor<?x2xf32>, tensor<?x2xi64>)
  %sum = ad.sum %topk dim [-1] keepdim : tensor<?x2xf32> -> tensor<?x1xf32>
  %div_ = ad.torch_op "aten.div_.Tensor"(%topk, %sum) [#ad.ref<0>, #ad.ref<1>] {} : (tensor<?x2xf32>, tensor<?x1xf32>) -> tensor<?x2xf32>
  %reshape = ad.reshape %div_ [-1] : tensor<?x2xf32> -> tensor<?xf32>
  %reshape_1 = ad.reshape %topk_1 [-1] : tensor<?x2xi64> -> tensor<?xi64>
  %sort, %sort_1 = ad.torch_op "aten.sort.default"(%reshape_1) [#ad.ref<0>] {} unpack : (tensor<?xi64>) -> (tensor<?xi64>, tensor<?xi64>)
  %floor_divide = ad.torch_op "aten.floor_divide.default"(%sort_1) [#ad.ref<0>, 2 : i64] {} : (tensor<?xi64>) -> tensor<?xi64>
  %index = ad.torch_op "aten.index.Tensor"(%view, %floor_divide) [#ad.ref<0>, [#ad.ref<1>]] {} : (tensor<?x16xf32>, tensor<?xi64>) -> tensor<?x16xf32>
  %index_1 = ad.torch_op "aten.index.Tensor"(%reshape, %sort_1) [#ad.ref<0>, [#ad.ref<1>]] {} : (tensor<?xf32>, tensor<?xi64>) -> tensor<?xf32>
  %to = ad.cast %sort : tensor<?xi64> -> tensor<?xf32>
  %histc = ad.torch_op "aten.histc.default"(%to) [#ad.ref<0>, 4 : i64, 0 : i64, 3 : i64] {} : (tensor<?xf32>) -> tensor<4xf32>
  %cumsum = ad.torch_op "aten.cumsum.default"(%histc) [#ad.ref<0>, 0 : i64] {dtype = i32} : (tensor<4xf32>) -> tensor<4xi32>
  %transpose = ad.transpose %p_experts_gate_up_proj -2, -1 : tensor<4x16x16xf32> -> tensor<4x16x16xf32>
  %grouped_mm_fallback = ad.torch_op "transformers.grouped_mm_fallback.default"(%index, %transpose, %cumsum) [#ad.ref<0>, #ad.ref<1>, #ad.ref<2>] {} : (tensor<?x16xf32>, tensor<4x16x16xf32>, tensor<4xi32>) -> tensor<?x16xf32>
  %chunk, %chunk_1 = ad.torch_op "aten.chunk.default"(%grouped_mm_fallback) [#ad.ref<0>, 2 : i64, -1 : i64] {} unpack : (tensor<?x16xf32>) -> (tensor<?x8xf32>, tensor<?x8xf32>)
  %silu = ad.gelu %chunk : tensor<?x8xf32> -> tensor<?x8xf32>
  %mul = ad.mul %silu, %chunk_1 : tensor<?x8xf32>, tensor<?x8xf32> -> tensor<?x8xf32>
  %transpose_1 = ad.transpose %p_experts_down_proj -2, -1 : tensor<4x16x8xf32> -> tensor<4x8x16xf32>
  %grouped_mm_fallback_1 = ad.torch_op "transformers.grouped_mm_fallback.default"(%mul, %transpose_1, %cumsum) [#ad.ref<0>, #ad.ref<1>, #ad.ref<2>] {} : (tensor<?x8xf32>, tensor<4x8x16xf32>, tensor<4xi32>) -> tensor<?x16xf32>
  %unsqueeze = ad.unsqueeze %index_1 dim -1 : tensor<?xf32> -> tensor<?x1xf32>
  %mul_1 = ad.mul %grouped_mm_fallback_1, %unsqueeze : tensor<?x16xf32>, tensor<?x1xf32> -> tensor<?x16xf32>
  %empty_like = ad.torch_op "aten.empty_like.default"(%sort_1) [#ad.ref<0>] {pin_memory = false} : (tensor<?xi64>) -> tensor<?xi64>
  %mul_2 = ad.torch_op "_operator.mul"(%sym_size_int) [2 : i64, #ad.ref<0>] {} : (index) -> index
  %0 = ad.constant 0 : i64
  %1 = ad.constant 1 : i64
  %arange = ad.arange %0, %mul_2, %1 device <device "cpu"> : i64, index, i64 -> tensor<?xi64>
  %index_put_ = ad.torch_op "aten.index_put_.default"(%empty_like, %sort_1, %arange) [#ad.ref<0>, [#ad.ref<1>], #ad.ref<2>] {} : (tensor<?xi64>, tensor<?xi64>, tensor<?xi64>) -> tensor<?xi64>
  %index_2 = ad.torch_op "aten.index.Tensor"(%mul_1, %index_put_) [#ad.ref<0>, [#ad.ref<1>]] {} : (tensor<?x16xf32>, tensor<?xi64>) -> tensor<?x16xf32>
  %view_1 = ad.reshape %index_2 [%sym_size_int, 2, 16] : tensor<?x16xf32> -> tensor<?x2x16xf32>
  %sum_1 = ad.sum %view_1 dim [1] : tensor<?x2x16xf32> -> tensor<?x16xf32>
  %reshape_2 = ad.reshape %sum_1 [1, %sym_size_int, 16] : tensor<?x16xf32> -> tensor<1x?x16xf32>
  func.return %reshape_2 : tensor<1x?x16xf32>
}

// -----

// Mixtral's block with the halves swapped: the activation of the second half times the first.
// ad.moe takes the gate first: no match.
// CHECK-LABEL: func.func @up_half_first
// CHECK-NOT:     ad.moe
// CHECK:         func.return
func.func @up_half_first(%p_gate_weight: tensor<4x16xf32> {ad.param = "gate.weight"}, %p_experts_gate_up_proj: tensor<4x16x16xf32> {ad.param = "experts.gate_up_proj"}, %p_experts_down_proj: tensor<4x16x8xf32> {ad.param = "experts.down_proj"}, %hidden_states: tensor<1x?x16xf32> {ad.input = "hidden_states"}) -> tensor<1x?x16xf32> {
  %sym_size_int = ad.sym_size %hidden_states dim 1 : tensor<1x?x16xf32>
  %view = ad.reshape %hidden_states [-1, 16] : tensor<1x?x16xf32> -> tensor<?x16xf32>
  %linear = ad.linear %view, %p_gate_weight : (tensor<?x16xf32>, tensor<4x16xf32>) -> tensor<?x4xf32>
  %softmax = ad.softmax %linear dim -1 : tensor<?x4xf32> -> tensor<?x4xf32>
  %topk, %topk_1 = ad.torch_op "aten.topk.default"(%softmax) [#ad.ref<0>, 2 : i64] {} unpack : (tensor<?x4xf32>) -> (tensor<?x2xf32>, tensor<?x2xi64>)
  %sum = ad.sum %topk dim [-1] keepdim : tensor<?x2xf32> -> tensor<?x1xf32>
  %div_ = ad.torch_op "aten.div_.Tensor"(%topk, %sum) [#ad.ref<0>, #ad.ref<1>] {} : (tensor<?x2xf32>, tensor<?x1xf32>) -> tensor<?x2xf32>
  %reshape = ad.reshape %div_ [-1] : tensor<?x2xf32> -> tensor<?xf32>
  %reshape_1 = ad.reshape %topk_1 [-1] : tensor<?x2xi64> -> tensor<?xi64>
  %sort, %sort_1 = ad.torch_op "aten.sort.default"(%reshape_1) [#ad.ref<0>] {} unpack : (tensor<?xi64>) -> (tensor<?xi64>, tensor<?xi64>)
  %floor_divide = ad.torch_op "aten.floor_divide.default"(%sort_1) [#ad.ref<0>, 2 : i64] {} : (tensor<?xi64>) -> tensor<?xi64>
  %index = ad.torch_op "aten.index.Tensor"(%view, %floor_divide) [#ad.ref<0>, [#ad.ref<1>]] {} : (tensor<?x16xf32>, tensor<?xi64>) -> tensor<?x16xf32>
  %index_1 = ad.torch_op "aten.index.Tensor"(%reshape, %sort_1) [#ad.ref<0>, [#ad.ref<1>]] {} : (tensor<?xf32>, tensor<?xi64>) -> tensor<?xf32>
  %to = ad.cast %sort : tensor<?xi64> -> tensor<?xf32>
  %histc = ad.torch_op "aten.histc.default"(%to) [#ad.ref<0>, 4 : i64, 0 : i64, 3 : i64] {} : (tensor<?xf32>) -> tensor<4xf32>
  %cumsum = ad.torch_op "aten.cumsum.default"(%histc) [#ad.ref<0>, 0 : i64] {dtype = i32} : (tensor<4xf32>) -> tensor<4xi32>
  %transpose = ad.transpose %p_experts_gate_up_proj -2, -1 : tensor<4x16x16xf32> -> tensor<4x16x16xf32>
  %grouped_mm_fallback = ad.torch_op "transformers.grouped_mm_fallback.default"(%index, %transpose, %cumsum) [#ad.ref<0>, #ad.ref<1>, #ad.ref<2>] {} : (tensor<?x16xf32>, tensor<4x16x16xf32>, tensor<4xi32>) -> tensor<?x16xf32>
  %chunk, %chunk_1 = ad.torch_op "aten.chunk.default"(%grouped_mm_fallback) [#ad.ref<0>, 2 : i64, -1 : i64] {} unpack : (tensor<?x16xf32>) -> (tensor<?x8xf32>, tensor<?x8xf32>)
  %silu = ad.silu %chunk_1 : tensor<?x8xf32> -> tensor<?x8xf32>
  %mul = ad.mul %silu, %chunk : tensor<?x8xf32>, tensor<?x8xf32> -> tensor<?x8xf32>
  %transpose_1 = ad.transpose %p_experts_down_proj -2, -1 : tensor<4x16x8xf32> -> tensor<4x8x16xf32>
  %grouped_mm_fallback_1 = ad.torch_op "transformers.grouped_mm_fallback.default"(%mul, %transpose_1, %cumsum) [#ad.ref<0>, #ad.ref<1>, #ad.ref<2>] {} : (tensor<?x8xf32>, tensor<4x8x16xf32>, tensor<4xi32>) -> tensor<?x16xf32>
  %unsqueeze = ad.unsqueeze %index_1 dim -1 : tensor<?xf32> -> tensor<?x1xf32>
  %mul_1 = ad.mul %grouped_mm_fallback_1, %unsqueeze : tensor<?x16xf32>, tensor<?x1xf32> -> tensor<?x16xf32>
  %empty_like = ad.torch_op "aten.empty_like.default"(%sort_1) [#ad.ref<0>] {pin_memory = false} : (tensor<?xi64>) -> tensor<?xi64>
  %mul_2 = ad.torch_op "_operator.mul"(%sym_size_int) [2 : i64, #ad.ref<0>] {} : (index) -> index
  %0 = ad.constant 0 : i64
  %1 = ad.constant 1 : i64
  %arange = ad.arange %0, %mul_2, %1 device <device "cpu"> : i64, index, i64 -> tensor<?xi64>
  %index_put_ = ad.torch_op "aten.index_put_.default"(%empty_like, %sort_1, %arange) [#ad.ref<0>, [#ad.ref<1>], #ad.ref<2>] {} : (tensor<?xi64>, tensor<?xi64>, tensor<?xi64>) -> tensor<?xi64>
  %index_2 = ad.torch_op "aten.index.Tensor"(%mul_1, %index_put_) [#ad.ref<0>, [#ad.ref<1>]] {} : (tensor<?x16xf32>, tensor<?xi64>) -> tensor<?x16xf32>
  %view_1 = ad.reshape %index_2 [%sym_size_int, 2, 16] : tensor<?x16xf32> -> tensor<?x2x16xf32>
  %sum_1 = ad.sum %view_1 dim [1] : tensor<?x2x16xf32> -> tensor<?x16xf32>
  %reshape_2 = ad.reshape %sum_1 [1, %sym_size_int, 16] : tensor<?x16xf32> -> tensor<1x?x16xf32>
  func.return %reshape_2 : tensor<1x?x16xf32>
}
