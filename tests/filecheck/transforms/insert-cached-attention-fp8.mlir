// insert-cached-attention{kv-cache-dtype=fp8}: attention's K/V caches are f8E4M3FN (half the
// bytes of bf16's), the cached op quantizing with per-tensor scales of 1.0 (vLLM's default), in
// the slot form and the paged one; `fp8_e4m3` is the same; the per-sequence states keep their
// dtype; MLA's latent cache is refused by name, as is a dtype the pass does not know.
// RUN: ad-opt %s --split-input-file --verify-diagnostics -p 'insert-cached-attention{max-batch=2 max-seq-len=16 kv-cache-dtype=fp8}' | filecheck %s
// RUN: ad-opt %s --split-input-file --verify-diagnostics -p 'insert-cached-attention{max-seq-len=64 paged=true page-size=16 num-pages=8 kv-cache-dtype=fp8_e4m3}' | filecheck %s --check-prefix=PAGED
// RUN: ad-opt %s --split-input-file -p 'insert-cached-attention{max-batch=2 max-seq-len=16}' | filecheck %s --check-prefix=AUTO
// RUN: not ad-opt %s -p 'insert-cached-attention{kv-cache-dtype=int8}' 2>&1 | filecheck %s --check-prefix=UNKNOWN

// UNKNOWN: {{^}}error: insert-cached-attention: kv-cache-dtype 'int8' is none of auto, fp8, fp8_e4m3{{$}}

// CHECK-LABEL: func.func @causal
// CHECK-SAME:  %k_cache{{.*}}: tensor<2x16x1x8xf8E4M3FN> {ad.input = "k_cache_0", ad.cache = "model.layers.0.self_attn key"}
// CHECK-SAME:  %v_cache{{.*}}: tensor<2x16x1x8xf8E4M3FN> {ad.input = "v_cache_0", ad.cache = "model.layers.0.self_attn value"}
// CHECK:       %[[O:.*]] = ad.cached_attention %q, %k, %v rope %cos, %sin cache %k_cache{{.*}}, %v_cache{{.*}} kv_scales 1.000000e+00, 1.000000e+00 block_tables %block_tables cache_starts %cache_starts scale 0.35355339059327379 : (tensor<1x2x?x8xbf16>, tensor<1x1x?x8xbf16>, tensor<1x1x?x8xbf16>, tensor<2x16x1x8xf8E4M3FN>, tensor<2x16x1x8xf8E4M3FN>, tensor<?x1xi64>, tensor<?xi64>, tensor<1x?x8xbf16>, tensor<1x?x8xbf16>) -> tensor<1x2x?x8xbf16>
// CHECK-NEXT:  func.return %[[O]]

// PAGED-LABEL: func.func @causal
// PAGED-SAME:  %k_pages{{.*}}: tensor<8x16x1x8xf8E4M3FN> {ad.input = "k_pages_0", ad.cache = "model.layers.0.self_attn key"}
// PAGED-SAME:  %v_pages{{.*}}: tensor<8x16x1x8xf8E4M3FN> {ad.input = "v_pages_0", ad.cache = "model.layers.0.self_attn value"}
// PAGED:       ad.cached_attention %q, %k, %v rope %cos, %sin cache %k_pages{{.*}}, %v_pages{{.*}} kv_scales 1.000000e+00, 1.000000e+00 block_tables %block_tables cache_starts %cache_starts query_starts %query_starts : tensor<?xi64> scale 0.35355339059327379 : (tensor<1x2x?x8xbf16>, tensor<1x1x?x8xbf16>, tensor<1x1x?x8xbf16>, tensor<8x16x1x8xf8E4M3FN>, tensor<8x16x1x8xf8E4M3FN>,

// Without the option: pools of the key's dtype, no scales.
// AUTO-LABEL: func.func @causal
// AUTO-SAME:  %k_cache{{.*}}: tensor<2x16x1x8xbf16>
// AUTO-NOT:   kv_scales
// AUTO:       ad.cached_attention %q, %k, %v rope %cos, %sin cache %k_cache{{.*}}, %v_cache{{.*}} block_tables
func.func @causal(%q: tensor<1x2x?x8xbf16> {ad.input = "q"}, %k: tensor<1x1x?x8xbf16> {ad.input = "k"}, %v: tensor<1x1x?x8xbf16> {ad.input = "v"}, %freq: tensor<8xf32> {ad.buffer = "model.rotary_emb.inv_freq"}, %position_ids: tensor<1x?xi64> {ad.input = "position_ids"}) -> tensor<1x2x?x8xbf16> {
  %pu = ad.unsqueeze %position_ids dim 2 : tensor<1x?xi64> -> tensor<1x?x1xi64>
  %pf = ad.cast %pu : tensor<1x?x1xi64> -> tensor<1x?x1xf32>
  %angle = ad.mul %pf, %freq : tensor<1x?x1xf32>, tensor<8xf32> -> tensor<1x?x8xf32>
  %cosf = ad.cos %angle : tensor<1x?x8xf32> -> tensor<1x?x8xf32>
  %sinf = ad.sin %angle : tensor<1x?x8xf32> -> tensor<1x?x8xf32>
  %cos = ad.cast %cosf : tensor<1x?x8xf32> -> tensor<1x?x8xbf16>
  %sin = ad.cast %sinf : tensor<1x?x8xf32> -> tensor<1x?x8xbf16>
  %o = ad.rope_attention %q, %k, %v rope %cos, %sin causal scale 0.35355339059327379 : (tensor<1x2x?x8xbf16>, tensor<1x1x?x8xbf16>, tensor<1x1x?x8xbf16>, tensor<1x?x8xbf16>, tensor<1x?x8xbf16>) -> tensor<1x2x?x8xbf16> loc("model.layers.0.self_attn")
  func.return %o : tensor<1x2x?x8xbf16>
}

// -----

// MLA caches its latent, which the fp8 cache does not hold: refused, naming the option and the mixer.
// CHECK: {{^}}model.layers.0.self_attn: kv_cache_dtype='fp8' is not supported for MLA (its cache stays in the model's dtype): use kv_cache_dtype='auto'
// PAGED: {{^}}model.layers.0.self_attn: kv_cache_dtype='fp8_e4m3' is not supported for MLA
func.func @mla(%q_nope: tensor<1x2x?x8xf32> {ad.input = "q_nope"}, %q_rot: tensor<1x2x?x4xf32> {ad.input = "q_rot"}, %latent: tensor<1x1x?x16xf32> {ad.input = "latent"}, %k_rot: tensor<1x1x?x4xf32> {ad.input = "k_rot"}, %w: tensor<28x16xf32> {ad.param = "model.layers.0.self_attn.kv_b_proj.weight"}) -> tensor<1x2x?x6xf32> {
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
