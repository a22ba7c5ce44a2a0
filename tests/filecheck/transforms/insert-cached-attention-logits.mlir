// insert-cached-attention{logits-indices=true} (the slot form as ad_mlir.LLM compiles it): the
// function gets a `logits_indices` argument after cache_slots and cache_starts, and the LM
// head's input is gathered at those token indices in every row, so a prefill's LM head runs on
// its last token only; logits that come from no ad.linear (a matmul here) are gathered themselves.
// RUN: ad-opt %s --split-input-file -p 'insert-cached-attention{max-batch=2 max-seq-len=16 logits-indices=true}' | filecheck %s

// CHECK-LABEL: func.func @llm
// CHECK-SAME:  %cache_slots: tensor<?xi64> {ad.input = "cache_slots", ad.cache_slots = ""}
// CHECK-SAME:  %cache_starts: tensor<?xi64> {ad.input = "cache_starts", ad.cache_starts = ""}
// CHECK-SAME:  %logits_indices: tensor<?xi64> {ad.input = "logits_indices", ad.logits_indices = ""}
// CHECK:       ad.cached_attention
// CHECK:       %h = ad.reshape
// CHECK-NEXT:  %[[ROWS:.*]] = ad.torch_op "aten.index_select.default"(%h, %logits_indices) [#ad.ref<0>, 1 : i64, #ad.ref<1>] {} : (tensor<1x?x16xf32>, tensor<?xi64>) -> tensor<1x?x16xf32>
// CHECK-NEXT:  %[[L:.*]] = ad.linear %[[ROWS]], %lm_head
// CHECK-NEXT:  func.return %[[L]]
func.func @llm(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x1x?x8xf32> {ad.input = "k"}, %v: tensor<1x1x?x8xf32> {ad.input = "v"}, %lm_head: tensor<32x16xf32> {ad.param = "lm_head.weight"}) -> tensor<1x?x32xf32> {
  %o = ad.attention %q, %k, %v causal : (tensor<1x2x?x8xf32>, tensor<1x1x?x8xf32>, tensor<1x1x?x8xf32>) -> tensor<1x2x?x8xf32> loc("model.layers.0.self_attn")
  %t = ad.transpose %o 1, 2 : tensor<1x2x?x8xf32> -> tensor<1x?x2x8xf32>
  %h = ad.reshape %t [1, -1, 16] : tensor<1x?x2x8xf32> -> tensor<1x?x16xf32>
  %logits = ad.linear %h, %lm_head : (tensor<1x?x16xf32>, tensor<32x16xf32>) -> tensor<1x?x32xf32>
  func.return %logits : tensor<1x?x32xf32>
}

// -----

// CHECK-LABEL: func.func @matmul_head
// CHECK:       %[[L:.*]] = ad.matmul %h, %head
// CHECK-NEXT:  %[[ROWS:.*]] = ad.torch_op "aten.index_select.default"(%[[L]], %logits_indices) [#ad.ref<0>, 1 : i64, #ad.ref<1>] {} : (tensor<1x?x32xf32>, tensor<?xi64>) -> tensor<1x?x32xf32>
// CHECK-NEXT:  func.return %[[ROWS]]
func.func @matmul_head(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x1x?x8xf32> {ad.input = "k"}, %v: tensor<1x1x?x8xf32> {ad.input = "v"}, %head: tensor<16x32xf32> {ad.param = "lm_head.weight"}) -> tensor<1x?x32xf32> {
  %o = ad.attention %q, %k, %v causal : (tensor<1x2x?x8xf32>, tensor<1x1x?x8xf32>, tensor<1x1x?x8xf32>) -> tensor<1x2x?x8xf32> loc("model.layers.0.self_attn")
  %t = ad.transpose %o 1, 2 : tensor<1x2x?x8xf32> -> tensor<1x?x2x8xf32>
  %h = ad.reshape %t [1, -1, 16] : tensor<1x?x2x8xf32> -> tensor<1x?x16xf32>
  %logits = ad.matmul %h, %head : (tensor<1x?x16xf32>, tensor<16x32xf32>) -> tensor<1x?x32xf32>
  func.return %logits : tensor<1x?x32xf32>
}
