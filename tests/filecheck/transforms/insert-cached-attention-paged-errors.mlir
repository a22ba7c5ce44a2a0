// insert-cached-attention{paged=true}: what the paged form cannot hold is an error naming the
// layer (per-sequence states with no attention to page) or the op (logits that do not come from
// a linear LM head).
// RUN: ad-opt %s --split-input-file --verify-diagnostics -p 'insert-cached-attention{max-seq-len=16 paged=true page-size=4 num-pages=8}' | filecheck %s
// RUN: not ad-opt %s -p 'insert-cached-attention{paged=true page-size=12}' 2>&1 | filecheck %s --check-prefix=PAGE

// PAGE: {{^}}error: insert-cached-attention: page-size 12 must be a power of two and num-pages 256 positive{{$}}

// CHECK: model.layers.0.conv: the model keeps states per sequence but has no attention, so the paged form (paged=true) has nothing to page: compile this model in the slot form (paged=false)
func.func @short_conv(%ids: tensor<1x?xi64> {ad.input = "input_ids"}, %x: tensor<1x8x?xf32> {ad.input = "x"}, %w: tensor<8x1x3xf32> {ad.param = "model.layers.0.conv.conv.weight"}, %b: tensor<8xf32> {ad.param = "model.layers.0.conv.conv.bias"}) -> tensor<1x8x?xf32> {
  %seq = ad.sym_size %ids dim 1 : tensor<1x?xi64>
  %c = ad.torch_op "aten.conv1d.default"(%x, %w, %b) [#ad.ref<0>, #ad.ref<1>, #ad.ref<2>, [1 : i64], [2 : i64], [1 : i64], 8 : i64] {} : (tensor<1x8x?xf32>, tensor<8x1x3xf32>, tensor<8xf32>) -> tensor<1x8x?xf32> loc("model.layers.0.conv")
  %s = ad.slice %c dim 2 [0, %seq, 1] : tensor<1x8x?xf32> -> tensor<1x8x?xf32>
  func.return %s : tensor<1x8x?xf32>
}

// -----

// CHECK: the logits (the function's first result, from %t = ad.transpose at model.layers.0.self_attn) do not come from an ad.linear LM head through elementwise ops, nor are they [..., tokens, vocab]
func.func @no_lm_head(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x1x?x8xf32> {ad.input = "k"}, %v: tensor<1x1x?x8xf32> {ad.input = "v"}, %position_ids: tensor<1x?xi64> {ad.input = "position_ids"}) -> tensor<1x?x2x8xf32> {
  %o = ad.attention %q, %k, %v causal : (tensor<1x2x?x8xf32>, tensor<1x1x?x8xf32>, tensor<1x1x?x8xf32>) -> tensor<1x2x?x8xf32> loc("model.layers.0.self_attn")
  %t = ad.transpose %o 1, 2 : tensor<1x2x?x8xf32> -> tensor<1x?x2x8xf32> loc("model.layers.0.self_attn")
  func.return %t : tensor<1x?x2x8xf32>
}

// -----

// CHECK: model.layers.0.self_attn: the paged form takes the step's tokens as one flattened sequence, but the query's batch is 2, not 1
func.func @batched(%q: tensor<2x2x?x8xf32> {ad.input = "q"}, %k: tensor<2x1x?x8xf32> {ad.input = "k"}, %v: tensor<2x1x?x8xf32> {ad.input = "v"}) -> tensor<2x2x?x8xf32> {
  %o = ad.attention %q, %k, %v causal : (tensor<2x2x?x8xf32>, tensor<2x1x?x8xf32>, tensor<2x1x?x8xf32>) -> tensor<2x2x?x8xf32> loc("model.layers.0.self_attn")
  func.return %o : tensor<2x2x?x8xf32>
}

// -----

// CHECK: model.layers.0.mixer: the model keeps states per sequence but has no attention, so the paged form (paged=true) has nothing to page
func.func @mamba2_scan(%x: tensor<?x?x4x16xf32> {ad.input = "x"}, %dt: tensor<?x?x4xf32> {ad.input = "dt"}, %a: tensor<4xf32> {ad.input = "a"}, %b: tensor<?x?x2x8xf32> {ad.input = "b"}, %c: tensor<?x?x2x8xf32> {ad.input = "c"}, %d: tensor<4xf32> {ad.param = "model.layers.0.mixer.D"}, %dt_bias: tensor<4xf32> {ad.param = "model.layers.0.mixer.dt_bias"}) -> tensor<?x?x4x16xf32> {
  %y = ad.torch_op "ad_mlir.mamba2_chunk_scan.default"(%x, %dt, %a, %b, %c, %d, %dt_bias) ["transformers.models.nemotron_h.modeling_nemotron_h", #ad.ref<0>, #ad.ref<1>, #ad.ref<2>, #ad.ref<3>, #ad.ref<4>, 8 : i64, #ad.ref<5>, #ad.ref<6>, true, 1.000000e-03 : f64, 0x7ff0000000000000 : f64] {} : (tensor<?x?x4x16xf32>, tensor<?x?x4xf32>, tensor<4xf32>, tensor<?x?x2x8xf32>, tensor<?x?x2x8xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<?x?x4x16xf32> loc("model.layers.0.mixer")
  func.return %y : tensor<?x?x4x16xf32>
}

// -----

// CHECK: model.layers.0.linear_attn: the model keeps states per sequence but has no attention, so the paged form (paged=true) has nothing to page
func.func @gated_delta_rule(%q: tensor<?x?x2x16xbf16> {ad.input = "q"}, %k: tensor<?x?x2x16xbf16> {ad.input = "k"}, %v: tensor<?x?x4x8xbf16> {ad.input = "v"}, %g: tensor<?x?x4xf32> {ad.input = "g"}, %beta: tensor<?x?x4xbf16> {ad.input = "beta"}) -> tensor<?x?x4x8xbf16> {
  %o = ad.torch_op "ad_mlir.chunk_gated_delta_rule.default"(%q, %k, %v, %g, %beta) ["transformers.models.qwen3_next.modeling_qwen3_next", #ad.ref<0>, #ad.ref<1>, #ad.ref<2>, #ad.ref<3>, #ad.ref<4>, 64 : i64, true] {} : (tensor<?x?x2x16xbf16>, tensor<?x?x2x16xbf16>, tensor<?x?x4x8xbf16>, tensor<?x?x4xf32>, tensor<?x?x4xbf16>) -> tensor<?x?x4x8xbf16> loc("model.layers.0.linear_attn")
  func.return %o : tensor<?x?x4x8xbf16>
}

// -----

// CHECK: model.layers.0.qkv_proj: a cached token window keeps a state per sequence, which the paged form (paged=true) does not hold: compile this model in the slot form (paged=false)
func.func @token_window(%h: tensor<1x?x4xf32> {ad.input = "h"}, %start: tensor<1x1x4xf32> {ad.param = "model.layers.0.start"}) -> tensor<1x?x4xf32> {
  %cat = ad.cat %start, %h dim 1 : (tensor<1x1x4xf32>, tensor<1x?x4xf32>) -> tensor<1x?x4xf32> loc("model.layers.0.qkv_proj")
  %shift = ad.slice %cat dim 1 [0, -1, 1] : tensor<1x?x4xf32> -> tensor<1x?x4xf32> loc("model.layers.0.qkv_proj")
  func.return %shift : tensor<1x?x4xf32>
}
