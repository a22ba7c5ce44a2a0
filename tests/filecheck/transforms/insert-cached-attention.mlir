// insert-cached-attention on hand-written attentions: a causal mask computed from the position
// ids is dropped, a sliding-window one becomes `window`, SDPA's is_causal needs no mask; RoPE's
// cos/sin come from the position ids.
// RUN: ad-opt %s --split-input-file -p 'insert-cached-attention{max-batch=2 max-seq-len=16}' | filecheck %s

// The slot form is the paged one with a slot as a page of max-seq-len tokens: the block tables
// are the slots, one page per sequence.
// CHECK-LABEL: func.func @causal
// CHECK-SAME:  %k_cache{{.*}}: tensor<2x16x1x8xf32> {ad.input = "k_cache_0", ad.cache = "model.layers.0.self_attn key"}
// CHECK-NEXT:  %block_tables = ad.unsqueeze %cache_slots dim 1 : tensor<?xi64> -> tensor<?x1xi64>
// CHECK-NOT:   ad.le
// CHECK:       ad.cached_attention %q, %k, %v rope %cos, %sin cache %k_cache{{.*}}, %v_cache{{.*}} block_tables %block_tables cache_starts %cache_starts scale 0.35355339059327379 :
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
// CHECK-SAME:  %k_cache{{.*}}: tensor<2x16x1x8xf32> {ad.input = "k_cache_0", ad.cache = "model.layers.0.self_attn key"}
// CHECK-NOT:   ad.le
// CHECK-NOT:   ad.gt
// CHECK-NOT:   ad.logical_and
// CHECK-NOT:   ad.rope_attention
// CHECK:       %[[O:.*]] = ad.cached_attention %q, %k, %v rope %cos, %sin cache %k_cache{{.*}}, %v_cache{{.*}} block_tables %block_tables cache_starts %cache_starts scale 0.35355339059327379 window 4 :
// CHECK-NEXT:  func.return %[[O]]
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

// Partial rotary in interleaved pairs (GLM: 4 of 8 dims): the cached op keeps the tables (their
// width is the rotary dim) and `interleaved`.
// CHECK-LABEL: func.func @partial_pairs
// CHECK:       ad.cached_attention %q, %k, %v rope %cos, %sin interleaved cache %k_cache{{.*}}, %v_cache{{.*}} block_tables %block_tables cache_starts %cache_starts scale 0.35355339059327379 : (tensor<1x2x?x8xf32>, tensor<1x1x?x8xf32>, tensor<1x1x?x8xf32>, tensor<2x16x1x8xf32>, tensor<2x16x1x8xf32>, tensor<?x1xi64>, tensor<?xi64>, tensor<1x?x4xf32>, tensor<1x?x4xf32>) -> tensor<1x2x?x8xf32>
// CHECK-NEXT:  func.return
func.func @partial_pairs(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x1x?x8xf32> {ad.input = "k"}, %v: tensor<1x1x?x8xf32> {ad.input = "v"}, %freq: tensor<4xf32> {ad.buffer = "model.rotary_emb.inv_freq"}, %position_ids: tensor<1x?xi64> {ad.input = "position_ids"}) -> tensor<1x2x?x8xf32> {
  %pu = ad.unsqueeze %position_ids dim 2 : tensor<1x?xi64> -> tensor<1x?x1xi64>
  %pf = ad.cast %pu : tensor<1x?x1xi64> -> tensor<1x?x1xf32>
  %angle = ad.mul %pf, %freq : tensor<1x?x1xf32>, tensor<4xf32> -> tensor<1x?x4xf32>
  %cos = ad.cos %angle : tensor<1x?x4xf32> -> tensor<1x?x4xf32>
  %sin = ad.sin %angle : tensor<1x?x4xf32> -> tensor<1x?x4xf32>
  %o = ad.rope_attention %q, %k, %v rope %cos, %sin interleaved causal scale 0.35355339059327379 : (tensor<1x2x?x8xf32>, tensor<1x1x?x8xf32>, tensor<1x1x?x8xf32>, tensor<1x?x4xf32>, tensor<1x?x4xf32>) -> tensor<1x2x?x8xf32> loc("model.layers.0.self_attn")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----

// A rope_attention whose window and soft cap fuse-rope-attention found (its mask already
// dropped, Gemma2's eager chain matched): the cached op keeps both.
// CHECK-LABEL: func.func @fused_window
// CHECK:       ad.cached_attention %q, %k, %v rope %cos, %sin cache %k_cache{{.*}}, %v_cache{{.*}} block_tables %block_tables cache_starts %cache_starts scale 0.35355339059327379 window 4 softcap 5.000000e+01 :
// CHECK-NEXT:  func.return
func.func @fused_window(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x1x?x8xf32> {ad.input = "k"}, %v: tensor<1x1x?x8xf32> {ad.input = "v"}, %freq: tensor<8xf32> {ad.buffer = "model.rotary_emb.inv_freq"}, %position_ids: tensor<1x?xi64> {ad.input = "position_ids"}) -> tensor<1x2x?x8xf32> {
  %pu = ad.unsqueeze %position_ids dim 2 : tensor<1x?xi64> -> tensor<1x?x1xi64>
  %pf = ad.cast %pu : tensor<1x?x1xi64> -> tensor<1x?x1xf32>
  %angle = ad.mul %pf, %freq : tensor<1x?x1xf32>, tensor<8xf32> -> tensor<1x?x8xf32>
  %cos = ad.cos %angle : tensor<1x?x8xf32> -> tensor<1x?x8xf32>
  %sin = ad.sin %angle : tensor<1x?x8xf32> -> tensor<1x?x8xf32>
  %o = ad.rope_attention %q, %k, %v rope %cos, %sin causal window 4 softcap 5.000000e+01 scale 0.35355339059327379 : (tensor<1x2x?x8xf32>, tensor<1x1x?x8xf32>, tensor<1x1x?x8xf32>, tensor<1x?x8xf32>, tensor<1x?x8xf32>) -> tensor<1x2x?x8xf32> loc("model.layers.0.self_attn")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----

// A rope_attention with Qwen3's QK-norm (fused by fuse-rope-attention): the cached op normalizes
// the new query and key heads before RoPE (and caches the normalized keys).
// CHECK-LABEL: func.func @fused_qk_norm
// CHECK:       ad.cached_attention %q, %k, %v rope %cos, %sin qk_norm(%wq, %wk : tensor<8xf32>, tensor<8xf32>) eps 1.000000e-06 cache %k_cache{{.*}}, %v_cache{{.*}} block_tables %block_tables cache_starts %cache_starts scale 0.35355339059327379 :
// CHECK-NEXT:  func.return
func.func @fused_qk_norm(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x1x?x8xf32> {ad.input = "k"}, %v: tensor<1x1x?x8xf32> {ad.input = "v"}, %wq: tensor<8xf32> {ad.param = "model.layers.0.self_attn.q_norm.weight"}, %wk: tensor<8xf32> {ad.param = "model.layers.0.self_attn.k_norm.weight"}, %freq: tensor<8xf32> {ad.buffer = "model.rotary_emb.inv_freq"}, %position_ids: tensor<1x?xi64> {ad.input = "position_ids"}) -> tensor<1x2x?x8xf32> {
  %pu = ad.unsqueeze %position_ids dim 2 : tensor<1x?xi64> -> tensor<1x?x1xi64>
  %pf = ad.cast %pu : tensor<1x?x1xi64> -> tensor<1x?x1xf32>
  %angle = ad.mul %pf, %freq : tensor<1x?x1xf32>, tensor<8xf32> -> tensor<1x?x8xf32>
  %cos = ad.cos %angle : tensor<1x?x8xf32> -> tensor<1x?x8xf32>
  %sin = ad.sin %angle : tensor<1x?x8xf32> -> tensor<1x?x8xf32>
  %o = ad.rope_attention %q, %k, %v rope %cos, %sin qk_norm(%wq, %wk : tensor<8xf32>, tensor<8xf32>) eps 1.000000e-06 causal scale 0.35355339059327379 : (tensor<1x2x?x8xf32>, tensor<1x1x?x8xf32>, tensor<1x1x?x8xf32>, tensor<1x?x8xf32>, tensor<1x?x8xf32>) -> tensor<1x2x?x8xf32> loc("model.layers.0.self_attn")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----

// SDPA with is_causal and no RoPE (learned positions): cached without cos/sin.
// CHECK-LABEL: func.func @plain
// CHECK-NOT:   ad.attention
// CHECK:       %[[O:.*]] = ad.cached_attention %q, %k, %v cache %k_cache{{.*}}, %v_cache{{.*}} block_tables %block_tables cache_starts %cache_starts scale 0.35355339059327379 : (tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<1x2x?x8xf32>
// CHECK-NEXT:  func.return %[[O]]
func.func @plain(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x2x?x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}) -> tensor<1x2x?x8xf32> {
  %o = ad.attention %q, %k, %v causal : (tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x8xf32> loc("transformer.h.0.attn")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----

// HF's eager soft-capped attention (Gemma2, bf16): RoPE on q and k, repeat_kv of k and v, the
// scores scaled, soft-capped (x / 50, tanh, * 50), plus the additive causal mask (0 / the
// dtype's lowest), softmax in f32 cast back, times v: one ad.cached_attention with `softcap`
// that applies the RoPE itself; the chain and the mask are gone.
// CHECK-LABEL: func.func @softcapped
// CHECK-SAME:  %k_cache{{.*}}: tensor<2x16x1x8xbf16> {ad.input = "k_cache_0", ad.cache = "model.layers.0.self_attn key"}
// CHECK:       %sin = ad.cast %sin32
// CHECK-NOT:   ad.rope
// CHECK-NOT:   ad.matmul
// CHECK-NOT:   ad.tanh
// CHECK-NOT:   ad.where
// CHECK-NOT:   ad.softmax
// CHECK:       ad.cached_attention %q, %k, %v rope %cos, %sin cache %k_cache{{.*}}, %v_cache{{.*}} block_tables %block_tables cache_starts %cache_starts scale 6.250000e-02 softcap 5.000000e+01 : (tensor<1x2x?x8xbf16>, tensor<1x1x?x8xbf16>, tensor<1x1x?x8xbf16>, tensor<2x16x1x8xbf16>, tensor<2x16x1x8xbf16>, tensor<?x1xi64>, tensor<?xi64>, tensor<1x?x8xbf16>, tensor<1x?x8xbf16>) -> tensor<1x2x?x8xbf16>
// CHECK-NEXT:  func.return
func.func @softcapped(%q: tensor<1x2x?x8xbf16> {ad.input = "q"}, %k: tensor<1x1x?x8xbf16> {ad.input = "k"}, %v: tensor<1x1x?x8xbf16> {ad.input = "v"}, %freq: tensor<8xf32> {ad.buffer = "model.rotary_emb.inv_freq"}, %position_ids: tensor<1x?xi64> {ad.input = "position_ids"}) -> tensor<1x2x?x8xbf16> {
  %pu = ad.unsqueeze %position_ids dim 2 : tensor<1x?xi64> -> tensor<1x?x1xi64>
  %pf = ad.cast %pu : tensor<1x?x1xi64> -> tensor<1x?x1xf32>
  %angle = ad.mul %pf, %freq : tensor<1x?x1xf32>, tensor<8xf32> -> tensor<1x?x8xf32>
  %cos32 = ad.cos %angle : tensor<1x?x8xf32> -> tensor<1x?x8xf32>
  %sin32 = ad.sin %angle : tensor<1x?x8xf32> -> tensor<1x?x8xf32>
  %cos = ad.cast %cos32 : tensor<1x?x8xf32> -> tensor<1x?x8xbf16>
  %sin = ad.cast %sin32 : tensor<1x?x8xf32> -> tensor<1x?x8xbf16>
  %qr, %kr = ad.rope %q, %k rope %cos, %sin : (tensor<1x2x?x8xbf16>, tensor<1x1x?x8xbf16>, tensor<1x?x8xbf16>, tensor<1x?x8xbf16>) -> (tensor<1x2x?x8xbf16>, tensor<1x1x?x8xbf16>)
  %n = ad.sym_size %q dim 2 : tensor<1x2x?x8xbf16>
  %ku = ad.unsqueeze %kr dim 2 : tensor<1x1x?x8xbf16> -> tensor<1x1x1x?x8xbf16>
  %ke = ad.expand %ku [1, 1, 2, %n, 8] : tensor<1x1x1x?x8xbf16> -> tensor<1x1x2x?x8xbf16>
  %krep = ad.reshape %ke [1, 2, %n, 8] : tensor<1x1x2x?x8xbf16> -> tensor<1x2x?x8xbf16>
  %vu = ad.unsqueeze %v dim 2 : tensor<1x1x?x8xbf16> -> tensor<1x1x1x?x8xbf16>
  %ve = ad.expand %vu [1, 1, 2, %n, 8] : tensor<1x1x1x?x8xbf16> -> tensor<1x1x2x?x8xbf16>
  %vrep = ad.reshape %ve [1, 2, %n, 8] : tensor<1x1x2x?x8xbf16> -> tensor<1x2x?x8xbf16>
  %kt = ad.transpose %krep 2, 3 : tensor<1x2x?x8xbf16> -> tensor<1x2x8x?xbf16>
  %s = ad.matmul %qr, %kt : (tensor<1x2x?x8xbf16>, tensor<1x2x8x?xbf16>) -> tensor<1x2x?x?xbf16>
  %scaling = ad.constant 6.250000e-02 : f64
  %scaled = ad.mul %s, %scaling : tensor<1x2x?x?xbf16>, f64 -> tensor<1x2x?x?xbf16>
  %cap = ad.constant 5.000000e+01 : f64
  %d = ad.div %scaled, %cap : tensor<1x2x?x?xbf16>, f64 -> tensor<1x2x?x?xbf16>
  %t = ad.tanh %d : tensor<1x2x?x?xbf16> -> tensor<1x2x?x?xbf16>
  %capped = ad.mul %t, %cap : tensor<1x2x?x?xbf16>, f64 -> tensor<1x2x?x?xbf16>
  %a = ad.unsqueeze %position_ids dim 2 : tensor<1x?xi64> -> tensor<1x?x1xi64>
  %b = ad.unsqueeze %position_ids dim 1 : tensor<1x?xi64> -> tensor<1x1x?xi64>
  %m = ad.le %b, %a : tensor<1x1x?xi64>, tensor<1x?x1xi64> -> tensor<1x?x?xi1>
  %mu = ad.unsqueeze %m dim 1 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %zero = ad.constant 0.000000e+00 : f64
  %lowest = ad.constant -3.3895313892515355e+38 : f64
  %mask = ad.where %mu, %zero, %lowest : tensor<1x1x?x?xi1>, f64, f64 -> tensor<1x1x?x?xbf16>
  %masked = ad.add %capped, %mask : tensor<1x2x?x?xbf16>, tensor<1x1x?x?xbf16> -> tensor<1x2x?x?xbf16>
  %p = ad.softmax %masked dim -1 dtype f32 : tensor<1x2x?x?xbf16> -> tensor<1x2x?x?xf32>
  %pc = ad.cast %p : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xbf16>
  %o = ad.matmul %pc, %vrep : (tensor<1x2x?x?xbf16>, tensor<1x2x?x8xbf16>) -> tensor<1x2x?x8xbf16> loc("model.layers.0.self_attn")
  func.return %o : tensor<1x2x?x8xbf16>
}

// -----

// A cap of 1 is a bare tanh (canonicalize drops x / 1 and * 1); the mask, added first, is a
// sliding window of 4 (-inf outside); no RoPE, no repeat_kv (as many key/value heads as query heads).
// CHECK-LABEL: func.func @tanh_window
// CHECK:       ad.cached_attention %q, %k, %v cache %k_cache{{.*}}, %v_cache{{.*}} block_tables %block_tables cache_starts %cache_starts scale 0.35355339059327379 window 4 softcap 1.000000e+00 : (tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<1x2x?x8xf32>
// CHECK-NEXT:  func.return
func.func @tanh_window(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x2x?x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}, %position_ids: tensor<1x?xi64> {ad.input = "position_ids"}) -> tensor<1x2x?x8xf32> {
  %kt = ad.transpose %k -1, -2 : tensor<1x2x?x8xf32> -> tensor<1x2x8x?xf32>
  %s = ad.matmul %q, %kt : (tensor<1x2x?x8xf32>, tensor<1x2x8x?xf32>) -> tensor<1x2x?x?xf32>
  %scaling = ad.constant 0.35355339059327379 : f64
  %scaled = ad.mul %scaling, %s : f64, tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32>
  %capped = ad.tanh %scaled : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32>
  %a = ad.unsqueeze %position_ids dim 2 : tensor<1x?xi64> -> tensor<1x?x1xi64>
  %b = ad.unsqueeze %position_ids dim 1 : tensor<1x?xi64> -> tensor<1x1x?xi64>
  %causal = ad.le %b, %a : tensor<1x1x?xi64>, tensor<1x?x1xi64> -> tensor<1x?x?xi1>
  %four = ad.constant 4 : i64
  %lo = ad.sub %a, %four : tensor<1x?x1xi64>, i64 -> tensor<1x?x1xi64>
  %near = ad.gt %b, %lo : tensor<1x1x?xi64>, tensor<1x?x1xi64> -> tensor<1x?x?xi1>
  %m = ad.logical_and %causal, %near : tensor<1x?x?xi1>, tensor<1x?x?xi1> -> tensor<1x?x?xi1>
  %mu = ad.unsqueeze %m dim 1 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %zero = ad.constant 0.000000e+00 : f64
  %inf = ad.constant 0xFFF0000000000000 : f64
  %mask = ad.where %mu, %zero, %inf : tensor<1x1x?x?xi1>, f64, f64 -> tensor<1x1x?x?xf32>
  %masked = ad.add %mask, %capped : tensor<1x1x?x?xf32>, tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32>
  %p = ad.softmax %masked dim 3 : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32>
  %o = ad.matmul %p, %v : (tensor<1x2x?x?xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x8xf32> loc("model.layers.1.self_attn")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----

// DeepSeek's heads through SDPA: query and key 12 wide (8 nope + 4 rope), value 8: a key cache
// [slots, max_seq, heads, 12] and a value cache [slots, max_seq, heads, 8]; the result 8 wide.
// CHECK-LABEL: func.func @value_head_dim
// CHECK-SAME:  %k_cache{{.*}}: tensor<2x16x2x12xf32> {ad.input = "k_cache_0", ad.cache = "model.layers.0.self_attn key"}
// CHECK-SAME:  %v_cache{{.*}}: tensor<2x16x2x8xf32> {ad.input = "v_cache_0", ad.cache = "model.layers.0.self_attn value"}
// CHECK-NOT:   ad.attention
// CHECK:       ad.cached_attention %q, %k, %v cache %k_cache{{.*}}, %v_cache{{.*}} block_tables %block_tables cache_starts %cache_starts scale 0.288{{[0-9]*}} : (tensor<1x2x?x12xf32>, tensor<1x2x?x12xf32>, tensor<1x2x?x8xf32>, tensor<2x16x2x12xf32>, tensor<2x16x2x8xf32>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<1x2x?x8xf32>
// CHECK-NEXT:  func.return
func.func @value_head_dim(%q: tensor<1x2x?x12xf32> {ad.input = "q"}, %k: tensor<1x2x?x12xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}) -> tensor<1x2x?x8xf32> {
  %o = ad.attention %q, %k, %v causal : (tensor<1x2x?x12xf32>, tensor<1x2x?x12xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x8xf32> loc("model.layers.0.self_attn")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----

// gpt-oss's eager attention with sinks: each head's logit concatenated to the masked scores as
// one more column, the row max subtracted, softmax, the sink column sliced off, times v. One
// ad.cached_attention with the sinks as an operand; the concatenation, max, softmax, slice,
// the sinks' view and the mask are gone (the window of 4 kept).
// CHECK-LABEL: func.func @sinks
// CHECK-NOT:   ad.cat
// CHECK-NOT:   ad.torch_op
// CHECK-NOT:   ad.softmax
// CHECK-NOT:   ad.slice
// CHECK:       ad.cached_attention %q, %k, %v cache %k_cache{{.*}}, %v_cache{{.*}} block_tables %block_tables cache_starts %cache_starts scale 0.35355339059327379 window 4 sinks %sinks : tensor<2xf32> : (tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<1x2x?x8xf32>
// CHECK-NEXT:  func.return
func.func @sinks(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x2x?x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}, %sinks: tensor<2xf32> {ad.param = "model.layers.0.self_attn.sinks"}, %position_ids: tensor<1x?xi64> {ad.input = "position_ids"}) -> tensor<1x2x?x8xf32> {
  %kt = ad.transpose %k 2, 3 : tensor<1x2x?x8xf32> -> tensor<1x2x8x?xf32>
  %s = ad.matmul %q, %kt : (tensor<1x2x?x8xf32>, tensor<1x2x8x?xf32>) -> tensor<1x2x?x?xf32>
  %scaling = ad.constant 0.35355339059327379 : f64
  %scaled = ad.mul %s, %scaling : tensor<1x2x?x?xf32>, f64 -> tensor<1x2x?x?xf32>
  %a = ad.unsqueeze %position_ids dim 2 : tensor<1x?xi64> -> tensor<1x?x1xi64>
  %b = ad.unsqueeze %position_ids dim 1 : tensor<1x?xi64> -> tensor<1x1x?xi64>
  %causal = ad.le %b, %a : tensor<1x1x?xi64>, tensor<1x?x1xi64> -> tensor<1x?x?xi1>
  %four = ad.constant 4 : i64
  %lo = ad.sub %a, %four : tensor<1x?x1xi64>, i64 -> tensor<1x?x1xi64>
  %near = ad.gt %b, %lo : tensor<1x1x?xi64>, tensor<1x?x1xi64> -> tensor<1x?x?xi1>
  %m = ad.logical_and %causal, %near : tensor<1x?x?xi1>, tensor<1x?x?xi1> -> tensor<1x?x?xi1>
  %mu = ad.unsqueeze %m dim 1 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %zero = ad.constant 0.000000e+00 : f64
  %inf = ad.constant 0xFFF0000000000000 : f64
  %mask = ad.where %mu, %zero, %inf : tensor<1x1x?x?xi1>, f64, f64 -> tensor<1x1x?x?xf32>
  %masked = ad.add %scaled, %mask : tensor<1x2x?x?xf32>, tensor<1x1x?x?xf32> -> tensor<1x2x?x?xf32>
  %n = ad.sym_size %q dim 2 : tensor<1x2x?x8xf32>
  %sv = ad.reshape %sinks [1, -1, 1, 1] : tensor<2xf32> -> tensor<1x2x1x1xf32>
  %se = ad.expand %sv [1, -1, %n, -1] : tensor<1x2x1x1xf32> -> tensor<1x2x?x1xf32>
  %c = ad.cat %masked, %se dim -1 : (tensor<1x2x?x?xf32>, tensor<1x2x?x1xf32>) -> tensor<1x2x?x?xf32>
  %max, %idx = ad.torch_op "aten.max.dim"(%c) [#ad.ref<0>, -1 : i64, true] {} unpack : (tensor<1x2x?x?xf32>) -> (tensor<1x2x?x1xf32>, tensor<1x2x?x1xi64>)
  %shifted = ad.sub %c, %max : tensor<1x2x?x?xf32>, tensor<1x2x?x1xf32> -> tensor<1x2x?x?xf32>
  %p = ad.softmax %shifted dim -1 dtype f32 : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32>
  %dropped = ad.slice %p dim 3 [0, -1, 1] : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32>
  %o = ad.matmul %dropped, %v : (tensor<1x2x?x?xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x8xf32> loc("model.layers.0.self_attn")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----

// GraniteSWA's sinks: the output of softmax(scores + mask) @ v scaled by
// sigmoid(logsumexp(scores + mask) - sink), the share of the softmax denominator the keys have;
// unscaled scores (scale 1). One ad.cached_attention with the sinks as an operand; the
// logsumexp, sigmoid, softmax, product and the sinks' view are gone.
// CHECK-LABEL: func.func @lse_sinks
// CHECK-NOT:   ad.torch_op
// CHECK-NOT:   ad.softmax
// CHECK-NOT:   ad.sigmoid
// CHECK:       ad.cached_attention %q, %k, %v cache %k_cache{{.*}}, %v_cache{{.*}} block_tables %block_tables cache_starts %cache_starts scale 1.000000e+00 sinks %sinks : tensor<2xf32> : (tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<1x2x?x8xf32>
// CHECK-NEXT:  func.return
func.func @lse_sinks(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x2x?x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}, %sinks: tensor<2xf32> {ad.param = "model.layers.0.self_attn.sinks"}, %position_ids: tensor<1x?xi64> {ad.input = "position_ids"}) -> tensor<1x2x?x8xf32> {
  %kt = ad.transpose %k 2, 3 : tensor<1x2x?x8xf32> -> tensor<1x2x8x?xf32>
  %s = ad.matmul %q, %kt : (tensor<1x2x?x8xf32>, tensor<1x2x8x?xf32>) -> tensor<1x2x?x?xf32>
  %a = ad.unsqueeze %position_ids dim 2 : tensor<1x?xi64> -> tensor<1x?x1xi64>
  %b = ad.unsqueeze %position_ids dim 1 : tensor<1x?xi64> -> tensor<1x1x?xi64>
  %causal = ad.le %b, %a : tensor<1x1x?xi64>, tensor<1x?x1xi64> -> tensor<1x?x?xi1>
  %mu = ad.unsqueeze %causal dim 1 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %zero = ad.constant 0.000000e+00 : f64
  %inf = ad.constant 0xFFF0000000000000 : f64
  %mask = ad.where %mu, %zero, %inf : tensor<1x1x?x?xi1>, f64, f64 -> tensor<1x1x?x?xf32>
  %masked = ad.add %s, %mask : tensor<1x2x?x?xf32>, tensor<1x1x?x?xf32> -> tensor<1x2x?x?xf32>
  %lse = ad.torch_op "aten.logsumexp.default"(%masked) [#ad.ref<0>, [-1 : i64]] {} : (tensor<1x2x?x?xf32>) -> tensor<1x2x?xf32>
  %sv = ad.reshape %sinks [1, -1, 1] : tensor<2xf32> -> tensor<1x2x1xf32>
  %shifted = ad.sub %lse, %sv : tensor<1x2x?xf32>, tensor<1x2x1xf32> -> tensor<1x2x?xf32>
  %share = ad.sigmoid %shifted : tensor<1x2x?xf32> -> tensor<1x2x?xf32>
  %p = ad.softmax %masked dim -1 : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32>
  %pv = ad.matmul %p, %v : (tensor<1x2x?x?xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x8xf32>
  %f = ad.unsqueeze %share dim -1 : tensor<1x2x?xf32> -> tensor<1x2x?x1xf32>
  %o = ad.mul %pv, %f : tensor<1x2x?x8xf32>, tensor<1x2x?x1xf32> -> tensor<1x2x?x8xf32> loc("model.layers.0.self_attn")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----

// MPT's eager attention: ALiBi's bias (slopes per head times the key position, the slopes
// computed from constants), added to the scaled scores, then masked_fill with a boolean mask
// that is True where masked (key after query). One ad.cached_attention that reads the slopes;
// the bias's position computation, the mask and the chain are gone.
// CHECK-LABEL: func.func @alibi_masked_fill
// CHECK:       %slopes = ad.mul %hf, %quarter
// CHECK-NOT:   ad.sym_size
// CHECK-NOT:   ad.torch_op
// CHECK-NOT:   ad.softmax
// CHECK:       ad.cached_attention %q, %k, %v cache %k_cache{{.*}}, %v_cache{{.*}} block_tables %block_tables cache_starts %cache_starts scale 0.35355339059327379 alibi %slopes : tensor<2xf32> : (tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<1x2x?x8xf32>
// CHECK-NEXT:  func.return
func.func @alibi_masked_fill(%ids: tensor<1x?xi64> {ad.input = "input_ids"}, %q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x2x?x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}) -> tensor<1x2x?x8xf32> {
  %c0 = ad.constant 0 : i64
  %c1 = ad.constant 1 : i64
  %c3 = ad.constant 3 : i64
  %h = ad.arange %c1, %c3, %c1 : i64, i64, i64 -> tensor<2xi64>
  %hf = ad.cast %h : tensor<2xi64> -> tensor<2xf32>
  %quarter = ad.constant 2.500000e-01 : f64
  %slopes = ad.mul %hf, %quarter : tensor<2xf32>, f64 -> tensor<2xf32>
  %sv = ad.reshape %slopes [2, 1, 1] : tensor<2xf32> -> tensor<2x1x1xf32>
  %n = ad.sym_size %ids dim 1 : tensor<1x?xi64>
  %pos = ad.arange %c0, %n, %c1 : i64, index, i64 -> tensor<?xi64>
  %bias = ad.mul %sv, %pos : tensor<2x1x1xf32>, tensor<?xi64> -> tensor<2x1x?xf32>
  %kt = ad.transpose %k 2, 3 : tensor<1x2x?x8xf32> -> tensor<1x2x8x?xf32>
  %s = ad.matmul %q, %kt : (tensor<1x2x?x8xf32>, tensor<1x2x8x?xf32>) -> tensor<1x2x?x?xf32>
  %scaling = ad.constant 0.35355339059327379 : f64
  %scaled = ad.mul %s, %scaling : tensor<1x2x?x?xf32>, f64 -> tensor<1x2x?x?xf32>
  %biased = ad.add %scaled, %bias : tensor<1x2x?x?xf32>, tensor<2x1x?xf32> -> tensor<1x2x?x?xf32>
  %kp = ad.unsqueeze %pos dim 0 : tensor<?xi64> -> tensor<1x?xi64>
  %qp = ad.unsqueeze %pos dim 1 : tensor<?xi64> -> tensor<?x1xi64>
  %later = ad.gt %kp, %qp : tensor<1x?xi64>, tensor<?x1xi64> -> tensor<?x?xi1>
  %masked = ad.torch_op "aten.masked_fill.Scalar"(%biased, %later) [#ad.ref<0>, #ad.ref<1>, -3.4028234663852886e+38 : f64] {} : (tensor<1x2x?x?xf32>, tensor<?x?xi1>) -> tensor<1x2x?x?xf32>
  %p = ad.softmax %masked dim -1 : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32>
  %o = ad.matmul %p, %v : (tensor<1x2x?x?xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x8xf32> loc("transformer.blocks.0.attn")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----

// BLOOM's attention over [batch * heads] rows (bf16): baddbmm(ALiBi bias, q, k^T, beta 1, alpha =
// the scale) viewed as [batch, heads, seq, keys], plus an additive causal mask, softmax in f32 cast
// back, viewed back,
// bmm with v, viewed as [batch, heads, seq, head_dim]: one ad.cached_attention on the
// [batch, heads, seq, head_dim] q, k and v, with the slopes; the rows' views, baddbmm, bmm and
// the position computations are gone.
// CHECK-LABEL: func.func @alibi_bmm_rows
// CHECK-NOT:   ad.torch_op
// CHECK-NOT:   ad.softmax
// CHECK-NOT:   ad.bmm
// CHECK:       ad.cached_attention %q, %k, %v cache %k_cache{{.*}}, %v_cache{{.*}} block_tables %block_tables cache_starts %cache_starts scale 0.35355339059327379 alibi %slopes : tensor<2xf32> : (tensor<1x2x?x8xbf16>, tensor<1x2x?x8xbf16>, tensor<1x2x?x8xbf16>, tensor<2x16x2x8xbf16>, tensor<2x16x2x8xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<1x2x?x8xbf16>
// CHECK-NEXT:  func.return
func.func @alibi_bmm_rows(%ids: tensor<1x?xi64> {ad.input = "input_ids"}, %q: tensor<1x2x?x8xbf16> {ad.input = "q"}, %k: tensor<1x2x?x8xbf16> {ad.input = "k"}, %v: tensor<1x2x?x8xbf16> {ad.input = "v"}) -> tensor<1x2x?x8xbf16> {
  %c0 = ad.constant 0 : i64
  %c1 = ad.constant 1 : i64
  %c3 = ad.constant 3 : i64
  %h = ad.arange %c1, %c3, %c1 : i64, i64, i64 -> tensor<2xi64>
  %hf = ad.cast %h : tensor<2xi64> -> tensor<2xf32>
  %quarter = ad.constant 2.500000e-01 : f64
  %slopes = ad.mul %hf, %quarter : tensor<2xf32>, f64 -> tensor<2xf32>
  %sv = ad.reshape %slopes [2, 1, 1] : tensor<2xf32> -> tensor<2x1x1xf32>
  %n = ad.sym_size %ids dim 1 : tensor<1x?xi64>
  %pos = ad.arange %c0, %n, %c1 : i64, index, i64 -> tensor<?xi64>
  %bias32 = ad.mul %sv, %pos : tensor<2x1x1xf32>, tensor<?xi64> -> tensor<2x1x?xf32>
  %bias = ad.cast %bias32 : tensor<2x1x?xf32> -> tensor<2x1x?xbf16>
  %kp = ad.unsqueeze %pos dim 0 : tensor<?xi64> -> tensor<1x?xi64>
  %qp = ad.unsqueeze %pos dim 1 : tensor<?xi64> -> tensor<?x1xi64>
  %seen = ad.le %kp, %qp : tensor<1x?xi64>, tensor<?x1xi64> -> tensor<?x?xi1>
  %zero = ad.constant 0.000000e+00 : f64
  %lowest = ad.constant -3.4028234663852886e+38 : f64
  %mask = ad.where %seen, %zero, %lowest : tensor<?x?xi1>, f64, f64 -> tensor<?x?xbf16>
  %qr = ad.reshape %q [2, -1, 8] : tensor<1x2x?x8xbf16> -> tensor<2x?x8xbf16>
  %kr = ad.reshape %k [2, -1, 8] : tensor<1x2x?x8xbf16> -> tensor<2x?x8xbf16>
  %kt = ad.transpose %kr -1, -2 : tensor<2x?x8xbf16> -> tensor<2x8x?xbf16>
  %vr = ad.reshape %v [2, -1, 8] : tensor<1x2x?x8xbf16> -> tensor<2x?x8xbf16>
  %s = ad.torch_op "aten.baddbmm.default"(%bias, %qr, %kt) [#ad.ref<0>, #ad.ref<1>, #ad.ref<2>] {beta = 1.000000e+00 : f64, alpha = 0.35355339059327379 : f64} : (tensor<2x1x?xbf16>, tensor<2x?x8xbf16>, tensor<2x8x?xbf16>) -> tensor<2x?x?xbf16>
  %s4 = ad.reshape %s [1, 2, %n, -1] : tensor<2x?x?xbf16> -> tensor<1x2x?x?xbf16>
  %masked = ad.add %s4, %mask : tensor<1x2x?x?xbf16>, tensor<?x?xbf16> -> tensor<1x2x?x?xbf16>
  %p32 = ad.softmax %masked dim -1 dtype f32 : tensor<1x2x?x?xbf16> -> tensor<1x2x?x?xf32>
  %p = ad.cast %p32 : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xbf16>
  %p3 = ad.reshape %p [2, %n, -1] : tensor<1x2x?x?xbf16> -> tensor<2x?x?xbf16>
  %o3 = ad.bmm %p3, %vr : (tensor<2x?x?xbf16>, tensor<2x?x8xbf16>) -> tensor<2x?x8xbf16>
  %o = ad.reshape %o3 [1, 2, %n, 8] : tensor<2x?x8xbf16> -> tensor<1x2x?x8xbf16> loc("transformer.h.0.self_attention")
  func.return %o : tensor<1x2x?x8xbf16>
}

// -----

// LFM2's short convolution: a depthwise conv1d padded by kernel - 1 and cut back to the
// sequence's length becomes ad.cached_causal_conv1d over a state argument [slots, channels,
// kernel - 1] (a model with no attention gets the slots and starts all the same).
// CHECK-LABEL: func.func @short_conv
// CHECK-SAME:  %conv_state{{.*}}: tensor<2x8x2xf32> {ad.input = "conv_state_0", ad.cache = "model.layers.0.conv conv_state"}
// CHECK-NOT:   aten.conv1d
// CHECK:       %[[OUT:.*]] = ad.cached_causal_conv1d %x, %w bias %b state %conv_state slots %cache_slots starts %cache_starts : (tensor<1x8x?xf32>, tensor<8x1x3xf32>, tensor<2x8x2xf32>, tensor<?xi64>, tensor<?xi64>, tensor<8xf32>) -> tensor<1x8x?xf32>
// CHECK-NEXT:  func.return %[[OUT]]
func.func @short_conv(%ids: tensor<1x?xi64> {ad.input = "input_ids"}, %x: tensor<1x8x?xf32> {ad.input = "x"}, %w: tensor<8x1x3xf32> {ad.param = "model.layers.0.conv.conv.weight"}, %b: tensor<8xf32> {ad.param = "model.layers.0.conv.conv.bias"}) -> tensor<1x8x?xf32> {
  %seq = ad.sym_size %ids dim 1 : tensor<1x?xi64>
  %c = ad.torch_op "aten.conv1d.default"(%x, %w, %b) [#ad.ref<0>, #ad.ref<1>, #ad.ref<2>, [1 : i64], [2 : i64], [1 : i64], 8 : i64] {} : (tensor<1x8x?xf32>, tensor<8x1x3xf32>, tensor<8xf32>) -> tensor<1x8x?xf32> loc("model.layers.0.conv")
  %s = ad.slice %c dim 2 [0, %seq, 1] : tensor<1x8x?xf32> -> tensor<1x8x?xf32>
  func.return %s : tensor<1x8x?xf32>
}

// -----

// An MoE block's expert groups beside the attention mix no positions: the tokens per expert (a
// sum over the token axis) only size the groups, each group goes through its own expert, and
// the groups are joined back in split order; a [tokens * top_k, h] list viewed back as
// [batch, seq, top_k, -1] infers a model size, not a token count. So the attention is cached
// and the expert ops stay.
// CHECK-LABEL: func.func @expert_groups
// CHECK:       ad.sum %assigned dim [0]
// CHECK:       ad.split %x [%n0, %n1]
// CHECK:       %[[JOINED:.*]] = ad.cat %y0, %y1 :
// CHECK:       %[[VIEW:.*]] = ad.reshape %[[JOINED]]
// CHECK:       %[[O:.*]] = ad.cached_attention %q, %k, %v cache
// CHECK-NEXT:  func.return %[[VIEW]], %[[O]]
func.func @expert_groups(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x2x?x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}, %x: tensor<?x8xf32> {ad.input = "x"}, %assigned: tensor<?x2xi64> {ad.input = "assigned"}, %w0: tensor<8x8xf32> {ad.param = "model.layers.0.mlp.experts.0.weight"}, %w1: tensor<8x8xf32> {ad.param = "model.layers.0.mlp.experts.1.weight"}, %b: index, %s: index) -> (tensor<?x?x2x4xf32>, tensor<1x2x?x8xf32>) {
  %counts = ad.sum %assigned dim [0] : tensor<?x2xi64> -> tensor<2xi64>
  %c0, %c1 = ad.torch_op "aten.unbind.int"(%counts) [#ad.ref<0>] {} unpack : (tensor<2xi64>) -> (tensor<i64>, tensor<i64>)
  %n0 = ad.torch_op "aten.item.default"(%c0) [#ad.ref<0>] {} : (tensor<i64>) -> index
  %n1 = ad.torch_op "aten.item.default"(%c1) [#ad.ref<0>] {} : (tensor<i64>) -> index
  %x0, %x1 = ad.split %x [%n0, %n1] : tensor<?x8xf32> -> tensor<?x8xf32>, tensor<?x8xf32>
  %y0 = ad.linear %x0, %w0 : (tensor<?x8xf32>, tensor<8x8xf32>) -> tensor<?x8xf32>
  %y1 = ad.linear %x1, %w1 : (tensor<?x8xf32>, tensor<8x8xf32>) -> tensor<?x8xf32>
  %joined = ad.cat %y0, %y1 : (tensor<?x8xf32>, tensor<?x8xf32>) -> tensor<?x8xf32> loc("model.layers.0.mlp")
  %view = ad.reshape %joined [%b, %s, 2, -1] : tensor<?x8xf32> -> tensor<?x?x2x4xf32> loc("model.layers.0.mlp")
  %o = ad.attention %q, %k, %v causal : (tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x8xf32> loc("model.layers.0.self_attn")
  func.return %view, %o : tensor<?x?x2x4xf32>, tensor<1x2x?x8xf32>
}

// -----

// Mamba2's scan as the export patches route it (HF's mamba2_chunk_scan: x, dt, A, B, C, chunk
// size, D, dt_bias, softplus, dt limits (0.001, inf)) becomes ad.cached_ssm_scan over an fp32
// state argument [slots, heads, head_dim, state_size]: D, dt_bias, softplus and the lower limit
// carried, no upper one.
// CHECK-LABEL: func.func @mamba2_scan
// CHECK-SAME:  %ssm_state{{.*}}: tensor<2x4x16x8xf32> {ad.input = "ssm_state_0", ad.cache = "model.layers.0.mixer ssm_state"}
// CHECK-NOT:   ad.torch_op
// CHECK:       %[[OUT:.*]] = ad.cached_ssm_scan %x, %dt, %a, %b, %c d %d dt_bias %dt_bias dt_softplus dt_min 1.000000e-03 state %ssm_state slots %cache_slots starts %cache_starts : (tensor<?x?x4x16xf32>, tensor<?x?x4xf32>, tensor<4xf32>, tensor<?x?x2x8xf32>, tensor<?x?x2x8xf32>, tensor<2x4x16x8xf32>, tensor<?xi64>, tensor<?xi64>, d tensor<4xf32>, dt_bias tensor<4xf32>) -> tensor<?x?x4x16xf32>
// CHECK-NEXT:  func.return %[[OUT]]
func.func @mamba2_scan(%x: tensor<?x?x4x16xf32> {ad.input = "x"}, %dt: tensor<?x?x4xf32> {ad.input = "dt"}, %a: tensor<4xf32> {ad.input = "a"}, %b: tensor<?x?x2x8xf32> {ad.input = "b"}, %c: tensor<?x?x2x8xf32> {ad.input = "c"}, %d: tensor<4xf32> {ad.param = "model.layers.0.mixer.D"}, %dt_bias: tensor<4xf32> {ad.param = "model.layers.0.mixer.dt_bias"}) -> tensor<?x?x4x16xf32> {
  %y = ad.torch_op "ad_mlir.mamba2_chunk_scan.default"(%x, %dt, %a, %b, %c, %d, %dt_bias) ["transformers.models.nemotron_h.modeling_nemotron_h", #ad.ref<0>, #ad.ref<1>, #ad.ref<2>, #ad.ref<3>, #ad.ref<4>, 8 : i64, #ad.ref<5>, #ad.ref<6>, true, 1.000000e-03 : f64, 0x7ff0000000000000 : f64] {} : (tensor<?x?x4x16xf32>, tensor<?x?x4xf32>, tensor<4xf32>, tensor<?x?x2x8xf32>, tensor<?x?x2x8xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<?x?x4x16xf32> loc("model.layers.0.mixer")
  func.return %y : tensor<?x?x4x16xf32>
}

// -----

// The gated delta rule as the export patches route it (HF's torch_chunk_gated_delta_rule: q, k,
// v, g, beta, chunk size, q/k L2 norm) becomes ad.cached_gated_delta_rule over an fp32 state
// argument [slots, value heads, key dim, value dim].
// CHECK-LABEL: func.func @gated_delta_rule
// CHECK-SAME:  %recurrent_state{{.*}}: tensor<2x4x16x8xf32> {ad.input = "recurrent_state_0", ad.cache = "model.layers.0.linear_attn recurrent_state"}
// CHECK-NOT:   ad.torch_op
// CHECK:       %[[OUT:.*]] = ad.cached_gated_delta_rule %q, %k, %v, %g, %beta use_qk_l2norm state %recurrent_state slots %cache_slots starts %cache_starts : (tensor<?x?x2x16xbf16>, tensor<?x?x2x16xbf16>, tensor<?x?x4x8xbf16>, tensor<?x?x4xf32>, tensor<?x?x4xbf16>, tensor<2x4x16x8xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<?x?x4x8xbf16>
// CHECK-NEXT:  func.return %[[OUT]]
func.func @gated_delta_rule(%q: tensor<?x?x2x16xbf16> {ad.input = "q"}, %k: tensor<?x?x2x16xbf16> {ad.input = "k"}, %v: tensor<?x?x4x8xbf16> {ad.input = "v"}, %g: tensor<?x?x4xf32> {ad.input = "g"}, %beta: tensor<?x?x4xbf16> {ad.input = "beta"}) -> tensor<?x?x4x8xbf16> {
  %o = ad.torch_op "ad_mlir.chunk_gated_delta_rule.default"(%q, %k, %v, %g, %beta) ["transformers.models.qwen3_next.modeling_qwen3_next", #ad.ref<0>, #ad.ref<1>, #ad.ref<2>, #ad.ref<3>, #ad.ref<4>, 64 : i64, true] {} : (tensor<?x?x2x16xbf16>, tensor<?x?x2x16xbf16>, tensor<?x?x4x8xbf16>, tensor<?x?x4xf32>, tensor<?x?x4xbf16>) -> tensor<?x?x4x8xbf16> loc("model.layers.0.linear_attn")
  func.return %o : tensor<?x?x4x8xbf16>
}

// -----

// Two forms that keep token positions where they are, beside a cached attention, are no mixers:
// Olmo-Hybrid's cut of its convolution's output to the last seq_len tokens (x[..., -seq_len:],
// the whole sequence as far as the types tell) and Qwen3-Next's flat [b * s * heads, v] back to
// [b, s, -1] (the -1 a static extent, no token count inferred).
// CHECK-LABEL: func.func @no_mixers
// CHECK:       ad.slice %x dim 2 [%neg, 9223372036854775807, 1]
// CHECK:       ad.reshape %flat [%b, %n, -1]
// CHECK:       ad.cached_attention
func.func @no_mixers(%ids: tensor<?x?xi64> {ad.input = "input_ids"}, %x: tensor<?x8x?xf32> {ad.input = "x"}, %flat: tensor<?x8xf32> {ad.input = "flat"}, %q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x2x?x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}) -> (tensor<?x8x?xf32>, tensor<?x?x32xf32>, tensor<1x2x?x8xf32>) {
  %b = ad.sym_size %ids dim 0 : tensor<?x?xi64>
  %n = ad.sym_size %ids dim 1 : tensor<?x?xi64>
  %neg = ad.torch_op "_operator.neg"(%n) [#ad.ref<0>] {} : (index) -> index
  %tail = ad.slice %x dim 2 [%neg, 9223372036854775807, 1] : tensor<?x8x?xf32> -> tensor<?x8x?xf32> loc("model.layers.0.linear_attn")
  %merged = ad.reshape %flat [%b, %n, -1] : tensor<?x8xf32> -> tensor<?x?x32xf32> loc("model.layers.0.linear_attn")
  %o = ad.attention %q, %k, %v causal : (tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x8xf32> loc("model.layers.1.self_attn")
  func.return %tail, %merged, %o : tensor<?x8x?xf32>, tensor<?x?x32xf32>, tensor<1x2x?x8xf32>
}

// -----

// OpenAI-GPT's eager attention: its key permuted straight from [batch, seq, heads, head_dim] to
// k^T, the scores masked as scores * m + (1 - m) * -1e4 of a float mask m of 0 and 1 (here
// computed from the positions; OpenAI-GPT slices its triangular buffer, which the compiler
// evaluates). One ad.cached_attention over the key permuted to heads first; the mask and the
// chain are gone.
// CHECK-LABEL: func.func @multiplied_mask
// CHECK:       %[[K:.*]] = ad.permute %k [0, 2, 1, 3] : tensor<1x?x2x8xf32> -> tensor<1x2x?x8xf32>
// CHECK-NOT:   ad.softmax
// CHECK-NOT:   ad.arange
// CHECK:       ad.cached_attention %q, %[[K]], %v cache %k_cache{{.*}}, %v_cache{{.*}} block_tables %block_tables cache_starts %cache_starts scale 0.35355339059327373 : (tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<1x2x?x8xf32>
// CHECK-NEXT:  func.return
func.func @multiplied_mask(%ids: tensor<1x?xi64> {ad.input = "input_ids"}, %q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x?x2x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}) -> tensor<1x2x?x8xf32> {
  %c0 = ad.constant 0 : i64
  %c1 = ad.constant 1 : i64
  %n = ad.sym_size %ids dim 1 : tensor<1x?xi64>
  %pos = ad.arange %c0, %n, %c1 : i64, index, i64 -> tensor<?xi64>
  %kp = ad.unsqueeze %pos dim 0 : tensor<?xi64> -> tensor<1x?xi64>
  %qp = ad.unsqueeze %pos dim 1 : tensor<?xi64> -> tensor<?x1xi64>
  %seen = ad.le %kp, %qp : tensor<1x?xi64>, tensor<?x1xi64> -> tensor<?x?xi1>
  %m = ad.cast %seen : tensor<?x?xi1> -> tensor<?x?xf32>
  %kt = ad.permute %k [0, 2, 3, 1] : tensor<1x?x2x8xf32> -> tensor<1x2x8x?xf32>
  %s = ad.matmul %q, %kt : (tensor<1x2x?x8xf32>, tensor<1x2x8x?xf32>) -> tensor<1x2x?x?xf32>
  %root = ad.constant 2.8284271247461903 : f64
  %scaled = ad.div %s, %root : tensor<1x2x?x?xf32>, f64 -> tensor<1x2x?x?xf32>
  %kept = ad.mul %scaled, %m : tensor<1x2x?x?xf32>, tensor<?x?xf32> -> tensor<1x2x?x?xf32>
  %dropped = ad.sub %c1, %m : i64, tensor<?x?xf32> -> tensor<?x?xf32>
  %big = ad.constant -1.000000e+04 : f64
  %fill = ad.mul %dropped, %big : tensor<?x?xf32>, f64 -> tensor<?x?xf32>
  %masked = ad.add %kept, %fill : tensor<1x2x?x?xf32>, tensor<?x?xf32> -> tensor<1x2x?x?xf32>
  %p = ad.softmax %masked dim -1 : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32>
  %o = ad.matmul %p, %v : (tensor<1x2x?x?xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x8xf32> loc("transformer.h.0.attn")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----

// A mask that reads a weight for its shape only (GIT's token types are zeros_like of its
// embeddings): the embedding runs on the meta device for its shape, the mask evaluates to
// causal and is dropped with its computation.
// CHECK-LABEL: func.func @mask_reads_shape
// CHECK-NOT:   ad.embedding
// CHECK-NOT:   ad.torch_op
// CHECK:       ad.cached_attention %q, %k, %v cache %k_cache{{.*}}, %v_cache{{.*}} block_tables %block_tables cache_starts %cache_starts scale 0.35355339059327379 : (tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<1x2x?x8xf32>
// CHECK-NEXT:  func.return
func.func @mask_reads_shape(%w: tensor<16x8xf32> {ad.param = "git.embeddings.word_embeddings.weight"}, %input_ids: tensor<1x?xi64> {ad.input = "input_ids"}, %position_ids: tensor<1x?xi64> {ad.input = "position_ids"}, %q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x2x?x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}) -> tensor<1x2x?x8xf32> {
  %h = ad.embedding %w, %input_ids : (tensor<16x8xf32>, tensor<1x?xi64>) -> tensor<1x?x8xf32>
  %z = ad.torch_op "aten.zeros_like.default"(%h) [#ad.ref<0>] {dtype = i64, pin_memory = false} : (tensor<1x?x8xf32>) -> tensor<1x?x8xi64>
  %types = ad.torch_op "aten.select.int"(%z) [#ad.ref<0>, 2 : i64, 0 : i64] {} : (tensor<1x?x8xi64>) -> tensor<1x?xi64>
  %pos = ad.add %types, %position_ids : tensor<1x?xi64>, tensor<1x?xi64> -> tensor<1x?xi64>
  %a = ad.unsqueeze %pos dim 2 : tensor<1x?xi64> -> tensor<1x?x1xi64>
  %b = ad.unsqueeze %pos dim 1 : tensor<1x?xi64> -> tensor<1x1x?xi64>
  %m = ad.le %b, %a : tensor<1x1x?xi64>, tensor<1x?x1xi64> -> tensor<1x?x?xi1>
  %mask = ad.unsqueeze %m dim 1 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %o = ad.attention %q, %k, %v mask %mask scale 0.35355339059327379 : f64 : (tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x1x?x?xi1>) -> tensor<1x2x?x8xf32> loc("git.encoder.layer.0.attention.self")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----

// Doge's dynamic mask: a bias per key and kv head (here an input; Doge computes it from each
// key's value) under HF's mask (True where masked), repeated over the query heads like the key
// and value. The bias becomes one more head dim: the query gets a 1, the key bias / scale, so
// the cache's key is 9 wide; the key and value lose their repeat_kv, the mask is dropped.
// CHECK-LABEL: func.func @key_bias
// CHECK-SAME:  %k_cache{{.*}}: tensor<2x16x1x9xf32> {ad.input = "k_cache_0", ad.cache = "model.layers.0.self_attn key"}
// CHECK-SAME:  %v_cache{{.*}}: tensor<2x16x1x8xf32>
// CHECK:       %[[N:.*]] = ad.sym_size %q dim 2
// CHECK:       %[[ONES:.*]] = ad.full [1, 2, %[[N]], 1], %{{.*}} : f64 -> tensor<1x2x?x1xf32>
// CHECK:       %[[COLUMN:.*]] = ad.unsqueeze %dt dim 3 : tensor<1x1x?xf32> -> tensor<1x1x?x1xf32>
// CHECK:       %[[INVERSE:.*]] = ad.constant 2.8284271247461898 : f64
// CHECK:       %[[BIAS:.*]] = ad.mul %[[COLUMN]], %[[INVERSE]]
// CHECK:       %[[Q:.*]] = ad.cat %q, %[[ONES]] dim 3 : (tensor<1x2x?x8xf32>, tensor<1x2x?x1xf32>) -> tensor<1x2x?x9xf32>
// CHECK:       %[[K:.*]] = ad.cat %k, %[[BIAS]] dim 3 : (tensor<1x1x?x8xf32>, tensor<1x1x?x1xf32>) -> tensor<1x1x?x9xf32>
// CHECK-NOT:   ad.expand
// CHECK-NOT:   masked_fill
// CHECK:       ad.cached_attention %[[Q]], %[[K]], %v cache %k_cache{{.*}}, %v_cache{{.*}} block_tables %block_tables cache_starts %cache_starts scale 0.35355339059327379 :
// CHECK-NEXT:  func.return
func.func @key_bias(%ids: tensor<1x?xi64> {ad.input = "input_ids"}, %q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x1x?x8xf32> {ad.input = "k"}, %v: tensor<1x1x?x8xf32> {ad.input = "v"}, %dt: tensor<1x1x?xf32> {ad.input = "dt"}) -> tensor<1x2x?x8xf32> {
  %c0 = ad.constant 0 : i64
  %c1 = ad.constant 1 : i64
  %n = ad.sym_size %ids dim 1 : tensor<1x?xi64>
  %pos = ad.arange %c0, %n, %c1 : i64, index, i64 -> tensor<?xi64>
  %kp = ad.unsqueeze %pos dim 0 : tensor<?xi64> -> tensor<1x?xi64>
  %qp = ad.unsqueeze %pos dim 1 : tensor<?xi64> -> tensor<?x1xi64>
  %later = ad.gt %kp, %qp : tensor<1x?xi64>, tensor<?x1xi64> -> tensor<?x?xi1>
  %du = ad.unsqueeze %dt dim 2 : tensor<1x1x?xf32> -> tensor<1x1x1x?xf32>
  %de = ad.expand %du [-1, -1, %n, -1] : tensor<1x1x1x?xf32> -> tensor<1x1x?x?xf32>
  %filled = ad.torch_op "aten.masked_fill.Scalar"(%de, %later) [#ad.ref<0>, #ad.ref<1>, -3.4028234663852886e+38 : f64] {} : (tensor<1x1x?x?xf32>, tensor<?x?xi1>) -> tensor<1x1x?x?xf32>
  %mu = ad.unsqueeze %filled dim 2 : tensor<1x1x?x?xf32> -> tensor<1x1x1x?x?xf32>
  %me = ad.expand %mu [1, 1, 2, %n, %n] : tensor<1x1x1x?x?xf32> -> tensor<1x1x2x?x?xf32>
  %mask = ad.reshape %me [1, 2, %n, %n] : tensor<1x1x2x?x?xf32> -> tensor<1x2x?x?xf32>
  %ku = ad.unsqueeze %k dim 2 : tensor<1x1x?x8xf32> -> tensor<1x1x1x?x8xf32>
  %ke = ad.expand %ku [1, 1, 2, %n, 8] : tensor<1x1x1x?x8xf32> -> tensor<1x1x2x?x8xf32>
  %kr = ad.reshape %ke [1, 2, %n, 8] : tensor<1x1x2x?x8xf32> -> tensor<1x2x?x8xf32>
  %vu = ad.unsqueeze %v dim 2 : tensor<1x1x?x8xf32> -> tensor<1x1x1x?x8xf32>
  %ve = ad.expand %vu [1, 1, 2, %n, 8] : tensor<1x1x1x?x8xf32> -> tensor<1x1x2x?x8xf32>
  %vr = ad.reshape %ve [1, 2, %n, 8] : tensor<1x1x2x?x8xf32> -> tensor<1x2x?x8xf32>
  %o = ad.attention %q, %kr, %vr mask %mask scale 0.35355339059327379 : f64 : (tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x2x?x?xf32>) -> tensor<1x2x?x8xf32> loc("model.layers.0.self_attn")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----

// A decoder that counts its positions itself (BART's learned positions: the table indexed by
// arange(seq) + 2, no position_ids input): the range becomes each row's cache start + 0..seq-1,
// flattened to [batch * seq] so that the offset and the lookup keep their types; where the
// looked-up rows meet the token embeddings [batch, seq, 8], they are viewed as [batch, seq, 8].
// CHECK-LABEL: func.func @positions_counted
// CHECK:       %[[RANGE:.*]] = ad.arange %c0, %n, %c1
// CHECK-NEXT:  %[[COL:.*]] = ad.unsqueeze %cache_starts dim 1 : tensor<?xi64> -> tensor<?x1xi64>
// CHECK-NEXT:  %[[ROW:.*]] = ad.unsqueeze %[[RANGE]] dim 0 : tensor<?xi64> -> tensor<1x?xi64>
// CHECK-NEXT:  %[[GRID:.*]] = ad.add %[[COL]], %[[ROW]] : tensor<?x1xi64>, tensor<1x?xi64> -> tensor<?x?xi64>
// CHECK-NEXT:  %positions = ad.reshape %[[GRID]] [-1] : tensor<?x?xi64> -> tensor<?xi64>
// CHECK-NEXT:  %[[B:.*]] = ad.sym_size %ids dim 0 : tensor<?x?xi64>
// CHECK-NEXT:  %u = ad.unsqueeze %positions dim 0 : tensor<?xi64> -> tensor<1x?xi64>
// CHECK-NEXT:  %shifted = ad.add %u, %c2 : tensor<1x?xi64>, i64 -> tensor<1x?xi64>
// CHECK-NEXT:  %e = ad.embedding %table, %shifted : (tensor<66x8xf32>, tensor<1x?xi64>) -> tensor<1x?x8xf32>
// CHECK-NEXT:  %[[ROWS:.*]] = ad.reshape %e [%[[B]], %n, 8] : tensor<1x?x8xf32> -> tensor<?x?x8xf32>
// CHECK-NEXT:  %x = ad.add %tokens, %[[ROWS]] : tensor<?x?x8xf32>, tensor<?x?x8xf32> -> tensor<?x?x8xf32>
// CHECK:       ad.cached_attention %q, %k, %v
func.func @positions_counted(%ids: tensor<?x?xi64> {ad.input = "input_ids"}, %wte: tensor<32x8xf32> {ad.param = "model.embed_tokens.weight"}, %table: tensor<66x8xf32> {ad.param = "model.embed_positions.weight"}, %q: tensor<?x2x?x8xf32> {ad.input = "q"}, %k: tensor<?x2x?x8xf32> {ad.input = "k"}, %v: tensor<?x2x?x8xf32> {ad.input = "v"}) -> (tensor<?x?x8xf32>, tensor<?x2x?x8xf32>) {
  %tokens = ad.embedding %wte, %ids : (tensor<32x8xf32>, tensor<?x?xi64>) -> tensor<?x?x8xf32>
  %c0 = ad.constant 0 : i64
  %c1 = ad.constant 1 : i64
  %c2 = ad.constant 2 : i64
  %n = ad.sym_size %ids dim 1 : tensor<?x?xi64>
  %pos = ad.arange %c0, %n, %c1 : i64, index, i64 -> tensor<?xi64> loc("model.embed_positions")
  %u = ad.unsqueeze %pos dim 0 : tensor<?xi64> -> tensor<1x?xi64>
  %shifted = ad.add %u, %c2 : tensor<1x?xi64>, i64 -> tensor<1x?xi64>
  %e = ad.embedding %table, %shifted : (tensor<66x8xf32>, tensor<1x?xi64>) -> tensor<1x?x8xf32>
  %x = ad.add %tokens, %e : tensor<?x?x8xf32>, tensor<1x?x8xf32> -> tensor<?x?x8xf32>
  %o = ad.attention %q, %k, %v causal : (tensor<?x2x?x8xf32>, tensor<?x2x?x8xf32>, tensor<?x2x?x8xf32>) -> tensor<?x2x?x8xf32> loc("model.layers.0.self_attn")
  func.return %x, %o : tensor<?x?x8xf32>, tensor<?x2x?x8xf32>
}

// -----

// TrOCR's spelling: the range expanded over the batch before the offset and the lookup. The
// positions are viewed as [batch, seq] at the expand, which then keeps them as they are.
// CHECK-LABEL: func.func @positions_expanded
// CHECK:       %positions = ad.reshape %{{.*}} [-1] : tensor<?x?xi64> -> tensor<?xi64>
// CHECK-NEXT:  %[[B:.*]] = ad.sym_size %ids dim 0 : tensor<?x?xi64>
// CHECK-NEXT:  %[[ROWS:.*]] = ad.reshape %positions [%[[B]], %n] : tensor<?xi64> -> tensor<?x?xi64>
// CHECK-NEXT:  %wide = ad.expand %[[ROWS]] [%b, -1] : tensor<?x?xi64> -> tensor<?x?xi64>
// CHECK-NEXT:  %shifted = ad.add %wide, %c2
// CHECK-NEXT:  %e = ad.embedding %table, %shifted : (tensor<66x8xf32>, tensor<?x?xi64>) -> tensor<?x?x8xf32>
func.func @positions_expanded(%ids: tensor<?x?xi64> {ad.input = "input_ids"}, %table: tensor<66x8xf32> {ad.param = "model.embed_positions.weight"}, %q: tensor<?x2x?x8xf32> {ad.input = "q"}, %k: tensor<?x2x?x8xf32> {ad.input = "k"}, %v: tensor<?x2x?x8xf32> {ad.input = "v"}) -> (tensor<?x?x8xf32>, tensor<?x2x?x8xf32>) {
  %c0 = ad.constant 0 : i64
  %c1 = ad.constant 1 : i64
  %c2 = ad.constant 2 : i64
  %b = ad.sym_size %ids dim 0 : tensor<?x?xi64>
  %n = ad.sym_size %ids dim 1 : tensor<?x?xi64>
  %pos = ad.arange %c0, %n, %c1 : i64, index, i64 -> tensor<?xi64> loc("model.embed_positions")
  %wide = ad.expand %pos [%b, -1] : tensor<?xi64> -> tensor<?x?xi64>
  %shifted = ad.add %wide, %c2 : tensor<?x?xi64>, i64 -> tensor<?x?xi64>
  %e = ad.embedding %table, %shifted : (tensor<66x8xf32>, tensor<?x?xi64>) -> tensor<?x?x8xf32>
  %o = ad.attention %q, %k, %v causal : (tensor<?x2x?x8xf32>, tensor<?x2x?x8xf32>, tensor<?x2x?x8xf32>) -> tensor<?x2x?x8xf32> loc("model.layers.0.self_attn")
  func.return %e, %o : tensor<?x?x8xf32>, tensor<?x2x?x8xf32>
}

// -----

// Inkling's relative bias through SDPA (transformers' where(mask, bias, lowest)): per-token
// logits [1, 2, seq, 3] gathered by the query-key distance clamped to 0..2, 0 outside 0..2.
// One ad.cached_attention that reads the logits as its distance_bias; the gather, the masks and
// the positions are gone.
// CHECK-LABEL: func.func @distance_bias
// CHECK-NOT:   ad.torch_op
// CHECK-NOT:   ad.where
// CHECK:       ad.cached_attention %q, %k, %v cache %k_cache{{.*}}, %v_cache{{.*}} block_tables %block_tables cache_starts %cache_starts scale 1.250000e-01 distance_bias %logits : tensor<1x2x?x3xf32> : (tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<1x2x?x8xf32>
// CHECK-NEXT:  func.return
func.func @distance_bias(%ids: tensor<1x?xi64> {ad.input = "input_ids"}, %q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x2x?x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}, %logits: tensor<1x2x?x3xf32> {ad.input = "logits"}) -> tensor<1x2x?x8xf32> {
  %c0 = ad.constant 0 : i64
  %c1 = ad.constant 1 : i64
  %c3 = ad.constant 3 : i64
  %n = ad.sym_size %ids dim 1 : tensor<1x?xi64>
  %pos = ad.arange %c0, %n, %c1 : i64, index, i64 -> tensor<?xi64>
  %qp = ad.unsqueeze %pos dim 1 : tensor<?xi64> -> tensor<?x1xi64>
  %kp = ad.unsqueeze %pos dim 0 : tensor<?xi64> -> tensor<1x?xi64>
  %d2 = ad.sub %qp, %kp : tensor<?x1xi64>, tensor<1x?xi64> -> tensor<?x?xi64>
  %d3 = ad.unsqueeze %d2 dim 0 : tensor<?x?xi64> -> tensor<1x?x?xi64>
  %d = ad.unsqueeze %d3 dim 1 : tensor<1x?x?xi64> -> tensor<1x1x?x?xi64>
  %clamped = ad.torch_op "aten.clamp.default"(%d) [#ad.ref<0>, 0 : i64, 2 : i64] {} : (tensor<1x1x?x?xi64>) -> tensor<1x1x?x?xi64>
  %index = ad.expand %clamped [1, 2, -1, -1] : tensor<1x1x?x?xi64> -> tensor<1x2x?x?xi64>
  %gathered = ad.torch_op "aten.gather.default"(%logits, %index) [#ad.ref<0>, -1 : i64, #ad.ref<1>] {} : (tensor<1x2x?x3xf32>, tensor<1x2x?x?xi64>) -> tensor<1x2x?x?xf32>
  %ahead = ad.lt %d, %c0 : tensor<1x1x?x?xi64>, i64 -> tensor<1x1x?x?xi1>
  %far = ad.ge %d, %c3 : tensor<1x1x?x?xi64>, i64 -> tensor<1x1x?x?xi1>
  %outside = ad.bitwise_or %ahead, %far : tensor<1x1x?x?xi1>, tensor<1x1x?x?xi1> -> tensor<1x1x?x?xi1>
  %bias = ad.torch_op "aten.masked_fill.Scalar"(%gathered, %outside) [#ad.ref<0>, #ad.ref<1>, 0.000000e+00 : f64] {} : (tensor<1x2x?x?xf32>, tensor<1x1x?x?xi1>) -> tensor<1x2x?x?xf32>
  %causal = ad.le %kp, %qp : tensor<1x?xi64>, tensor<?x1xi64> -> tensor<?x?xi1>
  %lowest = ad.constant -3.4028234663852886e+38 : f64
  %mask = ad.where %causal, %bias, %lowest : tensor<?x?xi1>, tensor<1x2x?x?xf32>, f64 -> tensor<1x2x?x?xf32>
  %o = ad.attention %q, %k, %v mask %mask scale 1.250000e-01 : f64 : (tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x2x?x?xf32>) -> tensor<1x2x?x8xf32> loc("model.layers.0.self_attn")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----

// ZAYA's CCA projection: a left pad of 2 zero tokens read by two stacked valid convolutions
// (kernels 2 and 2: they look back 1 + 1 = 2 tokens) becomes ad.cached_token_window over a
// state of the 2 inputs before a step, [slots, channels, 2], which the convolutions read as they
// read the pad; its values shifted by one token (cat([start, h])[:, :-1], the start computed from
// no token) become a window of 1 token that starts a sequence with the start row, cut to its
// first seq rows.
// CHECK-LABEL: func.func @token_windows
// CHECK-SAME:  %token_window: tensor<2x8x2xf32> {ad.input = "token_window_0", ad.cache = "model.layers.0.qkv_proj token_window"}, %token_window_1: tensor<2x1x4xf32> {ad.input = "token_window_1", ad.cache = "model.layers.0.qkv_proj token_window"})
// CHECK-NOT:   aten.pad
// CHECK:       %window = ad.cached_token_window %x state %token_window slots %cache_slots starts %cache_starts dim 2 : (tensor<?x8x?xf32>, tensor<2x8x2xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<?x8x?xf32>
// CHECK-NEXT:  %c1 = ad.torch_op "aten.conv1d.default"(%window, %w1)
// CHECK-NEXT:  %c2 = ad.torch_op "aten.conv1d.default"(%c1, %w2)
// CHECK:       %start = ad.linear %zeros, %wd
// CHECK-NEXT:  %window_1 = ad.cached_token_window %h initial %start state %token_window_1 slots %cache_slots starts %cache_starts dim 1 : (tensor<?x?x4xf32>, tensor<2x1x4xf32>, tensor<?xi64>, tensor<?xi64>, tensor<?x1x4xf32>) -> tensor<?x?x4xf32>
// CHECK-NEXT:  %tokens = ad.sym_size %h dim 1
// CHECK-NEXT:  %shift = ad.slice %window_1 dim 1 [0, %tokens, 1]
// CHECK-NEXT:  func.return %c2, %shift
func.func @token_windows(%x: tensor<?x8x?xf32> {ad.input = "x"}, %w1: tensor<8x1x2xf32> {ad.param = "model.layers.0.qkv_proj.conv_qk_depthwise.weight"}, %w2: tensor<8x4x2xf32> {ad.param = "model.layers.0.qkv_proj.conv_qk_grouped.weight"}, %h: tensor<?x?x4xf32> {ad.input = "h"}, %wd: tensor<4x4xf32> {ad.param = "model.layers.0.qkv_proj.v_proj_delayed.weight"}) -> (tensor<?x8x?xf32>, tensor<?x?x4xf32>) {
  %pad = ad.torch_op "aten.pad.default"(%x) [#ad.ref<0>, [2 : i64, 0 : i64]] {} : (tensor<?x8x?xf32>) -> tensor<?x8x?xf32> loc("model.layers.0.qkv_proj")
  %c1 = ad.torch_op "aten.conv1d.default"(%pad, %w1) [#ad.ref<0>, #ad.ref<1>, none, [1 : i64], [0 : i64], [1 : i64], 8 : i64] {} : (tensor<?x8x?xf32>, tensor<8x1x2xf32>) -> tensor<?x8x?xf32> loc("model.layers.0.qkv_proj.conv_qk_depthwise")
  %c2 = ad.torch_op "aten.conv1d.default"(%c1, %w2) [#ad.ref<0>, #ad.ref<1>, none, [1 : i64], [0 : i64], [1 : i64], 2 : i64] {} : (tensor<?x8x?xf32>, tensor<8x4x2xf32>) -> tensor<?x8x?xf32> loc("model.layers.0.qkv_proj.conv_qk_grouped")
  %b = ad.sym_size %h dim 0 : tensor<?x?x4xf32>
  %zeros = ad.torch_op "aten.new_zeros.default"(%h, %b) [#ad.ref<0>, [#ad.ref<1>, 1 : i64, 4 : i64]] {pin_memory = false} : (tensor<?x?x4xf32>, index) -> tensor<?x1x4xf32>
  %start = ad.linear %zeros, %wd : (tensor<?x1x4xf32>, tensor<4x4xf32>) -> tensor<?x1x4xf32>
  %cat = ad.cat %start, %h dim 1 : (tensor<?x1x4xf32>, tensor<?x?x4xf32>) -> tensor<?x?x4xf32> loc("model.layers.0.qkv_proj")
  %shift = ad.slice %cat dim 1 [0, -1, 1] : tensor<?x?x4xf32> -> tensor<?x?x4xf32> loc("model.layers.0.qkv_proj")
  func.return %c2, %shift : tensor<?x8x?xf32>, tensor<?x?x4xf32>
}

// -----

// Inkling2's dynamic short convolution (kernel 4): F.pad(x, (3, 0)) cut to its last seq + 3 rows
// (-(seq + 4 - 1), seq counted from the input ids), unfold(-1, 4, 1) (window t: token t and the
// 3 before it), then a flip of the unfolded taps' axis. The pad becomes ad.cached_token_window of
// 3 rows, which the unfold reads; the cut, which keeps all the window's rows, goes; the flip of a
// static axis stays.
// CHECK-LABEL: func.func @unfolded_token_window
// CHECK-SAME:  %token_window: tensor<2x8x3xf32> {ad.input = "token_window_0", ad.cache = "model.layers.1.self_attn.k_proj.sconv token_window"})
// CHECK-NOT:   aten.pad
// CHECK:       %window = ad.cached_token_window %x state %token_window slots %cache_slots starts %cache_starts dim 2 : (tensor<?x8x?xf32>, tensor<2x8x3xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<?x8x?xf32>
// CHECK-NOT:   ad.slice
// CHECK:       %unfold = ad.torch_op "aten.unfold.default"(%window) [#ad.ref<0>, -1 : i64, 4 : i64, 1 : i64]
// CHECK-NEXT:  %flip = ad.torch_op "aten.flip.default"(%unfold)
// CHECK-NEXT:  func.return %flip
func.func @unfolded_token_window(%ids: tensor<?x?xi64> {ad.input = "input_ids"}, %x: tensor<?x8x?xf32> {ad.input = "x"}) -> tensor<?x8x?x4xf32> {
  %n = ad.sym_size %ids dim 1 : tensor<?x?xi64>
  %pad = ad.torch_op "aten.pad.default"(%x) [#ad.ref<0>, [3 : i64, 0 : i64]] {} : (tensor<?x8x?xf32>) -> tensor<?x8x?xf32> loc("model.layers.1.self_attn.k_proj.sconv")
  %add = ad.torch_op "_operator.add"(%n) [#ad.ref<0>, 4 : i64] {} : (index) -> index
  %sub = ad.torch_op "_operator.sub"(%add) [#ad.ref<0>, 1 : i64] {} : (index) -> index
  %neg = ad.torch_op "_operator.neg"(%sub) [#ad.ref<0>] {} : (index) -> index
  %cut = ad.slice %pad dim 2 [%neg, 9223372036854775807, 1] : tensor<?x8x?xf32> -> tensor<?x8x?xf32> loc("model.layers.1.self_attn.k_proj.sconv")
  %unfold = ad.torch_op "aten.unfold.default"(%cut) [#ad.ref<0>, -1 : i64, 4 : i64, 1 : i64] {} : (tensor<?x8x?xf32>) -> tensor<?x8x?x4xf32> loc("model.layers.1.self_attn.k_proj.sconv")
  %flip = ad.torch_op "aten.flip.default"(%unfold) [#ad.ref<0>, [-1 : i64]] {} : (tensor<?x8x?x4xf32>) -> tensor<?x8x?x4xf32> loc("model.layers.1.self_attn.k_proj.sconv")
  func.return %flip : tensor<?x8x?x4xf32>
}

// -----

// Inkling's log scaling: the query times tau of its position, 1 + log(max((arange(seq) + 1) / 2,
// 1)) viewed as [1, 1, seq, 1]. The range takes each row's real positions (cache start + 0..seq-1,
// flattened), and where tau meets the [batch, heads, seq, head_dim] query it is viewed as
// [batch, 1, seq, 1].
// CHECK-LABEL: func.func @log_scaled_query
// CHECK:       %positions = ad.reshape %{{.*}} [-1] : tensor<?x?xi64> -> tensor<?xi64>
// CHECK:       ad.cast %{{.*}} : tensor<?xi64> -> tensor<?xf32>
// CHECK:       %[[TAU:.*]] = ad.reshape %{{.*}} [1, 1, -1, 1] : tensor<?xf32> -> tensor<1x1x?x1xf32>
// CHECK:       %[[ROWS:.*]] = ad.reshape %[[TAU]] [%{{.*}}, 1, %{{.*}}, 1] : tensor<1x1x?x1xf32> -> tensor<?x1x?x1xf32>
// CHECK-NEXT:  %{{.*}} = ad.mul %q, %[[ROWS]] : tensor<?x2x?x8xf32>, tensor<?x1x?x1xf32> -> tensor<?x2x?x8xf32>
func.func @log_scaled_query(%ids: tensor<?x?xi64> {ad.input = "input_ids"}, %q: tensor<?x2x?x8xf32> {ad.input = "q"}, %k: tensor<?x2x?x8xf32> {ad.input = "k"}, %v: tensor<?x2x?x8xf32> {ad.input = "v"}) -> tensor<?x2x?x8xf32> {
  %c0 = ad.constant 0 : i64
  %c1 = ad.constant 1 : i64
  %n = ad.sym_size %ids dim 1 : tensor<?x?xi64>
  %pos = ad.arange %c0, %n, %c1 : i64, index, i64 -> tensor<?xi64>
  %next = ad.add %pos, %c1 : tensor<?xi64>, i64 -> tensor<?xi64>
  %f = ad.cast %next : tensor<?xi64> -> tensor<?xf32>
  %two = ad.constant 2.000000e+00 : f64
  %ratio = ad.div %f, %two : tensor<?xf32>, f64 -> tensor<?xf32>
  %floor = ad.torch_op "aten.clamp.default"(%ratio) [#ad.ref<0>, 1.000000e+00 : f64] {} : (tensor<?xf32>) -> tensor<?xf32>
  %log = ad.log %floor : tensor<?xf32> -> tensor<?xf32>
  %one = ad.constant 1.000000e+00 : f64
  %t = ad.add %log, %one : tensor<?xf32>, f64 -> tensor<?xf32>
  %tau = ad.reshape %t [1, 1, -1, 1] : tensor<?xf32> -> tensor<1x1x?x1xf32>
  %qs = ad.mul %q, %tau : tensor<?x2x?x8xf32>, tensor<1x1x?x1xf32> -> tensor<?x2x?x8xf32>
  %o = ad.attention %qs, %k, %v causal : (tensor<?x2x?x8xf32>, tensor<?x2x?x8xf32>, tensor<?x2x?x8xf32>) -> tensor<?x2x?x8xf32> loc("model.layers.0.self_attn")
  func.return %o : tensor<?x2x?x8xf32>
}

// -----

// DeepSeek-V4's CSA overlap at compress rate 1: its gates shifted by one token after a -inf row
// (cat([new_full(-inf), g], 1)[:, :-1]), a window of 1 token whose initial row is that -inf row,
// kept as it is (the window selects it for a new sequence, it does not mix it with the state).
// CHECK-LABEL: func.func @gate_shift
// CHECK-SAME:  %token_window: tensor<2x1x1x8xf32> {ad.input = "token_window_0", ad.cache = "model.layers.0.self_attn.compressor token_window"}
// CHECK:       %fill = ad.torch_op "aten.new_full.default"(%g, %b) [#ad.ref<0>, [#ad.ref<1>, 1 : i64, 1 : i64, 8 : i64], 0xfff0000000000000 : f64]
// CHECK-NEXT:  %window = ad.cached_token_window %g initial %fill state %token_window slots %cache_slots starts %cache_starts dim 1 : (tensor<?x?x1x8xf32>, tensor<2x1x1x8xf32>, tensor<?xi64>, tensor<?xi64>, tensor<?x1x1x8xf32>) -> tensor<?x?x1x8xf32>
// CHECK-NEXT:  %tokens = ad.sym_size %g dim 1
// CHECK-NEXT:  %prev = ad.slice %window dim 1 [0, %tokens, 1]
// CHECK-NEXT:  func.return %prev
func.func @gate_shift(%g: tensor<?x?x1x8xf32> {ad.input = "g"}) -> tensor<?x?x1x8xf32> {
  %b = ad.sym_size %g dim 0 : tensor<?x?x1x8xf32>
  %fill = ad.torch_op "aten.new_full.default"(%g, %b) [#ad.ref<0>, [#ad.ref<1>, 1 : i64, 1 : i64, 8 : i64], 0xFFF0000000000000 : f64] {pin_memory = false} : (tensor<?x?x1x8xf32>, index) -> tensor<?x1x1x8xf32>
  %cat = ad.cat %fill, %g dim 1 : (tensor<?x1x1x8xf32>, tensor<?x?x1x8xf32>) -> tensor<?x?x1x8xf32> loc("model.layers.0.self_attn.compressor")
  %prev = ad.slice %cat dim 1 [0, -1, 1] : tensor<?x?x1x8xf32> -> tensor<?x?x1x8xf32>
  func.return %prev : tensor<?x?x1x8xf32>
}

// -----

// XLM's eager attention: its query divided by sqrt(head_dim) before the matmul, its causal mask
// (the range repeated over the rows, <= the range as a column) inverted by `== 0`, viewed as
// [batch, 1, seq, keys], broadcast by `expand_as` of the scores (which reads their shape alone)
// and applied by the in-place `masked_fill_` with the lowest float. One ad.cached_attention on
// the divided query (scale 1); the mask, its expand_as and the in-place fill are gone.
// CHECK-LABEL: func.func @xlm_masked_fill_in_place
// CHECK:       %div = ad.div %q, %root
// CHECK-NOT:   ad.torch_op
// CHECK-NOT:   ad.softmax
// CHECK:       ad.cached_attention %div, %k, %v cache %k_cache{{.*}}, %v_cache{{.*}} block_tables %block_tables cache_starts %cache_starts scale 1.000000e+00 : (tensor<?x2x?x8xf32>, tensor<?x2x?x8xf32>, tensor<?x2x?x8xf32>, tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x2x?x8xf32>
// CHECK-NEXT:  func.return
func.func @xlm_masked_fill_in_place(%ids: tensor<?x?xi64> {ad.input = "input_ids"}, %q: tensor<?x2x?x8xf32> {ad.input = "q"}, %k: tensor<?x2x?x8xf32> {ad.input = "k"}, %v: tensor<?x2x?x8xf32> {ad.input = "v"}) -> tensor<?x2x?x8xf32> {
  %bs = ad.sym_size %ids dim 0 : tensor<?x?xi64>
  %n = ad.sym_size %ids dim 1 : tensor<?x?xi64>
  %c0 = ad.constant 0 : i64
  %c1 = ad.constant 1 : i64
  %pos = ad.arange %c0, %n, %c1 : i64, index, i64 -> tensor<?xi64>
  %row = ad.unsqueeze %pos dim 0 : tensor<?xi64> -> tensor<1x?xi64>
  %row3 = ad.unsqueeze %row dim 1 : tensor<1x?xi64> -> tensor<1x1x?xi64>
  %keys = ad.torch_op "aten.repeat.default"(%row3, %bs, %n) [#ad.ref<0>, [#ad.ref<1>, #ad.ref<2>, 1 : i64]] {} : (tensor<1x1x?xi64>, index, index) -> tensor<?x?x?xi64>
  %col = ad.unsqueeze %row dim 2 : tensor<1x?xi64> -> tensor<1x?x1xi64>
  %causal = ad.le %keys, %col : tensor<?x?x?xi64>, tensor<1x?x1xi64> -> tensor<?x?x?xi1>
  %root = ad.constant 2.8284271247461903 : f64
  %div = ad.div %q, %root : tensor<?x2x?x8xf32>, f64 -> tensor<?x2x?x8xf32>
  %kt = ad.transpose %k 2, 3 : tensor<?x2x?x8xf32> -> tensor<?x2x8x?xf32>
  %s = ad.matmul %div, %kt : (tensor<?x2x?x8xf32>, tensor<?x2x8x?xf32>) -> tensor<?x2x?x?xf32>
  %masked_out = ad.eq %causal, %c0 : tensor<?x?x?xi1>, i64 -> tensor<?x?x?xi1>
  %m = ad.reshape %masked_out [%bs, 1, %n, -1] : tensor<?x?x?xi1> -> tensor<?x1x?x?xi1>
  %mx = ad.torch_op "aten.expand_as.default"(%m, %s) [#ad.ref<0>, #ad.ref<1>] {} : (tensor<?x1x?x?xi1>, tensor<?x2x?x?xf32>) -> tensor<?x2x?x?xi1>
  %masked = ad.torch_op "aten.masked_fill_.Scalar"(%s, %mx) [#ad.ref<0>, #ad.ref<1>, -3.4028234663852886e+38 : f64] {} : (tensor<?x2x?x?xf32>, tensor<?x2x?x?xi1>) -> tensor<?x2x?x?xf32>
  %p = ad.softmax %masked dim -1 : tensor<?x2x?x?xf32> -> tensor<?x2x?x?xf32>
  %o = ad.matmul %p, %v : (tensor<?x2x?x?xf32>, tensor<?x2x?x8xf32>) -> tensor<?x2x?x8xf32> loc("transformer.attentions.0")
  func.return %o : tensor<?x2x?x8xf32>
}

// -----

// CPM-Ant's eager attention (were its mask causal): the scores masked by masked_fill with a 0-d
// tensor fill (`torch.scalar_tensor(-inf)`), and the probabilities zeroed again after the
// softmax under the same mask (`masked_fill(p, mask, scalar_tensor(0))`). One ad.cached_attention;
// both fills, their scalar tensors and the mask are gone.
// CHECK-LABEL: func.func @zeroed_after_softmax
// CHECK-NOT:   ad.torch_op
// CHECK-NOT:   ad.softmax
// CHECK:       ad.cached_attention %q, %k, %v cache %k_cache{{.*}}, %v_cache{{.*}} block_tables %block_tables cache_starts %cache_starts scale 0.35355339059327373 : (tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<1x2x?x8xf32>
// CHECK-NEXT:  func.return
func.func @zeroed_after_softmax(%position_ids: tensor<1x?xi64> {ad.input = "position_ids"}, %q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x2x?x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}) -> tensor<1x2x?x8xf32> {
  %a = ad.unsqueeze %position_ids dim 2 : tensor<1x?xi64> -> tensor<1x?x1xi64>
  %b = ad.unsqueeze %position_ids dim 1 : tensor<1x?xi64> -> tensor<1x1x?xi64>
  %later = ad.gt %b, %a : tensor<1x1x?xi64>, tensor<1x?x1xi64> -> tensor<1x?x?xi1>
  %m = ad.unsqueeze %later dim 1 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %kt = ad.transpose %k 2, 3 : tensor<1x2x?x8xf32> -> tensor<1x2x8x?xf32>
  %s = ad.matmul %q, %kt : (tensor<1x2x?x8xf32>, tensor<1x2x8x?xf32>) -> tensor<1x2x?x?xf32>
  %root = ad.constant 2.8284271247461903 : f64
  %scaled = ad.div %s, %root : tensor<1x2x?x?xf32>, f64 -> tensor<1x2x?x?xf32>
  %ninf = ad.torch_op "aten.scalar_tensor.default"() [0xFFF0000000000000 : f64] {dtype = f32} : () -> tensor<f32>
  %masked = ad.torch_op "aten.masked_fill.Tensor"(%scaled, %m, %ninf) [#ad.ref<0>, #ad.ref<1>, #ad.ref<2>] {} : (tensor<1x2x?x?xf32>, tensor<1x1x?x?xi1>, tensor<f32>) -> tensor<1x2x?x?xf32>
  %p = ad.softmax %masked dim -1 : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32>
  %zero = ad.torch_op "aten.scalar_tensor.default"() [0 : i64] {dtype = f32} : () -> tensor<f32>
  %pz = ad.torch_op "aten.masked_fill.Tensor"(%p, %m, %zero) [#ad.ref<0>, #ad.ref<1>, #ad.ref<2>] {} : (tensor<1x2x?x?xf32>, tensor<1x1x?x?xi1>, tensor<f32>) -> tensor<1x2x?x?xf32>
  %o = ad.matmul %pz, %v : (tensor<1x2x?x?xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x8xf32> loc("cpmant.encoder.layers.0.self_att.self_attention")
  func.return %o : tensor<1x2x?x8xf32>
}
