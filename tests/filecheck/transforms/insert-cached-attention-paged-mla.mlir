// insert-cached-attention{paged=true} on DeepSeek-V3's MLA (as insert-cached-attention-mla.mlir
// writes HF's form): the latent ++ rotated key part is paged, one pool [num-pages, page-size,
// rank + rope] (8 x 16 x (16 + 4)), not the heads' K and V; the expansion by kv_b_proj is gone
// (the cached op absorbs it) and the op takes the paged metadata (block tables of the pool's
// pages, query_starts); the LM head's input is gathered at logits_indices as for any paged model.
// RUN: ad-opt %s -p 'insert-cached-attention{max-seq-len=64 paged=true page-size=16 num-pages=8}' | filecheck %s

// CHECK-LABEL: func.func @mla
// CHECK-SAME:  %query_starts: tensor<?xi64> {ad.input = "query_starts", ad.query_starts = ""}
// CHECK-SAME:  %cache_starts: tensor<?xi64> {ad.input = "cache_starts", ad.cache_starts = ""}
// CHECK-SAME:  %block_tables: tensor<?x?xi64> {ad.input = "block_tables", ad.block_tables = ""}
// CHECK-SAME:  %logits_indices: tensor<?xi64> {ad.input = "logits_indices", ad.logits_indices = ""}
// CHECK-SAME:  %[[P:latent_pages[_0-9]*]]: tensor<8x16x20xf32> {ad.input = "latent_pages_0", ad.cache = "model.layers.0.self_attn latent"})
// CHECK-NOT:   k_pages
// CHECK-NOT:   ad.linear %latent
// CHECK-NOT:   ad.expand
// CHECK-NOT:   ad.cat
// CHECK:       %[[O:.*]] = ad.cached_mla_attention %q_nope, %q_rot, %latent, %k_rot kv_b %w cache %[[P]] block_tables %block_tables cache_starts %cache_starts query_starts %query_starts : tensor<?xi64> scale 0.28867513459481287 : (tensor<1x2x?x8xf32>, tensor<1x2x?x4xf32>, tensor<1x1x?x16xf32>, tensor<1x1x?x4xf32>, tensor<28x16xf32>, tensor<8x16x20xf32>, tensor<?x?xi64>, tensor<?xi64>) -> tensor<1x2x?x6xf32>
// CHECK-NEXT:  %t = ad.transpose %[[O]] 1, 2
// CHECK-NEXT:  %h = ad.reshape %t
// CHECK-NEXT:  %[[ROWS:.*]] = ad.torch_op "aten.index_select.default"(%h, %logits_indices)
// CHECK-NEXT:  %[[L:.*]] = ad.linear %[[ROWS]], %lm_head
// CHECK-NEXT:  func.return %[[L]]
func.func @mla(%q_nope: tensor<1x2x?x8xf32> {ad.input = "q_nope"}, %q_rot: tensor<1x2x?x4xf32> {ad.input = "q_rot"}, %latent: tensor<1x1x?x16xf32> {ad.input = "latent"}, %k_rot: tensor<1x1x?x4xf32> {ad.input = "k_rot"}, %w: tensor<28x16xf32> {ad.param = "model.layers.0.self_attn.kv_b_proj.weight"}, %lm_head: tensor<32x12xf32> {ad.param = "lm_head.weight"}) -> tensor<1x?x32xf32> {
  %s = ad.sym_size %latent dim 2 : tensor<1x1x?x16xf32>
  %query = ad.cat %q_nope, %q_rot dim -1 : (tensor<1x2x?x8xf32>, tensor<1x2x?x4xf32>) -> tensor<1x2x?x12xf32>
  %kv = ad.linear %latent, %w : (tensor<1x1x?x16xf32>, tensor<28x16xf32>) -> tensor<1x1x?x28xf32>
  %view = ad.reshape %kv [1, %s, -1, 14] : tensor<1x1x?x28xf32> -> tensor<1x?x2x14xf32>
  %heads = ad.transpose %view 1, 2 : tensor<1x?x2x14xf32> -> tensor<1x2x?x14xf32>
  %k_nope, %value = ad.split %heads [8, 6] dim -1 : tensor<1x2x?x14xf32> -> tensor<1x2x?x8xf32>, tensor<1x2x?x6xf32>
  %k_rot_heads = ad.expand %k_rot [-1, 2, -1, -1] : tensor<1x1x?x4xf32> -> tensor<1x2x?x4xf32>
  %key = ad.cat %k_nope, %k_rot_heads dim -1 : (tensor<1x2x?x8xf32>, tensor<1x2x?x4xf32>) -> tensor<1x2x?x12xf32>
  %o = ad.attention %query, %key, %value causal scale 0.28867513459481287 : f64 : (tensor<1x2x?x12xf32>, tensor<1x2x?x12xf32>, tensor<1x2x?x6xf32>) -> tensor<1x2x?x6xf32> loc("model.layers.0.self_attn")
  %t = ad.transpose %o 1, 2 : tensor<1x2x?x6xf32> -> tensor<1x?x2x6xf32>
  %h = ad.reshape %t [1, -1, 12] : tensor<1x?x2x6xf32> -> tensor<1x?x12xf32>
  %logits = ad.linear %h, %lm_head : (tensor<1x?x12xf32>, tensor<32x12xf32>) -> tensor<1x?x32xf32>
  func.return %logits : tensor<1x?x32xf32>
}
