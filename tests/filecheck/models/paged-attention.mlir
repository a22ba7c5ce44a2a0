// insert-cached-attention{paged=true} on a two-layer tiny Llama exported flattened (--flat:
// input_ids and position_ids [1, tokens], tokens dynamic; 2 query heads, 1 key/value head of 32).
// Each attention becomes ad.cached_attention over its own layer's key and value pools
// [num-pages, page-size, kv_heads, head_dim]; the metadata arguments are shared; HF's mask
// construction is gone; the final norm's output is gathered at logits_indices before the LM head.
// RUN: ad-opt --model llama --layers 2 --for-generation --flat -p 'canonicalize,match-rmsnorm,fuse-add-rmsnorm,fuse-rope-attention,insert-cached-attention{max-seq-len=128 paged=true page-size=16 num-pages=64}' | filecheck %s

// CHECK:      %input_ids: tensor<1x?xi64> {ad.input = "input_ids"}, %position_ids: tensor<1x?xi64> {ad.input = "position_ids"}
// CHECK-SAME: %query_starts: tensor<?xi64> {ad.input = "query_starts", ad.query_starts = ""}, %cache_starts: tensor<?xi64> {ad.input = "cache_starts", ad.cache_starts = ""}, %block_tables: tensor<?x?xi64> {ad.input = "block_tables", ad.block_tables = ""}, %logits_indices: tensor<?xi64> {ad.input = "logits_indices", ad.logits_indices = ""}
// CHECK-SAME: %[[K0:k_pages[_0-9]*]]: tensor<64x16x1x32xf32> {ad.input = "k_pages_0", ad.cache = "model.layers.0.self_attn key"}
// CHECK-SAME: %[[V0:v_pages[_0-9]*]]: tensor<64x16x1x32xf32> {ad.input = "v_pages_0", ad.cache = "model.layers.0.self_attn value"}
// CHECK-SAME: %[[K1:k_pages[_0-9]*]]: tensor<64x16x1x32xf32> {ad.input = "k_pages_1", ad.cache = "model.layers.1.self_attn key"}
// CHECK-SAME: %[[V1:v_pages[_0-9]*]]: tensor<64x16x1x32xf32> {ad.input = "v_pages_1", ad.cache = "model.layers.1.self_attn value"}
// CHECK-SAME: -> tensor<1x?x128xf32>
// CHECK-NOT:  aten.cumsum
// CHECK-NOT:  rope_attention
// CHECK:      ad.cached_attention %{{.*}}, %{{.*}}, %{{.*}} rope %cos, %sin cache %[[K0]], %[[V0]] block_tables %block_tables cache_starts %cache_starts query_starts %query_starts : tensor<?xi64> scale 0.17677669529663689 : (tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32>, tensor<1x1x?x32xf32>, tensor<64x16x1x32xf32>, tensor<64x16x1x32xf32>, tensor<?x?xi64>, tensor<?xi64>, tensor<1x?x32xf32>, tensor<1x?x32xf32>) -> tensor<1x2x?x32xf32>
// CHECK:      ad.cached_attention %{{.*}}, %{{.*}}, %{{.*}} rope %cos, %sin cache %[[K1]], %[[V1]] block_tables %block_tables cache_starts %cache_starts query_starts %query_starts
// CHECK:      %[[H:.*]], %{{.*}} = ad.add_rms_norm {{.*}} weight %p_model_norm_weight
// CHECK-NEXT: %logits_rows = ad.torch_op "aten.index_select.default"(%[[H]], %logits_indices) [#ad.ref<0>, 1 : i64, #ad.ref<1>] {} : (tensor<1x?x64xf32>, tensor<?xi64>) -> tensor<1x?x64xf32>
// CHECK-NEXT: %[[L:.*]] = ad.linear %logits_rows, %p_lm_head_weight
// CHECK-NEXT: func.return %[[L]] : tensor<1x?x128xf32>
