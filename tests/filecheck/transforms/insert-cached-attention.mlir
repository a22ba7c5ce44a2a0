// insert-cached-attention on hand-written attentions: a causal mask computed from the position
// ids is dropped, a sliding-window one becomes `window`, SDPA's is_causal needs no mask; RoPE's
// cos/sin come from the position ids.
// RUN: ad-opt %s --split-input-file -p 'insert-cached-attention{max-batch=2 max-seq-len=16}' | filecheck %s

// CHECK-LABEL: func.func @causal
// CHECK-SAME:  %k_cache{{.*}}: tensor<2x16x1x8xf32> {ad.input = "k_cache_0", ad.kv_cache = "model.layers.0.self_attn key"}
// CHECK-NOT:   ad.le
// CHECK:       ad.cached_attention %q, %k, %v rope %cos, %sin cache %k_cache{{.*}}, %v_cache{{.*}} slots %cache_slots starts %cache_starts scale 0.35355339059327379 :
// CHECK-NEXT:  func.return
func.func @causal(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x1x?x8xf32> {ad.input = "k"}, %v: tensor<1x1x?x8xf32> {ad.input = "v"}, %freq: tensor<8xf32> {ad.buffer = "model.rotary_emb.inv_freq"}, %position_ids: tensor<1x?xi64> {ad.input = "position_ids"}) -> tensor<1x2x?x8xf32> {
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
  func.return %o : tensor<1x2x?x8xf32>
}

// -----

// CHECK-LABEL: func.func @window
// CHECK:       ad.cached_attention {{.*}} scale 0.35355339059327379 window 4 :
func.func @window(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x1x?x8xf32> {ad.input = "k"}, %v: tensor<1x1x?x8xf32> {ad.input = "v"}, %freq: tensor<8xf32> {ad.buffer = "model.rotary_emb.inv_freq"}, %position_ids: tensor<1x?xi64> {ad.input = "position_ids"}) -> tensor<1x2x?x8xf32> {
  %pu = ad.unsqueeze %position_ids dim 2 : tensor<1x?xi64> -> tensor<1x?x1xi64>
  %pf = ad.cast %pu : tensor<1x?x1xi64> -> tensor<1x?x1xf32>
  %angle = ad.mul %pf, %freq : tensor<1x?x1xf32>, tensor<8xf32> -> tensor<1x?x8xf32>
  %cos = ad.cos %angle : tensor<1x?x8xf32> -> tensor<1x?x8xf32>
  %sin = ad.sin %angle : tensor<1x?x8xf32> -> tensor<1x?x8xf32>
  %a = ad.unsqueeze %position_ids dim 2 : tensor<1x?xi64> -> tensor<1x?x1xi64>
  %b = ad.unsqueeze %position_ids dim 1 : tensor<1x?xi64> -> tensor<1x1x?xi64>
  %causal = ad.le %b, %a : tensor<1x1x?xi64>, tensor<1x?x1xi64> -> tensor<1x?x?xi1>
  %four = ad.constant 4 : i64
  %lo = ad.sub %a, %four : tensor<1x?x1xi64>, i64 -> tensor<1x?x1xi64>
  %near = ad.gt %b, %lo : tensor<1x1x?xi64>, tensor<1x?x1xi64> -> tensor<1x?x?xi1>
  %m = ad.logical_and %causal, %near : tensor<1x?x?xi1>, tensor<1x?x?xi1> -> tensor<1x?x?xi1>
  %mask = ad.unsqueeze %m dim 1 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %o = ad.rope_attention %q, %k, %v rope %cos, %sin mask %mask scale 0.35355339059327379 : (tensor<1x2x?x8xf32>, tensor<1x1x?x8xf32>, tensor<1x1x?x8xf32>, tensor<1x?x8xf32>, tensor<1x?x8xf32>, tensor<1x1x?x?xi1>) -> tensor<1x2x?x8xf32> loc("model.layers.0.self_attn")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----

// SDPA with is_causal and no RoPE (learned positions): cached without cos/sin.
// CHECK-LABEL: func.func @plain
// CHECK:       ad.cached_attention %q, %k, %v cache %k_cache{{.*}}, %v_cache{{.*}} slots %cache_slots starts %cache_starts scale 0.35355339059327379 : (tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<1x2x?x8xf32>
func.func @plain(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x2x?x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}) -> tensor<1x2x?x8xf32> {
  %o = ad.attention %q, %k, %v causal : (tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x8xf32> loc("transformer.h.0.attn")
  func.return %o : tensor<1x2x?x8xf32>
}
