// insert-cached-attention on DeepSeek-V3's MLA as HF 5.24 writes it (`DeepseekV3Attention`: the
// normalized latent up-projected by kv_b_proj into each head's k_nope and value, the key built by
// new_empty and two copy_, the rotated key part expanded to every head): the latent ++ rotated
// key part is cached ([slots, max-seq, rank + rope]: 16 + 4), not the heads' K and V, and the
// expansion is gone (the cached op absorbs kv_b_proj); each slot is one page of the op's pool
// (the block tables `cache_slots` unsqueezed), the batch rows its sequences (no query_starts).
// RUN: ad-opt %s --split-input-file -p 'insert-cached-attention{max-batch=2 max-seq-len=16}' | filecheck %s

// CHECK-LABEL: func.func @mla
// CHECK-SAME:  %latent_cache{{.*}}: tensor<2x16x20xf32> {ad.input = "latent_cache_0", ad.cache = "model.layers.0.self_attn latent"}
// CHECK-NEXT:  %block_tables = ad.unsqueeze %cache_slots dim 1 : tensor<?xi64> -> tensor<?x1xi64>
// CHECK-NOT:   k_cache
// CHECK-NOT:   ad.linear
// CHECK-NOT:   aten.new_empty
// CHECK-NOT:   aten.copy_
// CHECK:       %[[O:.*]] = ad.cached_mla_attention %q_nope, %q_rot, %latent, %k_rot kv_b %w cache %latent_cache{{.*}} block_tables %block_tables cache_starts %cache_starts scale 0.28867513459481287 : (tensor<1x2x?x8xf32>, tensor<1x2x?x4xf32>, tensor<1x1x?x16xf32>, tensor<1x1x?x4xf32>, tensor<28x16xf32>, tensor<2x16x20xf32>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<1x2x?x6xf32>
// CHECK-NEXT:  func.return %[[O]]
func.func @mla(%q_nope: tensor<1x2x?x8xf32> {ad.input = "q_nope"}, %q_rot: tensor<1x2x?x4xf32> {ad.input = "q_rot"}, %latent: tensor<1x1x?x16xf32> {ad.input = "latent"}, %k_rot: tensor<1x1x?x4xf32> {ad.input = "k_rot"}, %w: tensor<28x16xf32> {ad.param = "model.layers.0.self_attn.kv_b_proj.weight"}) -> tensor<1x2x?x6xf32> {
  %s = ad.sym_size %latent dim 2 : tensor<1x1x?x16xf32>
  %query = ad.cat %q_nope, %q_rot dim -1 : (tensor<1x2x?x8xf32>, tensor<1x2x?x4xf32>) -> tensor<1x2x?x12xf32>
  %kv = ad.linear %latent, %w : (tensor<1x1x?x16xf32>, tensor<28x16xf32>) -> tensor<1x1x?x28xf32>
  %view = ad.reshape %kv [1, %s, -1, 14] : tensor<1x1x?x28xf32> -> tensor<1x?x2x14xf32>
  %heads = ad.transpose %view 1, 2 : tensor<1x?x2x14xf32> -> tensor<1x2x?x14xf32>
  %k_nope, %value = ad.split %heads [8, 6] dim -1 : tensor<1x2x?x14xf32> -> tensor<1x2x?x8xf32>, tensor<1x2x?x6xf32>
  %k_rot_heads = ad.expand %k_rot [-1, 2, -1, -1] : tensor<1x1x?x4xf32> -> tensor<1x2x?x4xf32>
  %key = ad.torch_op "aten.new_empty.default"(%heads, %s) [#ad.ref<0>, [1 : i64, 2 : i64, #ad.ref<1>, 12 : i64]] {pin_memory = false} : (tensor<1x2x?x14xf32>, index) -> tensor<1x2x?x12xf32>
  %nope_part = ad.slice %key dim 3 [0, 8, 1] : tensor<1x2x?x12xf32> -> tensor<1x2x?x8xf32>
  %c0 = ad.torch_op "aten.copy_.default"(%nope_part, %k_nope) [#ad.ref<0>, #ad.ref<1>] {} : (tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x8xf32>
  %rot_part = ad.slice %key dim 3 [8, 9223372036854775807, 1] : tensor<1x2x?x12xf32> -> tensor<1x2x?x4xf32>
  %c1 = ad.torch_op "aten.copy_.default"(%rot_part, %k_rot_heads) [#ad.ref<0>, #ad.ref<1>] {} : (tensor<1x2x?x4xf32>, tensor<1x2x?x4xf32>) -> tensor<1x2x?x4xf32>
  %o = ad.attention %query, %key, %value causal scale 0.28867513459481287 : f64 : (tensor<1x2x?x12xf32>, tensor<1x2x?x12xf32>, tensor<1x2x?x6xf32>) -> tensor<1x2x?x6xf32> loc("model.layers.0.self_attn")
  func.return %o : tensor<1x2x?x6xf32>
}

// -----

// The key joined by cat (k_nope beside the expanded rotated part), the value head dim (6) not the
// query's (12): the same latent cache.
// CHECK-LABEL: func.func @mla_cat_key
// CHECK-SAME:  %latent_cache{{.*}}: tensor<2x16x20xf32> {ad.input = "latent_cache_0", ad.cache = "model.layers.0.self_attn latent"}
// CHECK-NOT:   ad.cat
// CHECK-NOT:   ad.expand
// CHECK:       %[[O:.*]] = ad.cached_mla_attention %q_nope, %q_rot, %latent, %k_rot kv_b %w cache %latent_cache{{.*}} block_tables %block_tables cache_starts %cache_starts scale 0.28867513459481287 :
// CHECK-NEXT:  func.return %[[O]]
func.func @mla_cat_key(%q_nope: tensor<1x2x?x8xf32> {ad.input = "q_nope"}, %q_rot: tensor<1x2x?x4xf32> {ad.input = "q_rot"}, %latent: tensor<1x1x?x16xf32> {ad.input = "latent"}, %k_rot: tensor<1x1x?x4xf32> {ad.input = "k_rot"}, %w: tensor<28x16xf32> {ad.param = "model.layers.0.self_attn.kv_b_proj.weight"}) -> tensor<1x2x?x6xf32> {
  %s = ad.sym_size %latent dim 2 : tensor<1x1x?x16xf32>
  %query = ad.cat %q_nope, %q_rot dim -1 : (tensor<1x2x?x8xf32>, tensor<1x2x?x4xf32>) -> tensor<1x2x?x12xf32>
  %kv = ad.linear %latent, %w : (tensor<1x1x?x16xf32>, tensor<28x16xf32>) -> tensor<1x1x?x28xf32>
  %view = ad.reshape %kv [1, %s, -1, 14] : tensor<1x1x?x28xf32> -> tensor<1x?x2x14xf32>
  %heads = ad.transpose %view 1, 2 : tensor<1x?x2x14xf32> -> tensor<1x2x?x14xf32>
  %k_nope, %value = ad.split %heads [8, 6] dim -1 : tensor<1x2x?x14xf32> -> tensor<1x2x?x8xf32>, tensor<1x2x?x6xf32>
  %k_rot_heads = ad.expand %k_rot [-1, 2, -1, -1] : tensor<1x1x?x4xf32> -> tensor<1x2x?x4xf32>
  %key = ad.cat %k_nope, %k_rot_heads dim -1 : (tensor<1x2x?x8xf32>, tensor<1x2x?x4xf32>) -> tensor<1x2x?x12xf32>
  %o = ad.attention %query, %key, %value causal scale 0.28867513459481287 : f64 : (tensor<1x2x?x12xf32>, tensor<1x2x?x12xf32>, tensor<1x2x?x6xf32>) -> tensor<1x2x?x6xf32> loc("model.layers.0.self_attn")
  func.return %o : tensor<1x2x?x6xf32>
}

// -----

// A value that is not split from an up-projected single-head latent is no MLA: plain cached
// attention over its K and V.
// CHECK-LABEL: func.func @not_mla
// CHECK-NOT:   ad.cached_mla_attention
// CHECK:       ad.cached_attention %q, %k, %v cache
func.func @not_mla(%q: tensor<1x2x?x12xf32> {ad.input = "q"}, %k: tensor<1x2x?x12xf32> {ad.input = "k"}, %v: tensor<1x2x?x6xf32> {ad.input = "v"}) -> tensor<1x2x?x6xf32> {
  %o = ad.attention %q, %k, %v causal scale 0.28867513459481287 : f64 : (tensor<1x2x?x12xf32>, tensor<1x2x?x12xf32>, tensor<1x2x?x6xf32>) -> tensor<1x2x?x6xf32> loc("model.layers.0.self_attn")
  func.return %o : tensor<1x2x?x6xf32>
}
