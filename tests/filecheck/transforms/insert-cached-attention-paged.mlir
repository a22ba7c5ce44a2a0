// insert-cached-attention{paged=true}: the attention becomes ad.cached_attention over pools
// [num-pages, page-size, kv_heads, head_dim]; the metadata arguments come in the order
// query_starts, cache_starts, block_tables, logits_indices (then the pools); HF's mask is gone;
// the LM head's input is gathered at logits_indices along the token axis, so the LM head and
// the elementwise ops after it (a soft cap here) run on those tokens only.
// RUN: ad-opt %s --split-input-file -p 'insert-cached-attention{max-seq-len=64 paged=true page-size=16 num-pages=8}' | filecheck %s

// CHECK-LABEL: func.func @llm
// CHECK-SAME:  %position_ids: tensor<1x?xi64> {ad.input = "position_ids"}
// CHECK-SAME:  %query_starts: tensor<?xi64> {ad.input = "query_starts", ad.query_starts = ""}
// CHECK-SAME:  %cache_starts: tensor<?xi64> {ad.input = "cache_starts", ad.cache_starts = ""}
// CHECK-SAME:  %block_tables: tensor<?x?xi64> {ad.input = "block_tables", ad.block_tables = ""}
// CHECK-SAME:  %logits_indices: tensor<?xi64> {ad.input = "logits_indices", ad.logits_indices = ""}
// CHECK-SAME:  %[[K:k_pages[_0-9]*]]: tensor<8x16x1x8xf32> {ad.input = "k_pages_0", ad.cache = "model.layers.0.self_attn key"}
// CHECK-SAME:  %[[V:v_pages[_0-9]*]]: tensor<8x16x1x8xf32> {ad.input = "v_pages_0", ad.cache = "model.layers.0.self_attn value"}
// CHECK-NOT:   ad.le
// CHECK-NOT:   ad.rope_attention
// CHECK:       %[[O:.*]] = ad.cached_attention %q, %k, %v rope %cos, %sin cache %[[K]], %[[V]] block_tables %block_tables cache_starts %cache_starts query_starts %query_starts : tensor<?xi64> scale 0.35355339059327379 : (tensor<1x2x?x8xf32>, tensor<1x1x?x8xf32>, tensor<1x1x?x8xf32>, tensor<8x16x1x8xf32>, tensor<8x16x1x8xf32>, tensor<?x?xi64>, tensor<?xi64>, tensor<1x?x8xf32>, tensor<1x?x8xf32>) -> tensor<1x2x?x8xf32>
// CHECK-NEXT:  %t = ad.transpose %[[O]] 1, 2
// CHECK-NEXT:  %h = ad.reshape %t
// CHECK-NEXT:  %[[ROWS:.*]] = ad.torch_op "aten.index_select.default"(%h, %logits_indices) [#ad.ref<0>, 1 : i64, #ad.ref<1>] {} : (tensor<1x?x16xf32>, tensor<?xi64>) -> tensor<1x?x16xf32>
// CHECK-NEXT:  %[[L:.*]] = ad.linear %[[ROWS]], %lm_head
// CHECK-NEXT:  %cap = ad.constant
// CHECK-NEXT:  %[[D:.*]] = ad.div %[[L]], %cap
// CHECK-NEXT:  %[[T:.*]] = ad.tanh %[[D]]
// CHECK-NEXT:  %[[C:.*]] = ad.mul %[[T]], %cap
// CHECK-NEXT:  func.return %[[C]]
func.func @llm(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x1x?x8xf32> {ad.input = "k"}, %v: tensor<1x1x?x8xf32> {ad.input = "v"}, %freq: tensor<8xf32> {ad.buffer = "model.rotary_emb.inv_freq"}, %position_ids: tensor<1x?xi64> {ad.input = "position_ids"}, %lm_head: tensor<32x16xf32> {ad.param = "lm_head.weight"}) -> tensor<1x?x32xf32> {
  %pu = ad.unsqueeze %position_ids dim 2 : tensor<1x?xi64> -> tensor<1x?x1xi64>
  %pf = ad.cast %pu : tensor<1x?x1xi64> -> tensor<1x?x1xf32>
  %angle = ad.mul %pf, %freq : tensor<1x?x1xf32>, tensor<8xf32> -> tensor<1x?x8xf32>
  %cos = ad.cos %angle : tensor<1x?x8xf32> -> tensor<1x?x8xf32>
  %sin = ad.sin %angle : tensor<1x?x8xf32> -> tensor<1x?x8xf32>
  %a = ad.unsqueeze %position_ids dim 2 : tensor<1x?xi64> -> tensor<1x?x1xi64>
  %b = ad.unsqueeze %position_ids dim 1 : tensor<1x?xi64> -> tensor<1x1x?xi64>
  %m = ad.le %b, %a : tensor<1x1x?xi64>, tensor<1x?x1xi64> -> tensor<1x?x?xi1>
  %mask = ad.unsqueeze %m dim 1 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %o = ad.rope_attention %q, %k, %v rope %cos, %sin mask %mask scale 0.35355339059327379 : (tensor<1x2x?x8xf32>, tensor<1x1x?x8xf32>, tensor<1x1x?x8xf32>, tensor<1x?x8xf32>, tensor<1x?x8xf32>, tensor<1x1x?x?xi1>) -> tensor<1x2x?x8xf32> loc("model.layers.0.self_attn")
  %t = ad.transpose %o 1, 2 : tensor<1x2x?x8xf32> -> tensor<1x?x2x8xf32>
  %h = ad.reshape %t [1, -1, 16] : tensor<1x?x2x8xf32> -> tensor<1x?x16xf32>
  %logits = ad.linear %h, %lm_head : (tensor<1x?x16xf32>, tensor<32x16xf32>) -> tensor<1x?x32xf32>
  %cap = ad.constant 3.000000e+01 : f64
  %d = ad.div %logits, %cap : tensor<1x?x32xf32>, f64 -> tensor<1x?x32xf32>
  %th = ad.tanh %d : tensor<1x?x32xf32> -> tensor<1x?x32xf32>
  %capped = ad.mul %th, %cap : tensor<1x?x32xf32>, f64 -> tensor<1x?x32xf32>
  func.return %capped : tensor<1x?x32xf32>
}

// -----

// A decoder that counts its positions itself (Pegasus' sinusoidal table indexed by arange(seq),
// no position_ids input): the paged form's tokens are one flattened sequence, so the range
// becomes the position_ids input [1, tokens] (an argument added after the pools), viewed as
// [tokens]; the lookup keeps its type.
// CHECK-LABEL: func.func @positions_counted
// CHECK-SAME:  %v_pages{{[_0-9]*}}: tensor<8x16x2x8xf32> {ad.input = "v_pages_0", ad.cache = "model.layers.0.self_attn value"}, %position_ids: tensor<1x?xi64> {ad.input = "position_ids"})
// CHECK-NEXT:  %positions = ad.reshape %position_ids [-1] : tensor<1x?xi64> -> tensor<?xi64>
// CHECK-NOT:   ad.arange
// CHECK:       %e = ad.embedding %table, %positions : (tensor<64x8xf32>, tensor<?xi64>) -> tensor<?x8xf32>
// CHECK-NEXT:  %x = ad.add %tokens, %e : tensor<1x?x8xf32>, tensor<?x8xf32> -> tensor<1x?x8xf32>
func.func @positions_counted(%ids: tensor<1x?xi64> {ad.input = "input_ids"}, %wte: tensor<32x8xf32> {ad.param = "model.embed_tokens.weight"}, %table: tensor<64x8xf32> {ad.param = "model.embed_positions.weight"}, %q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x2x?x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}) -> (tensor<1x?x32xf32>, tensor<1x2x?x8xf32>) {
  %tokens = ad.embedding %wte, %ids : (tensor<32x8xf32>, tensor<1x?xi64>) -> tensor<1x?x8xf32>
  %c0 = ad.constant 0 : i64
  %c1 = ad.constant 1 : i64
  %n = ad.sym_size %ids dim 1 : tensor<1x?xi64>
  %pos = ad.arange %c0, %n, %c1 : i64, index, i64 -> tensor<?xi64> loc("model.embed_positions")
  %e = ad.embedding %table, %pos : (tensor<64x8xf32>, tensor<?xi64>) -> tensor<?x8xf32>
  %x = ad.add %tokens, %e : tensor<1x?x8xf32>, tensor<?x8xf32> -> tensor<1x?x8xf32>
  %o = ad.attention %q, %k, %v causal : (tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x8xf32> loc("model.layers.0.self_attn")
  %logits = ad.linear %x, %wte : (tensor<1x?x8xf32>, tensor<32x8xf32>) -> tensor<1x?x32xf32>
  func.return %logits, %o : tensor<1x?x32xf32>, tensor<1x2x?x8xf32>
}

// -----

// States per sequence beside the pages: a short convolution and a gated delta rule get their
// state pools [max-batch (8), ...] as in the slot form, and one more metadata argument,
// state_slots (after logits_indices, before the pools); each op takes query_starts and runs
// sequence by sequence over the flattened tokens from its state slot, starting at its cache
// start (a zero state at 0). The attention is paged as above.
// CHECK-LABEL: func.func @hybrid
// CHECK-SAME:  %logits_indices: tensor<?xi64> {ad.input = "logits_indices", ad.logits_indices = ""}
// CHECK-SAME:  %state_slots: tensor<?xi64> {ad.input = "state_slots", ad.state_slots = ""}
// CHECK-SAME:  %conv_state{{[_0-9]*}}: tensor<8x8x2xf32> {ad.input = "conv_state_0", ad.cache = "model.layers.0.conv conv_state"}
// CHECK-SAME:  %recurrent_state{{[_0-9]*}}: tensor<8x4x16x8xf32> {ad.input = "recurrent_state_0", ad.cache = "model.layers.1.linear_attn recurrent_state"}
// CHECK-SAME:  %k_pages{{[_0-9]*}}: tensor<8x16x1x8xf32> {ad.input = "k_pages_0", ad.cache = "model.layers.2.self_attn key"}
// CHECK-NOT:   aten.conv1d
// CHECK:       ad.cached_causal_conv1d %x, %w bias %b state %conv_state{{[_0-9]*}} slots %state_slots starts %cache_starts query_starts %query_starts : tensor<?xi64> : (tensor<1x8x?xf32>, tensor<8x1x3xf32>, tensor<8x8x2xf32>, tensor<?xi64>, tensor<?xi64>, tensor<8xf32>) -> tensor<1x8x?xf32>
// CHECK:       ad.cached_gated_delta_rule %gq, %gk, %gv, %g, %beta use_qk_l2norm state %recurrent_state{{[_0-9]*}} slots %state_slots starts %cache_starts query_starts %query_starts : tensor<?xi64> : (tensor<1x?x2x16xbf16>, tensor<1x?x2x16xbf16>, tensor<1x?x4x8xbf16>, tensor<1x?x4xf32>, tensor<1x?x4xbf16>, tensor<8x4x16x8xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<1x?x4x8xbf16>
// CHECK:       ad.cached_attention %q, %k, %v cache
func.func @hybrid(%ids: tensor<1x?xi64> {ad.input = "input_ids"}, %x: tensor<1x8x?xf32> {ad.input = "x"}, %w: tensor<8x1x3xf32> {ad.param = "model.layers.0.conv.conv.weight"}, %b: tensor<8xf32> {ad.param = "model.layers.0.conv.conv.bias"}, %gq: tensor<1x?x2x16xbf16> {ad.input = "gq"}, %gk: tensor<1x?x2x16xbf16> {ad.input = "gk"}, %gv: tensor<1x?x4x8xbf16> {ad.input = "gv"}, %g: tensor<1x?x4xf32> {ad.input = "g"}, %beta: tensor<1x?x4xbf16> {ad.input = "beta"}, %q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x1x?x8xf32> {ad.input = "k"}, %v: tensor<1x1x?x8xf32> {ad.input = "v"}, %lm_head: tensor<32x16xf32> {ad.param = "lm_head.weight"}) -> (tensor<1x?x32xf32>, tensor<1x8x?xf32>, tensor<1x?x4x8xbf16>) {
  %seq = ad.sym_size %ids dim 1 : tensor<1x?xi64>
  %c = ad.torch_op "aten.conv1d.default"(%x, %w, %b) [#ad.ref<0>, #ad.ref<1>, #ad.ref<2>, [1 : i64], [2 : i64], [1 : i64], 8 : i64] {} : (tensor<1x8x?xf32>, tensor<8x1x3xf32>, tensor<8xf32>) -> tensor<1x8x?xf32> loc("model.layers.0.conv")
  %s = ad.slice %c dim 2 [0, %seq, 1] : tensor<1x8x?xf32> -> tensor<1x8x?xf32>
  %d = ad.torch_op "ad_mlir.chunk_gated_delta_rule.default"(%gq, %gk, %gv, %g, %beta) ["transformers.models.qwen3_next.modeling_qwen3_next", #ad.ref<0>, #ad.ref<1>, #ad.ref<2>, #ad.ref<3>, #ad.ref<4>, 64 : i64, true] {} : (tensor<1x?x2x16xbf16>, tensor<1x?x2x16xbf16>, tensor<1x?x4x8xbf16>, tensor<1x?x4xf32>, tensor<1x?x4xbf16>) -> tensor<1x?x4x8xbf16> loc("model.layers.1.linear_attn")
  %o = ad.attention %q, %k, %v causal : (tensor<1x2x?x8xf32>, tensor<1x1x?x8xf32>, tensor<1x1x?x8xf32>) -> tensor<1x2x?x8xf32> loc("model.layers.2.self_attn")
  %t = ad.transpose %o 1, 2 : tensor<1x2x?x8xf32> -> tensor<1x?x2x8xf32>
  %h = ad.reshape %t [1, -1, 16] : tensor<1x?x2x8xf32> -> tensor<1x?x16xf32>
  %logits = ad.linear %h, %lm_head : (tensor<1x?x16xf32>, tensor<32x16xf32>) -> tensor<1x?x32xf32>
  func.return %logits, %s, %d : tensor<1x?x32xf32>, tensor<1x8x?xf32>, tensor<1x?x4x8xbf16>
}

// -----

// States alone (RWKV's shape: a shift by one token, with start rows computed from no token,
// beside a short convolution; no attention): the same metadata and state slots, no page pool.
// The shift is a token window over a state slot per sequence with query_starts: its result is the
// input's type (each flattened token's row one back in its own sequence), cut to the step's tokens.
// CHECK-LABEL: func.func @states_alone
// CHECK-SAME:  %block_tables: tensor<?x?xi64> {ad.input = "block_tables", ad.block_tables = ""}
// CHECK-SAME:  %state_slots: tensor<?xi64> {ad.input = "state_slots", ad.state_slots = ""}
// CHECK-SAME:  %conv_state{{[_0-9]*}}: tensor<8x16x2xf32> {ad.input = "conv_state_0", ad.cache = "model.layers.0.conv conv_state"}
// CHECK-SAME:  %token_window{{[_0-9]*}}: tensor<8x1x16xf32> {ad.input = "token_window_0", ad.cache = "model.layers.0.attention token_window"}
// CHECK-NOT:   _pages
// CHECK:       %window = ad.cached_token_window %h initial %start state %token_window{{[_0-9]*}} slots %state_slots starts %cache_starts query_starts %query_starts : tensor<?xi64> dim 1 : (tensor<1x?x16xf32>, tensor<8x1x16xf32>, tensor<?xi64>, tensor<?xi64>, tensor<1x1x16xf32>) -> tensor<1x?x16xf32>
// CHECK:       ad.cached_causal_conv1d %x, %w bias %b state %conv_state{{[_0-9]*}} slots %state_slots starts %cache_starts query_starts %query_starts
func.func @states_alone(%ids: tensor<1x?xi64> {ad.input = "input_ids"}, %h: tensor<1x?x16xf32> {ad.input = "h"}, %start: tensor<1x1x16xf32> {ad.param = "model.layers.0.start"}, %x: tensor<1x16x?xf32> {ad.input = "x"}, %w: tensor<16x1x3xf32> {ad.param = "model.layers.0.conv.conv.weight"}, %b: tensor<16xf32> {ad.param = "model.layers.0.conv.conv.bias"}, %lm_head: tensor<32x16xf32> {ad.param = "lm_head.weight"}) -> (tensor<1x?x32xf32>, tensor<1x16x?xf32>) {
  %seq = ad.sym_size %ids dim 1 : tensor<1x?xi64>
  %cat = ad.cat %start, %h dim 1 : (tensor<1x1x16xf32>, tensor<1x?x16xf32>) -> tensor<1x?x16xf32> loc("model.layers.0.attention")
  %shift = ad.slice %cat dim 1 [0, -1, 1] : tensor<1x?x16xf32> -> tensor<1x?x16xf32> loc("model.layers.0.attention")
  %mixed = ad.add %h, %shift : tensor<1x?x16xf32>, tensor<1x?x16xf32> -> tensor<1x?x16xf32>
  %logits = ad.linear %mixed, %lm_head : (tensor<1x?x16xf32>, tensor<32x16xf32>) -> tensor<1x?x32xf32>
  %c = ad.torch_op "aten.conv1d.default"(%x, %w, %b) [#ad.ref<0>, #ad.ref<1>, #ad.ref<2>, [1 : i64], [2 : i64], [1 : i64], 16 : i64] {} : (tensor<1x16x?xf32>, tensor<16x1x3xf32>, tensor<16xf32>) -> tensor<1x16x?xf32> loc("model.layers.0.conv")
  %s = ad.slice %c dim 2 [0, %seq, 1] : tensor<1x16x?xf32> -> tensor<1x16x?xf32>
  func.return %logits, %s : tensor<1x?x32xf32>, tensor<1x16x?xf32>
}
