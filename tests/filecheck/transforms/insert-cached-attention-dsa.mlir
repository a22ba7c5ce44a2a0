// insert-cached-attention on DeepSeek sparse attention as HF 5.24 writes it (DeepSeek-V3.2's
// indexer under SDPA: the indexer's heads score every key, relu, weighted sum over heads,
// masked_fill(~causal, -inf), topk(min(2, keys)); the attention's boolean mask is causal and not
// the ones scattered with False at the top-k): the indexer becomes `ad.cached_index_topk` over an
// index-key cache [slots, max-seq, index head dim] (4), and the MLA `ad.cached_mla_attention`
// restricted to its `selected` keys; the topk, scatter and both masks are gone. A second layer
// whose mask reuses the same topk (GLM-5's "shared" indexer layers) gets the same selection and
// no cache of its own.
// RUN: ad-opt %s --split-input-file -p 'insert-cached-attention{max-batch=2 max-seq-len=16}' | filecheck %s
// RUN: ad-opt %s --split-input-file -p 'insert-cached-attention{max-batch=2 max-seq-len=4}' | filecheck %s --check-prefix=CAP

// CHECK-LABEL: func.func @dsa
// CHECK-SAME:  %index_key_cache{{.*}}: tensor<2x16x4xf32> {ad.input = "index_key_cache_0", ad.cache = "model.layers.0.self_attn index_key"}
// CHECK-SAME:  %latent_cache{{.*}}: tensor<2x16x20xf32> {ad.input = "latent_cache_0", ad.cache = "model.layers.0.self_attn latent"}
// CHECK-SAME:  %latent_cache_1: tensor<2x16x20xf32> {ad.input = "latent_cache_1", ad.cache = "model.layers.1.self_attn latent"}
// CHECK-NOT:   index_key_cache_1
// CHECK-NOT:   aten.topk
// CHECK-NOT:   aten.masked_fill
// CHECK:       %[[SEL:.*]] = ad.cached_index_topk %iq, %ik, %iw cache %index_key_cache slots %cache_slots starts %cache_starts scale 5.000000e-01 topk 2 : (tensor<1x?x3x4xf32>, tensor<1x?x4xf32>, tensor<1x?x3xf32>, tensor<2x16x4xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<1x?x2xi64>
// CHECK-NOT:   aten.topk
// CHECK-NOT:   aten.scatter
// CHECK-NOT:   aten.masked_fill
// CHECK-NOT:   ad.bitwise_and
// CHECK-NOT:   ad.le
// CHECK:       %[[O0:.*]] = ad.cached_mla_attention %q_nope, %q_rot, %latent, %k_rot kv_b %w cache %latent_cache block_tables %block_tables cache_starts %cache_starts selected %[[SEL]] : tensor<1x?x2xi64> scale 0.28867513459481287 :
// CHECK:       %[[O1:.*]] = ad.cached_mla_attention %q_nope, %q_rot, %latent, %k_rot kv_b %w1 cache %latent_cache_1 block_tables %block_tables cache_starts %cache_starts selected %[[SEL]] : tensor<1x?x2xi64> scale 0.28867513459481287 :
// CHECK-NEXT:  %{{.*}} = ad.add %[[O0]], %[[O1]]
func.func @dsa(%q_nope: tensor<1x2x?x8xf32> {ad.input = "q_nope"}, %q_rot: tensor<1x2x?x4xf32> {ad.input = "q_rot"}, %latent: tensor<1x1x?x16xf32> {ad.input = "latent"}, %k_rot: tensor<1x1x?x4xf32> {ad.input = "k_rot"}, %iq: tensor<1x?x3x4xf32> {ad.input = "iq"}, %ik: tensor<1x?x4xf32> {ad.input = "ik"}, %iw: tensor<1x?x3xf32> {ad.input = "iw"}, %w: tensor<28x16xf32> {ad.param = "model.layers.0.self_attn.kv_b_proj.weight"}, %w1: tensor<28x16xf32> {ad.param = "model.layers.1.self_attn.kv_b_proj.weight"}, %position_ids: tensor<1x?xi64> {ad.input = "position_ids"}) -> tensor<1x2x?x6xf32> {
  %s = ad.sym_size %latent dim 2 : tensor<1x1x?x16xf32>
  %a = ad.unsqueeze %position_ids dim 2 : tensor<1x?xi64> -> tensor<1x?x1xi64>
  %b = ad.unsqueeze %position_ids dim 1 : tensor<1x?xi64> -> tensor<1x1x?xi64>
  %causal3 = ad.le %b, %a : tensor<1x1x?xi64>, tensor<1x?x1xi64> -> tensor<1x?x?xi1>
  %causal = ad.unsqueeze %causal3 dim 1 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %kt = ad.transpose %ik -1, -2 : tensor<1x?x4xf32> -> tensor<1x4x?xf32>
  %kt1 = ad.unsqueeze %kt dim 1 : tensor<1x4x?xf32> -> tensor<1x1x4x?xf32>
  %dots = ad.matmul %iq, %kt1 : (tensor<1x?x3x4xf32>, tensor<1x1x4x?xf32>) -> tensor<1x?x3x?xf32>
  %half = ad.constant 5.000000e-01 : f64
  %scaled = ad.mul %dots, %half : tensor<1x?x3x?xf32>, f64 -> tensor<1x?x3x?xf32>
  %relu = ad.relu %scaled : tensor<1x?x3x?xf32> -> tensor<1x?x3x?xf32>
  %row = ad.unsqueeze %iw dim -2 : tensor<1x?x3xf32> -> tensor<1x?x1x3xf32>
  %weighted = ad.matmul %row, %relu : (tensor<1x?x1x3xf32>, tensor<1x?x3x?xf32>) -> tensor<1x?x1x?xf32>
  %index = ad.squeeze %weighted dim [-2] : tensor<1x?x1x?xf32> -> tensor<1x?x?xf32>
  %not_causal = ad.bitwise_not %causal3 : tensor<1x?x?xi1> -> tensor<1x?x?xi1>
  %masked = ad.torch_op "aten.masked_fill.Scalar"(%index, %not_causal) [#ad.ref<0>, #ad.ref<1>, 0xfff0000000000000 : f64] {} : (tensor<1x?x?xf32>, tensor<1x?x?xi1>) -> tensor<1x?x?xf32>
  %count = ad.torch_op "torch.sym_min"(%s) [#ad.ref<0>, 2 : i64] {} : (index) -> index
  %values, %indices = ad.torch_op "aten.topk.default"(%masked, %count) [#ad.ref<0>, #ad.ref<1>] {} unpack : (tensor<1x?x?xf32>, index) -> (tensor<1x?x?xf32>, tensor<1x?x?xi64>)
  %i32 = ad.cast %indices : tensor<1x?x?xi64> -> tensor<1x?x?xi32>
  %i64 = ad.cast %i32 : tensor<1x?x?xi32> -> tensor<1x?x?xi64>
  %ones = ad.torch_op "aten.new_ones.default"(%i32, %s) [#ad.ref<0>, [1 : i64, #ad.ref<1>, #ad.ref<1>]] {dtype = i1, pin_memory = false} : (tensor<1x?x?xi32>, index) -> tensor<1x?x?xi1>
  %dropped = ad.torch_op "aten.scatter.value"(%ones, %i64) [#ad.ref<0>, -1 : i64, #ad.ref<1>, false] {} : (tensor<1x?x?xi1>, tensor<1x?x?xi64>) -> tensor<1x?x?xi1>
  %dropped4 = ad.unsqueeze %dropped dim 1 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %kept = ad.bitwise_not %dropped4 : tensor<1x1x?x?xi1> -> tensor<1x1x?x?xi1>
  %mask = ad.bitwise_and %causal, %kept : tensor<1x1x?x?xi1>, tensor<1x1x?x?xi1> -> tensor<1x1x?x?xi1>
  %query = ad.cat %q_nope, %q_rot dim -1 : (tensor<1x2x?x8xf32>, tensor<1x2x?x4xf32>) -> tensor<1x2x?x12xf32>
  %k_rot_heads = ad.expand %k_rot [-1, 2, -1, -1] : tensor<1x1x?x4xf32> -> tensor<1x2x?x4xf32>
  %kv = ad.linear %latent, %w : (tensor<1x1x?x16xf32>, tensor<28x16xf32>) -> tensor<1x1x?x28xf32>
  %view = ad.reshape %kv [1, %s, -1, 14] : tensor<1x1x?x28xf32> -> tensor<1x?x2x14xf32>
  %heads = ad.transpose %view 1, 2 : tensor<1x?x2x14xf32> -> tensor<1x2x?x14xf32>
  %k_nope, %value = ad.split %heads [8, 6] dim -1 : tensor<1x2x?x14xf32> -> tensor<1x2x?x8xf32>, tensor<1x2x?x6xf32>
  %key = ad.cat %k_nope, %k_rot_heads dim -1 : (tensor<1x2x?x8xf32>, tensor<1x2x?x4xf32>) -> tensor<1x2x?x12xf32>
  %o0 = ad.attention %query, %key, %value mask %mask scale 0.28867513459481287 : f64 : (tensor<1x2x?x12xf32>, tensor<1x2x?x12xf32>, tensor<1x2x?x6xf32>, tensor<1x1x?x?xi1>) -> tensor<1x2x?x6xf32> loc("model.layers.0.self_attn")
  %ones1 = ad.torch_op "aten.new_ones.default"(%i32, %s) [#ad.ref<0>, [1 : i64, #ad.ref<1>, #ad.ref<1>]] {dtype = i1, pin_memory = false} : (tensor<1x?x?xi32>, index) -> tensor<1x?x?xi1>
  %dropped1 = ad.torch_op "aten.scatter.value"(%ones1, %i64) [#ad.ref<0>, -1 : i64, #ad.ref<1>, false] {} : (tensor<1x?x?xi1>, tensor<1x?x?xi64>) -> tensor<1x?x?xi1>
  %dropped41 = ad.unsqueeze %dropped1 dim 1 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %kept1 = ad.bitwise_not %dropped41 : tensor<1x1x?x?xi1> -> tensor<1x1x?x?xi1>
  %mask1 = ad.bitwise_and %causal, %kept1 : tensor<1x1x?x?xi1>, tensor<1x1x?x?xi1> -> tensor<1x1x?x?xi1>
  %kv1 = ad.linear %latent, %w1 : (tensor<1x1x?x16xf32>, tensor<28x16xf32>) -> tensor<1x1x?x28xf32>
  %view1 = ad.reshape %kv1 [1, %s, -1, 14] : tensor<1x1x?x28xf32> -> tensor<1x?x2x14xf32>
  %heads1 = ad.transpose %view1 1, 2 : tensor<1x?x2x14xf32> -> tensor<1x2x?x14xf32>
  %k_nope1, %value1 = ad.split %heads1 [8, 6] dim -1 : tensor<1x2x?x14xf32> -> tensor<1x2x?x8xf32>, tensor<1x2x?x6xf32>
  %key1 = ad.cat %k_nope1, %k_rot_heads dim -1 : (tensor<1x2x?x8xf32>, tensor<1x2x?x4xf32>) -> tensor<1x2x?x12xf32>
  %o1 = ad.attention %query, %key1, %value1 mask %mask1 scale 0.28867513459481287 : f64 : (tensor<1x2x?x12xf32>, tensor<1x2x?x12xf32>, tensor<1x2x?x6xf32>, tensor<1x1x?x?xi1>) -> tensor<1x2x?x6xf32> loc("model.layers.1.self_attn")
  %sum = ad.add %o0, %o1 : tensor<1x2x?x6xf32>, tensor<1x2x?x6xf32> -> tensor<1x2x?x6xf32>
  func.return %sum : tensor<1x2x?x6xf32>
}

// -----

// The same indexer exported with index_topk 8 (`export_patches._PaddedTopk`): its top-k over the
// scores padded with min(8, keys) columns of -inf, the indices clamped to the last key. The pad
// and the clamp go with the topk; the indexer keeps 8, or as many as a slot holds (4 at max-seq-len 4).
// CAP-LABEL:   func.func @dsa_padded
// CAP:         ad.cached_index_topk {{.*}} topk 4 : {{.*}} -> tensor<1x?x4xi64>
// CHECK-LABEL: func.func @dsa_padded
// CHECK-NOT:   aten.pad
// CHECK:       %[[SEL:.*]] = ad.cached_index_topk %iq, %ik, %iw cache %index_key_cache slots %cache_slots starts %cache_starts scale 5.000000e-01 topk 8 : {{.*}} -> tensor<1x?x8xi64>
// CHECK-NOT:   aten.topk
// CHECK-NOT:   aten.clamp
// CHECK:       %[[O0:.*]] = ad.cached_mla_attention %q_nope, %q_rot, %latent, %k_rot kv_b %w cache %latent_cache block_tables %block_tables cache_starts %cache_starts selected %[[SEL]] : tensor<1x?x8xi64>
// CHECK-NOT:   aten.pad
// CHECK-NOT:   aten.clamp
// CHECK:       func.return %[[O0]]
func.func @dsa_padded(%q_nope: tensor<1x2x?x8xf32> {ad.input = "q_nope"}, %q_rot: tensor<1x2x?x4xf32> {ad.input = "q_rot"}, %latent: tensor<1x1x?x16xf32> {ad.input = "latent"}, %k_rot: tensor<1x1x?x4xf32> {ad.input = "k_rot"}, %iq: tensor<1x?x3x4xf32> {ad.input = "iq"}, %ik: tensor<1x?x4xf32> {ad.input = "ik"}, %iw: tensor<1x?x3xf32> {ad.input = "iw"}, %w: tensor<28x16xf32> {ad.param = "model.layers.0.self_attn.kv_b_proj.weight"}, %position_ids: tensor<1x?xi64> {ad.input = "position_ids"}) -> tensor<1x2x?x6xf32> {
  %s = ad.sym_size %latent dim 2 : tensor<1x1x?x16xf32>
  %a = ad.unsqueeze %position_ids dim 2 : tensor<1x?xi64> -> tensor<1x?x1xi64>
  %b = ad.unsqueeze %position_ids dim 1 : tensor<1x?xi64> -> tensor<1x1x?xi64>
  %causal3 = ad.le %b, %a : tensor<1x1x?xi64>, tensor<1x?x1xi64> -> tensor<1x?x?xi1>
  %causal = ad.unsqueeze %causal3 dim 1 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %kt = ad.transpose %ik -1, -2 : tensor<1x?x4xf32> -> tensor<1x4x?xf32>
  %kt1 = ad.unsqueeze %kt dim 1 : tensor<1x4x?xf32> -> tensor<1x1x4x?xf32>
  %dots = ad.matmul %iq, %kt1 : (tensor<1x?x3x4xf32>, tensor<1x1x4x?xf32>) -> tensor<1x?x3x?xf32>
  %half = ad.constant 5.000000e-01 : f64
  %scaled = ad.mul %dots, %half : tensor<1x?x3x?xf32>, f64 -> tensor<1x?x3x?xf32>
  %relu = ad.relu %scaled : tensor<1x?x3x?xf32> -> tensor<1x?x3x?xf32>
  %row = ad.unsqueeze %iw dim -2 : tensor<1x?x3xf32> -> tensor<1x?x1x3xf32>
  %weighted = ad.matmul %row, %relu : (tensor<1x?x1x3xf32>, tensor<1x?x3x?xf32>) -> tensor<1x?x1x?xf32>
  %index = ad.squeeze %weighted dim [-2] : tensor<1x?x1x?xf32> -> tensor<1x?x?xf32>
  %not_causal = ad.bitwise_not %causal3 : tensor<1x?x?xi1> -> tensor<1x?x?xi1>
  %masked = ad.torch_op "aten.masked_fill.Scalar"(%index, %not_causal) [#ad.ref<0>, #ad.ref<1>, 0xfff0000000000000 : f64] {} : (tensor<1x?x?xf32>, tensor<1x?x?xi1>) -> tensor<1x?x?xf32>
  %count = ad.torch_op "torch.sym_min"(%s) [#ad.ref<0>, 8 : i64] {} : (index) -> index
  %last = ad.torch_op "_operator.sub"(%s) [#ad.ref<0>, 1 : i64] {} : (index) -> index
  %padded = ad.torch_op "aten.pad.default"(%masked, %count) [#ad.ref<0>, [0 : i64, #ad.ref<1>], "constant", 0xfff0000000000000 : f64] {} : (tensor<1x?x?xf32>, index) -> tensor<1x?x?xf32>
  %values, %top = ad.torch_op "aten.topk.default"(%padded, %count) [#ad.ref<0>, #ad.ref<1>] {} unpack : (tensor<1x?x?xf32>, index) -> (tensor<1x?x?xf32>, tensor<1x?x?xi64>)
  %indices = ad.torch_op "aten.clamp.default"(%top, %last) [#ad.ref<0>, none, #ad.ref<1>] {} : (tensor<1x?x?xi64>, index) -> tensor<1x?x?xi64>
  %i32 = ad.cast %indices : tensor<1x?x?xi64> -> tensor<1x?x?xi32>
  %i64 = ad.cast %i32 : tensor<1x?x?xi32> -> tensor<1x?x?xi64>
  %ones = ad.torch_op "aten.new_ones.default"(%i32, %s) [#ad.ref<0>, [1 : i64, #ad.ref<1>, #ad.ref<1>]] {dtype = i1, pin_memory = false} : (tensor<1x?x?xi32>, index) -> tensor<1x?x?xi1>
  %dropped = ad.torch_op "aten.scatter.value"(%ones, %i64) [#ad.ref<0>, -1 : i64, #ad.ref<1>, false] {} : (tensor<1x?x?xi1>, tensor<1x?x?xi64>) -> tensor<1x?x?xi1>
  %dropped4 = ad.unsqueeze %dropped dim 1 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %kept = ad.bitwise_not %dropped4 : tensor<1x1x?x?xi1> -> tensor<1x1x?x?xi1>
  %mask = ad.bitwise_and %causal, %kept : tensor<1x1x?x?xi1>, tensor<1x1x?x?xi1> -> tensor<1x1x?x?xi1>
  %query = ad.cat %q_nope, %q_rot dim -1 : (tensor<1x2x?x8xf32>, tensor<1x2x?x4xf32>) -> tensor<1x2x?x12xf32>
  %k_rot_heads = ad.expand %k_rot [-1, 2, -1, -1] : tensor<1x1x?x4xf32> -> tensor<1x2x?x4xf32>
  %kv = ad.linear %latent, %w : (tensor<1x1x?x16xf32>, tensor<28x16xf32>) -> tensor<1x1x?x28xf32>
  %view = ad.reshape %kv [1, %s, -1, 14] : tensor<1x1x?x28xf32> -> tensor<1x?x2x14xf32>
  %heads = ad.transpose %view 1, 2 : tensor<1x?x2x14xf32> -> tensor<1x2x?x14xf32>
  %k_nope, %value = ad.split %heads [8, 6] dim -1 : tensor<1x2x?x14xf32> -> tensor<1x2x?x8xf32>, tensor<1x2x?x6xf32>
  %key = ad.cat %k_nope, %k_rot_heads dim -1 : (tensor<1x2x?x8xf32>, tensor<1x2x?x4xf32>) -> tensor<1x2x?x12xf32>
  %o0 = ad.attention %query, %key, %value mask %mask scale 0.28867513459481287 : f64 : (tensor<1x2x?x12xf32>, tensor<1x2x?x12xf32>, tensor<1x2x?x6xf32>, tensor<1x1x?x?xi1>) -> tensor<1x2x?x6xf32> loc("model.layers.0.self_attn")
  func.return %o0 : tensor<1x2x?x6xf32>
}
