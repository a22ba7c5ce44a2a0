// insert-cached-attention on a two-layer tiny Gemma2 exported for generation, in the pipeline
// `ad_mlir.LLM` runs (the default one with the pass before decompose, where the softmax is still
// an ad.softmax). Gemma2's attention is HF's eager form: matmul(q, k^T) * 256^-0.5, soft-capped
// at 50 (x / 50, tanh, * 50), plus an additive mask, softmax, matmul with v, after RoPE and
// repeat_kv (2 query heads, 1 key/value head of 32). Each layer's becomes one ad.cached_attention
// with softcap 50 over its own caches, applying the RoPE itself; layer 0 is a sliding-window
// layer (HF's default window of 4096 tokens: max-seq-len 4100 makes the window visible). The
// masks' computation is gone; the tanh left is the final logit soft-capping.
// The IR before the pass is written once, its locations kept (the caches are named after them).
// RUN: ad-opt --model gemma2 --layers 2 --for-generation -p 'canonicalize,match-rmsnorm,fuse-add-rmsnorm,fuse-gemms,fuse-silu-mul,fuse-rmsnorm-quant,fuse-rope-attention,optimize-rope' --print-debuginfo > %t.mlir
// RUN: ad-opt %t.mlir -p 'insert-cached-attention{max-batch=2 max-seq-len=4100},decompose,fuse-elementwise' | filecheck %s
// RUN: ad-opt %t.mlir | filecheck %s --check-prefix=BEFORE

// CHECK:      %cache_slots: tensor<?xi64> {ad.input = "cache_slots", ad.cache_slots = ""}
// CHECK-SAME: %cache_starts: tensor<?xi64> {ad.input = "cache_starts", ad.cache_starts = ""}
// CHECK-SAME: %[[K0:k_cache[_0-9]*]]: tensor<2x4100x1x32xf32> {ad.input = "k_cache_0", ad.cache = "model.layers.0.self_attn key"}
// CHECK-SAME: %[[V0:v_cache[_0-9]*]]: tensor<2x4100x1x32xf32> {ad.input = "v_cache_0", ad.cache = "model.layers.0.self_attn value"}
// CHECK-SAME: %[[K1:k_cache[_0-9]*]]: tensor<2x4100x1x32xf32> {ad.input = "k_cache_1", ad.cache = "model.layers.1.self_attn key"}
// CHECK-SAME: %[[V1:v_cache[_0-9]*]]: tensor<2x4100x1x32xf32> {ad.input = "v_cache_1", ad.cache = "model.layers.1.self_attn value"}
// CHECK-NOT:  aten.diff
// CHECK-NOT:  aten.cumsum
// CHECK-NOT:  aten.index
// CHECK-NOT:  ad.where
// CHECK-NOT:  ad.rope
// CHECK-NOT:  ad.matmul
// CHECK-NOT:  ad.tanh
// CHECK:      ad.cached_attention %{{.*}}, %{{.*}}, %{{.*}} rope %cos, %sin cache %[[K0]], %[[V0]] block_tables %block_tables cache_starts %cache_starts scale 6.250000e-02 window 4096 softcap 5.000000e+01 : (tensor<?x2x?x32xf32>, tensor<?x1x?x32xf32>, tensor<?x1x?x32xf32>, tensor<2x4100x1x32xf32>, tensor<2x4100x1x32xf32>, tensor<?x1xi64>, tensor<?xi64>, tensor<?x?x32xf32>, tensor<?x?x32xf32>) -> tensor<?x2x?x32xf32>
// CHECK-NOT:  ad.rope
// CHECK-NOT:  ad.matmul
// CHECK-NOT:  ad.tanh
// CHECK-NOT:  ad.exp
// CHECK:      ad.cached_attention %{{.*}}, %{{.*}}, %{{.*}} rope %cos, %sin cache %[[K1]], %[[V1]] block_tables %block_tables cache_starts %cache_starts scale 6.250000e-02 softcap 5.000000e+01 :
// CHECK-NOT:  ad.matmul
// CHECK-NOT:  ad.tanh
// CHECK-NOT:  ad.exp
// CHECK:      ad.linear %{{.*}}, %p_lm_head_weight
// CHECK:      ad.tanh
// CHECK-NOT:  ad.cached_attention
// CHECK:      func.return

// The chain and the masks the pass replaces, in each layer:
// BEFORE:     %[[CAUSAL:.*]] = ad.where %{{.*}}, %zeros, %{{.*}} : tensor<?x1x?x?xi1>, tensor<f32>, f64 -> tensor<?x1x?x?xf32>
// BEFORE:     %[[SLIDING:.*]] = ad.where %{{.*}}, %zeros_1, %{{.*}} : tensor<?x1x?x?xi1>, tensor<f32>, f64 -> tensor<?x1x?x?xf32>
// BEFORE:     %[[Q0:.*]], %[[K0:.*]] = ad.rope
// BEFORE:     ad.matmul %[[Q0]], %{{.*}}
// BEFORE:     ad.tanh
// BEFORE:     ad.add %{{.*}}, %[[SLIDING]]
// BEFORE:     ad.softmax %{{.*}} dim -1 dtype f32
// BEFORE:     ad.matmul
// BEFORE:     ad.rope
// BEFORE:     ad.tanh
// BEFORE:     ad.add %{{.*}}, %[[CAUSAL]]
// BEFORE:     ad.softmax
