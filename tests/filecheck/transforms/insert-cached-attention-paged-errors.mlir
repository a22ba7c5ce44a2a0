// insert-cached-attention{paged=true}: what the paged form cannot hold is an error naming the
// layer (convolutions over a token window) or the op (logits that do not come from a linear LM
// head).
// RUN: ad-opt %s --split-input-file --verify-diagnostics -p 'insert-cached-attention{max-seq-len=16 paged=true page-size=4 num-pages=8}' | filecheck %s
// RUN: not ad-opt %s -p 'insert-cached-attention{paged=true page-size=12}' 2>&1 | filecheck %s --check-prefix=PAGE

// PAGE: {{^}}error: insert-cached-attention: page-size 12 must be a power of two and num-pages 256 positive{{$}}

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

// Convolutions over a left pad of tokens read each token's earlier rows across the flattened
// step: refused by name (a shift by tokens is paged: insert-cached-attention-paged-states.mlir).
// CHECK: model.layers.0.qkv_proj: convolutions over a cached token window read each token's earlier rows across the flattened step, which the paged form (paged=true) does not hold: compile this model in the slot form (paged=false)
func.func @padded_convolution(%x: tensor<1x8x?xf32> {ad.input = "x"}, %w1: tensor<8x1x2xf32> {ad.param = "model.layers.0.qkv_proj.conv_qk_depthwise.weight"}) -> tensor<1x8x?xf32> {
  %pad = ad.torch_op "aten.pad.default"(%x) [#ad.ref<0>, [1 : i64, 0 : i64]] {} : (tensor<1x8x?xf32>) -> tensor<1x8x?xf32> loc("model.layers.0.qkv_proj")
  %c1 = ad.torch_op "aten.conv1d.default"(%pad, %w1) [#ad.ref<0>, #ad.ref<1>, none, [1 : i64], [0 : i64], [1 : i64], 8 : i64] {} : (tensor<1x8x?xf32>, tensor<8x1x2xf32>) -> tensor<1x8x?xf32> loc("model.layers.0.qkv_proj.conv_qk_depthwise")
  func.return %c1 : tensor<1x8x?xf32>
}
