// insert-cached-attention on a two-layer tiny Llama exported for generation (input_ids and
// position_ids, batch and sequence dynamic; hidden 64: 2 query heads, 1 key/value head of 32).
// Each attention becomes ad.cached_attention over its own layer's key and value caches
// [slots, max_seq, kv_heads, head_dim] (pools of one page per slot, the slots its block tables
// [batch, 1]); the slots/starts metadata arguments are shared; HF's
// mask construction (position-id diff, cumsum, index, compares) is gone, RoPE still reads the
// position_ids input.
// The fusions' IR is written once, its locations kept (the caches are named after them).
// RUN: ad-opt --model llama --layers 2 --for-generation -p 'canonicalize,match-rmsnorm,fuse-add-rmsnorm,fuse-rope-attention' --print-debuginfo > %t.mlir
// RUN: ad-opt %t.mlir -p 'insert-cached-attention{max-batch=4 max-seq-len=128}' | filecheck %s
// RUN: ad-opt %t.mlir | filecheck %s --check-prefix=BEFORE

// CHECK:      %input_ids: tensor<?x?xi64> {ad.input = "input_ids"}, %position_ids: tensor<?x?xi64> {ad.input = "position_ids"}
// CHECK-SAME: %cache_slots: tensor<?xi64> {ad.input = "cache_slots", ad.cache_slots = ""}
// CHECK-SAME: %cache_starts: tensor<?xi64> {ad.input = "cache_starts", ad.cache_starts = ""}
// CHECK-SAME: %[[K0:k_cache[_0-9]*]]: tensor<4x128x1x32xf32> {ad.input = "k_cache_0", ad.cache = "model.layers.0.self_attn key"}
// CHECK-SAME: %[[V0:v_cache[_0-9]*]]: tensor<4x128x1x32xf32> {ad.input = "v_cache_0", ad.cache = "model.layers.0.self_attn value"}
// CHECK-SAME: %[[K1:k_cache[_0-9]*]]: tensor<4x128x1x32xf32> {ad.input = "k_cache_1", ad.cache = "model.layers.1.self_attn key"}
// CHECK-SAME: %[[V1:v_cache[_0-9]*]]: tensor<4x128x1x32xf32> {ad.input = "v_cache_1", ad.cache = "model.layers.1.self_attn value"}
// CHECK-NEXT: %block_tables = ad.unsqueeze %cache_slots dim 1 : tensor<?xi64> -> tensor<?x1xi64>
// CHECK-NOT:  aten.diff
// CHECK-NOT:  aten.cumsum
// CHECK-NOT:  aten.index
// CHECK:      %cos = ad.cos
// CHECK-NOT:  rope_attention
// CHECK:      ad.cached_attention %{{.*}}, %{{.*}}, %{{.*}} rope %cos, %sin cache %[[K0]], %[[V0]] block_tables %block_tables cache_starts %cache_starts scale 0.17677669529663689 : (tensor<?x2x?x32xf32>, tensor<?x1x?x32xf32>, tensor<?x1x?x32xf32>, tensor<4x128x1x32xf32>, tensor<4x128x1x32xf32>, tensor<?x1xi64>, tensor<?xi64>, tensor<?x?x32xf32>, tensor<?x?x32xf32>) -> tensor<?x2x?x32xf32>
// CHECK-NOT:  rope_attention
// CHECK:      ad.cached_attention %{{.*}}, %{{.*}}, %{{.*}} rope %cos, %sin cache %[[K1]], %[[V1]] block_tables %block_tables cache_starts %cache_starts
// CHECK-NOT:  ad.cached_attention
// CHECK-NOT:  ad.rope_attention
// CHECK:      func.return

// The mask the pass drops, and the attention it replaces:
// BEFORE:     aten.diff.default"(%position_ids
// BEFORE:     aten.cumsum.default
// BEFORE:     ad.rope_attention {{.*}} mask
