// insert-cached-attention: what cannot be cached is an error naming the layer.
// RUN: ad-opt %s --split-input-file --verify-diagnostics -p 'insert-cached-attention{max-batch=2 max-seq-len=16}' | filecheck %s
// RUN: not ad-opt %s -p 'insert-cached-attention{max-batch=0}' 2>&1 | filecheck %s --check-prefix=ZERO
// RUN: not ad-opt %s -p 'insert-cached-attention{max-seq-len=0}' 2>&1 | filecheck %s --check-prefix=ZERO-LEN

// ZERO: {{^}}error: insert-cached-attention: max-batch 0 and max-seq-len 2048 must be positive{{$}}
// ZERO-LEN: {{^}}error: insert-cached-attention: max-batch 8 and max-seq-len 0 must be positive{{$}}

// CHECK: model.layers.3.self_attn: its attention mask is neither causal nor a causal sliding window; only those can be cached
func.func @not_causal(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x1x?x8xf32> {ad.input = "k"}, %v: tensor<1x1x?x8xf32> {ad.input = "v"}, %freq: tensor<8xf32> {ad.buffer = "model.rotary_emb.inv_freq"}, %position_ids: tensor<1x?xi64> {ad.input = "position_ids"}) -> tensor<1x2x?x8xf32> {
  %pu = ad.unsqueeze %position_ids dim 2 : tensor<1x?xi64> -> tensor<1x?x1xi64>
  %pf = ad.cast %pu : tensor<1x?x1xi64> -> tensor<1x?x1xf32>
  %angle = ad.mul %pf, %freq : tensor<1x?x1xf32>, tensor<8xf32> -> tensor<1x?x8xf32>
  %cos = ad.cos %angle : tensor<1x?x8xf32> -> tensor<1x?x8xf32>
  %sin = ad.sin %angle : tensor<1x?x8xf32> -> tensor<1x?x8xf32>
  %a = ad.unsqueeze %position_ids dim 2 : tensor<1x?xi64> -> tensor<1x?x1xi64>
  %b = ad.unsqueeze %position_ids dim 1 : tensor<1x?xi64> -> tensor<1x1x?xi64>
  %m = ad.ge %b, %a : tensor<1x1x?xi64>, tensor<1x?x1xi64> -> tensor<1x?x?xi1>
  %mask = ad.unsqueeze %m dim 1 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %o = ad.rope_attention %q, %k, %v rope %cos, %sin mask %mask scale 0.35355339059327379 : (tensor<1x2x?x8xf32>, tensor<1x1x?x8xf32>, tensor<1x1x?x8xf32>, tensor<1x?x8xf32>, tensor<1x?x8xf32>, tensor<1x1x?x?xi1>) -> tensor<1x2x?x8xf32> loc("model.layers.3.self_attn")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----
// CHECK: model.layers.0.self_attn: the RoPE positions do not come from a 'position_ids' input; export the model with position_ids as an input so the cache can offset them
func.func @positions_from_arange(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x1x?x8xf32> {ad.input = "k"}, %v: tensor<1x1x?x8xf32> {ad.input = "v"}, %cos: tensor<1x?x8xf32> {ad.input = "cos"}, %sin: tensor<1x?x8xf32> {ad.input = "sin"}) -> tensor<1x2x?x8xf32> {
  %o = ad.rope_attention %q, %k, %v rope %cos, %sin causal scale 0.35355339059327379 : (tensor<1x2x?x8xf32>, tensor<1x1x?x8xf32>, tensor<1x1x?x8xf32>, tensor<1x?x8xf32>, tensor<1x?x8xf32>) -> tensor<1x2x?x8xf32> loc("model.layers.0.self_attn")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----
// CHECK: model.layers.0.self_attn: its attention mask reads %pad, not only the token positions: it cannot be replaced by causal masking
func.func @padding_mask(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x1x?x8xf32> {ad.input = "k"}, %v: tensor<1x1x?x8xf32> {ad.input = "v"}, %freq: tensor<8xf32> {ad.buffer = "model.rotary_emb.inv_freq"}, %position_ids: tensor<1x?xi64> {ad.input = "position_ids"}, %pad: tensor<1x1x?x?xi1> {ad.input = "attention_mask"}) -> tensor<1x2x?x8xf32> {
  %pu = ad.unsqueeze %position_ids dim 2 : tensor<1x?xi64> -> tensor<1x?x1xi64>
  %pf = ad.cast %pu : tensor<1x?x1xi64> -> tensor<1x?x1xf32>
  %angle = ad.mul %pf, %freq : tensor<1x?x1xf32>, tensor<8xf32> -> tensor<1x?x8xf32>
  %cos = ad.cos %angle : tensor<1x?x8xf32> -> tensor<1x?x8xf32>
  %sin = ad.sin %angle : tensor<1x?x8xf32> -> tensor<1x?x8xf32>
  %o = ad.rope_attention %q, %k, %v rope %cos, %sin mask %pad scale 0.35355339059327379 : (tensor<1x2x?x8xf32>, tensor<1x1x?x8xf32>, tensor<1x1x?x8xf32>, tensor<1x?x8xf32>, tensor<1x?x8xf32>, tensor<1x1x?x?xi1>) -> tensor<1x2x?x8xf32> loc("model.layers.0.self_attn")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----
// An additive mask that is a bias (ALiBi-like: -1 per token of distance), not 0 / very negative.
// CHECK: model.layers.2.self_attn: its additive attention mask holds values other than 0 and a very negative number (it is not only a causal mask)
func.func @additive_bias(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x2x?x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}, %position_ids: tensor<1x?xi64> {ad.input = "position_ids"}) -> tensor<1x2x?x8xf32> {
  %kt = ad.transpose %k 2, 3 : tensor<1x2x?x8xf32> -> tensor<1x2x8x?xf32>
  %s = ad.matmul %q, %kt : (tensor<1x2x?x8xf32>, tensor<1x2x8x?xf32>) -> tensor<1x2x?x?xf32>
  %capped = ad.tanh %s : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32>
  %a = ad.unsqueeze %position_ids dim 2 : tensor<1x?xi64> -> tensor<1x?x1xi64>
  %b = ad.unsqueeze %position_ids dim 1 : tensor<1x?xi64> -> tensor<1x1x?xi64>
  %distance = ad.sub %b, %a : tensor<1x1x?xi64>, tensor<1x?x1xi64> -> tensor<1x?x?xi64>
  %bias = ad.cast %distance : tensor<1x?x?xi64> -> tensor<1x?x?xf32>
  %mask = ad.unsqueeze %bias dim 1 : tensor<1x?x?xf32> -> tensor<1x1x?x?xf32>
  %masked = ad.add %capped, %mask : tensor<1x2x?x?xf32>, tensor<1x1x?x?xf32> -> tensor<1x2x?x?xf32>
  %p = ad.softmax %masked dim -1 : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32>
  %o = ad.matmul %p, %v : (tensor<1x2x?x?xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x8xf32> loc("model.layers.2.self_attn")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----
// A convolution over the sequence that is no causal short convolution (here it also sees the
// next token: padding 1 of a 3-tap kernel) beside a cached attention: a decode step would
// convolve the new token alone.
// CHECK: insert-cached-attention: 1 op(s) mix token positions outside the cached attention, and nothing caches their state between steps, so generation would be wrong: model.layers.0.conv: ad.torch_op (aten.conv1d.default on a tensor with a token axis).
func.func @centered_conv(%x: tensor<1x8x?xf32> {ad.input = "x"}, %w: tensor<8x1x3xf32> {ad.param = "model.layers.0.conv.conv.weight"}, %q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x2x?x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}) -> (tensor<1x8x?xf32>, tensor<1x2x?x8xf32>) {
  %c = ad.torch_op "aten.conv1d.default"(%x, %w) [#ad.ref<0>, #ad.ref<1>, none, [1 : i64], [1 : i64], [1 : i64], 8 : i64] {} : (tensor<1x8x?xf32>, tensor<8x1x3xf32>) -> tensor<1x8x?xf32> loc("model.layers.0.conv")
  %o = ad.attention %q, %k, %v causal : (tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x8xf32> loc("model.layers.1.self_attn")
  func.return %c, %o : tensor<1x8x?xf32>, tensor<1x2x?x8xf32>
}

// -----
// A model without attention is refused too when it mixes positions: a scan (cumsum) over the
// sequence, a shift (x[:, :-1]), a mean over the sequence and the sequence cut into chunks.
// CHECK: insert-cached-attention: 4 op(s) mix token positions outside the cached attention, and nothing caches their state between steps, so generation would be wrong: model.layers.0.scan: ad.torch_op (aten.cumsum.default on a tensor with a token axis); model.layers.0.shift: ad.slice (slices token axis 1 by [0:-1:1]); model.layers.0.pool: ad.mean (reduces over token axis 1); model.layers.0.chunks: ad.reshape (cuts a token axis into chunks).
func.func @no_attention(%x: tensor<1x?x8xf32> {ad.input = "x"}) -> (tensor<1x?x8xf32>, tensor<1x?x8xf32>, tensor<1x1x8xf32>, tensor<1x?x4x8xf32>) {
  %c = ad.torch_op "aten.cumsum.default"(%x) [#ad.ref<0>, 1 : i64] {} : (tensor<1x?x8xf32>) -> tensor<1x?x8xf32> loc("model.layers.0.scan")
  %s = ad.slice %x dim 1 [0, -1, 1] : tensor<1x?x8xf32> -> tensor<1x?x8xf32> loc("model.layers.0.shift")
  %m = ad.mean %x dim [1] keepdim : tensor<1x?x8xf32> -> tensor<1x1x8xf32> loc("model.layers.0.pool")
  %r = ad.reshape %x [1, -1, 4, 8] : tensor<1x?x8xf32> -> tensor<1x?x4x8xf32> loc("model.layers.0.chunks")
  func.return %c, %s, %m, %r : tensor<1x?x8xf32>, tensor<1x?x8xf32>, tensor<1x1x8xf32>, tensor<1x?x4x8xf32>
}

// -----
// A softmax over the keys that is not matched as attention (here: unscaled scores and no
// mask) stays a mixer, named with its layer, and why it is no attention form is said first.
// CHECK: insert-cached-attention: the attention at model.layers.0.self_attn is no form it caches: its input is not the scores plus a mask, nor masked_fill of them; 2 op(s) mix token positions
// CHECK-SAME: model.layers.0.self_attn: ad.softmax (softmax over token axis 3)
func.func @unmatched_softmax(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x2x?x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}) -> tensor<1x2x?x8xf32> {
  %kt = ad.transpose %k 2, 3 : tensor<1x2x?x8xf32> -> tensor<1x2x8x?xf32>
  %s = ad.matmul %q, %kt : (tensor<1x2x?x8xf32>, tensor<1x2x8x?xf32>) -> tensor<1x2x?x?xf32> loc("model.layers.0.self_attn")
  %p = ad.softmax %s dim -1 : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32> loc("model.layers.0.self_attn")
  %o = ad.matmul %p, %v : (tensor<1x2x?x?xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x8xf32> loc("model.layers.0.self_attn")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----
// GPT-Neo's mask: where(a slice of the model's triangular `bias` buffer, scores, lowest). Matched;
// outside the compiler (which puts the buffers' values in scope) the values are unknown, so the
// mask cannot be evaluated: refused naming the layer and the buffer.
// CHECK: transformer.h.0.attn.attention: its attention mask reads %bias, not only the token positions: it cannot be replaced by causal masking
func.func @buffer_mask(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x2x?x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}, %bias: tensor<1x1x32x32xi1> {ad.buffer = "transformer.h.0.attn.attention.bias"}, %lowest: tensor<f32> {ad.constant_tensor = "transformer.h.0.attn.attention.lifted_tensor"}, %input_ids: tensor<1x?xi64> {ad.input = "input_ids"}) -> tensor<1x2x?x8xf32> {
  %kt = ad.transpose %k 2, 3 : tensor<1x2x?x8xf32> -> tensor<1x2x8x?xf32>
  %s = ad.matmul %q, %kt : (tensor<1x2x?x8xf32>, tensor<1x2x8x?xf32>) -> tensor<1x2x?x?xf32>
  %n = ad.sym_size %input_ids dim 1 : tensor<1x?xi64>
  %rows = ad.slice %bias dim 2 [0, %n, 1] : tensor<1x1x32x32xi1> -> tensor<1x1x?x32xi1>
  %causal = ad.slice %rows dim 3 [0, %n, 1] : tensor<1x1x?x32xi1> -> tensor<1x1x?x?xi1>
  %masked = ad.where %causal, %s, %lowest : tensor<1x1x?x?xi1>, tensor<1x2x?x?xf32>, tensor<f32> -> tensor<1x2x?x?xf32>
  %p = ad.softmax %masked dim -1 : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32> loc("transformer.h.0.attn.attention")
  %o = ad.matmul %p, %v : (tensor<1x2x?x?xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x8xf32> loc("transformer.h.0.attn.attention")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----
// OpenAI-GPT's mask: scores * m + (1 - m) * -1e4 of a slice m of its triangular float buffer.
// Matched; outside the compiler (which puts the buffers' values in scope) the values are unknown,
// so the mask cannot be evaluated: refused naming the layer and the buffer.
// CHECK: transformer.h.0.attn: its attention mask reads %bias, not only the token positions: it cannot be replaced by causal masking
func.func @multiplied_buffer_mask(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x2x?x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}, %bias: tensor<1x1x32x32xf32> {ad.buffer = "transformer.h.0.attn.bias"}, %input_ids: tensor<1x?xi64> {ad.input = "input_ids"}) -> tensor<1x2x?x8xf32> {
  %kt = ad.transpose %k 2, 3 : tensor<1x2x?x8xf32> -> tensor<1x2x8x?xf32>
  %s = ad.matmul %q, %kt : (tensor<1x2x?x8xf32>, tensor<1x2x8x?xf32>) -> tensor<1x2x?x?xf32>
  %n = ad.sym_size %input_ids dim 1 : tensor<1x?xi64>
  %rows = ad.slice %bias dim 2 [0, %n, 1] : tensor<1x1x32x32xf32> -> tensor<1x1x?x32xf32>
  %m = ad.slice %rows dim 3 [0, %n, 1] : tensor<1x1x?x32xf32> -> tensor<1x1x?x?xf32>
  %kept = ad.mul %s, %m : tensor<1x2x?x?xf32>, tensor<1x1x?x?xf32> -> tensor<1x2x?x?xf32>
  %one = ad.constant 1 : i64
  %dropped = ad.sub %one, %m : i64, tensor<1x1x?x?xf32> -> tensor<1x1x?x?xf32>
  %big = ad.constant -1.000000e+04 : f64
  %fill = ad.mul %dropped, %big : tensor<1x1x?x?xf32>, f64 -> tensor<1x1x?x?xf32>
  %masked = ad.add %kept, %fill : tensor<1x2x?x?xf32>, tensor<1x1x?x?xf32> -> tensor<1x2x?x?xf32>
  %p = ad.softmax %masked dim -1 : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32> loc("transformer.h.0.attn")
  %o = ad.matmul %p, %v : (tensor<1x2x?x?xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x8xf32> loc("transformer.h.0.attn")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----
// The same form with a fill of -1: not masking (at most -1e4 is, whose exp underflows to 0): refused
// naming the layer and the fill.
// CHECK: transformer.h.0.attn: its scores are masked as scores * mask + (1 - mask) * -1.0: the fill is not at most -10000.0
func.func @multiplied_small_fill(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x2x?x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}, %bias: tensor<1x1x32x32xf32> {ad.buffer = "transformer.h.0.attn.bias"}, %input_ids: tensor<1x?xi64> {ad.input = "input_ids"}) -> tensor<1x2x?x8xf32> {
  %kt = ad.transpose %k 2, 3 : tensor<1x2x?x8xf32> -> tensor<1x2x8x?xf32>
  %s = ad.matmul %q, %kt : (tensor<1x2x?x8xf32>, tensor<1x2x8x?xf32>) -> tensor<1x2x?x?xf32>
  %n = ad.sym_size %input_ids dim 1 : tensor<1x?xi64>
  %rows = ad.slice %bias dim 2 [0, %n, 1] : tensor<1x1x32x32xf32> -> tensor<1x1x?x32xf32>
  %m = ad.slice %rows dim 3 [0, %n, 1] : tensor<1x1x?x32xf32> -> tensor<1x1x?x?xf32>
  %kept = ad.mul %s, %m : tensor<1x2x?x?xf32>, tensor<1x1x?x?xf32> -> tensor<1x2x?x?xf32>
  %one = ad.constant 1 : i64
  %dropped = ad.sub %one, %m : i64, tensor<1x1x?x?xf32> -> tensor<1x1x?x?xf32>
  %big = ad.constant -1.000000e+00 : f64
  %fill = ad.mul %dropped, %big : tensor<1x1x?x?xf32>, f64 -> tensor<1x1x?x?xf32>
  %masked = ad.add %kept, %fill : tensor<1x2x?x?xf32>, tensor<1x1x?x?xf32> -> tensor<1x2x?x?xf32>
  %p = ad.softmax %masked dim -1 : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32> loc("transformer.h.0.attn")
  %o = ad.matmul %p, %v : (tensor<1x2x?x?xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x8xf32> loc("transformer.h.0.attn")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----
// The scores only multiplied by a slice of the triangular buffer (no fill: masked scores 0, not
// masked): a form not matched, refused naming the layer, the buffer and the forms matched.
// CHECK: insert-cached-attention: the attention at transformer.h.0.attn is no form it caches: its scores are masked by a slice of the model's [1, 1, 32, 32] buffer %bias (a triangular buffer of older HF models) in a form not matched (GPT-Neo's where(mask, scores, lowest) and OpenAI-GPT's scores * mask + (1 - mask) * fill are); 2 op(s) mix token positions
func.func @multiplied_only(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x2x?x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}, %bias: tensor<1x1x32x32xf32> {ad.buffer = "transformer.h.0.attn.bias"}, %input_ids: tensor<1x?xi64> {ad.input = "input_ids"}) -> tensor<1x2x?x8xf32> {
  %kt = ad.transpose %k 2, 3 : tensor<1x2x?x8xf32> -> tensor<1x2x8x?xf32>
  %s = ad.matmul %q, %kt : (tensor<1x2x?x8xf32>, tensor<1x2x8x?xf32>) -> tensor<1x2x?x?xf32>
  %n = ad.sym_size %input_ids dim 1 : tensor<1x?xi64>
  %rows = ad.slice %bias dim 2 [0, %n, 1] : tensor<1x1x32x32xf32> -> tensor<1x1x?x32xf32>
  %m = ad.slice %rows dim 3 [0, %n, 1] : tensor<1x1x?x32xf32> -> tensor<1x1x?x?xf32>
  %kept = ad.mul %s, %m : tensor<1x2x?x?xf32>, tensor<1x1x?x?xf32> -> tensor<1x2x?x?xf32>
  %p = ad.softmax %kept dim -1 : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32> loc("transformer.h.0.attn")
  %o = ad.matmul %p, %v : (tensor<1x2x?x?xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x8xf32> loc("transformer.h.0.attn")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----
// A mask computed from the activations (Doge's dynamic mask: a bias per key from a parameter and
// the hidden states): refused naming the layer, the parameter read last and the ops from it.
// CHECK: model.layers.0.self_attn: its attention mask is computed from the parameter %a (through ad.mul, ad.exp, ad.transpose, ad.unsqueeze): a mask or score bias that depends on the activations, which the cached attention does not take
func.func @activation_mask(%a: tensor<2xf32> {ad.param = "model.layers.0.self_attn.A"}, %h: tensor<1x?x2xf32> {ad.input = "h"}, %q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x2x?x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}) -> tensor<1x2x?x8xf32> {
  %m = ad.mul %a, %h : tensor<2xf32>, tensor<1x?x2xf32> -> tensor<1x?x2xf32>
  %e = ad.exp %m : tensor<1x?x2xf32> -> tensor<1x?x2xf32>
  %t = ad.transpose %e -1, -2 : tensor<1x?x2xf32> -> tensor<1x2x?xf32>
  %bias = ad.unsqueeze %t dim 2 : tensor<1x2x?xf32> -> tensor<1x2x1x?xf32>
  %o = ad.attention %q, %k, %v mask %bias scale 0.35355339059327379 : f64 : (tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x2x1x?xf32>) -> tensor<1x2x?x8xf32> loc("model.layers.0.self_attn")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----
// The probabilities are also returned (HF's output_attentions): with a cache they would cover
// the new tokens only, so the chain is not cached, and generation is refused.
// CHECK: 2 op(s) mix token positions outside the cached attention{{.*}}: an unnamed module: ad.softmax (softmax over token axis 3); model.layers.0.self_attn: ad.matmul (contracts over token axis 3).
func.func @probabilities_returned(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x2x?x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}, %mask: tensor<1x1x?x?xf32> {ad.input = "mask"}) -> (tensor<1x2x?x8xf32>, tensor<1x2x?x?xf32>) {
  %kt = ad.transpose %k 2, 3 : tensor<1x2x?x8xf32> -> tensor<1x2x8x?xf32>
  %s = ad.matmul %q, %kt : (tensor<1x2x?x8xf32>, tensor<1x2x8x?xf32>) -> tensor<1x2x?x?xf32>
  %capped = ad.tanh %s : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32>
  %masked = ad.add %capped, %mask : tensor<1x2x?x?xf32>, tensor<1x1x?x?xf32> -> tensor<1x2x?x?xf32>
  %p = ad.softmax %masked dim -1 : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32>
  %o = ad.matmul %p, %v : (tensor<1x2x?x?xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x8xf32> loc("model.layers.0.self_attn")
  func.return %o, %p : tensor<1x2x?x8xf32>, tensor<1x2x?x?xf32>
}

// -----
// Positions counted inside the graph (a learned position table indexed by arange(seq), as in a
// model whose forward takes no position_ids): with a cache every decode step would be position 0.
// CHECK: 1 op(s) mix token positions outside the cached attention{{.*}}: model.embed_positions: ad.arange (counts the tokens of the step (positions not from position_ids)).
func.func @positions_counted(%x: tensor<1x?x8xf32> {ad.input = "x"}, %table: tensor<64x8xf32> {ad.param = "model.embed_positions.weight"}, %seq: index) -> tensor<1x?x8xf32> {
  %zero = ad.constant 0 : i64
  %one = ad.constant 1 : i64
  %positions = ad.arange %zero, %seq, %one : i64, index, i64 -> tensor<?xi64> loc("model.embed_positions")
  %e = ad.embedding %table, %positions : (tensor<64x8xf32>, tensor<?xi64>) -> tensor<?x8xf32>
  %o = ad.add %x, %e : tensor<1x?x8xf32>, tensor<?x8xf32> -> tensor<1x?x8xf32>
  func.return %o : tensor<1x?x8xf32>
}

// -----
// Expert groups joined back out of split order (or with a group reading another's tokens) move
// rows between positions: the cat is a mixer. The token count that sizes the groups is not.
// CHECK: insert-cached-attention: 1 op(s) mix token positions outside the cached attention{{.*}}: model.layers.0.mlp: ad.cat (concatenates over token axis 0).
func.func @groups_out_of_order(%x: tensor<?x8xf32> {ad.input = "x"}, %assigned: tensor<?x2xi64> {ad.input = "assigned"}, %w0: tensor<8x8xf32> {ad.param = "model.layers.0.mlp.experts.0.weight"}, %w1: tensor<8x8xf32> {ad.param = "model.layers.0.mlp.experts.1.weight"}) -> tensor<?x8xf32> {
  %counts = ad.sum %assigned dim [0] : tensor<?x2xi64> -> tensor<2xi64>
  %c0, %c1 = ad.torch_op "aten.unbind.int"(%counts) [#ad.ref<0>] {} unpack : (tensor<2xi64>) -> (tensor<i64>, tensor<i64>)
  %n0 = ad.torch_op "aten.item.default"(%c0) [#ad.ref<0>] {} : (tensor<i64>) -> index
  %n1 = ad.torch_op "aten.item.default"(%c1) [#ad.ref<0>] {} : (tensor<i64>) -> index
  %x0, %x1 = ad.split %x [%n0, %n1] : tensor<?x8xf32> -> tensor<?x8xf32>, tensor<?x8xf32>
  %y0 = ad.linear %x0, %w0 : (tensor<?x8xf32>, tensor<8x8xf32>) -> tensor<?x8xf32>
  %y1 = ad.linear %x1, %w1 : (tensor<?x8xf32>, tensor<8x8xf32>) -> tensor<?x8xf32>
  %joined = ad.cat %y1, %y0 : (tensor<?x8xf32>, tensor<?x8xf32>) -> tensor<?x8xf32> loc("model.layers.0.mlp")
  func.return %joined : tensor<?x8xf32>
}

// -----
// A bias added to the scores that is not ALiBi's (quadratic in the key position): refused.
// CHECK: transformer.blocks.0.attn: its scores' bias is not ALiBi's (a slope per head times the key position); only ALiBi's bias can be cached
func.func @not_alibi(%ids: tensor<1x?xi64> {ad.input = "input_ids"}, %q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x2x?x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}) -> tensor<1x2x?x8xf32> {
  %c0 = ad.constant 0 : i64
  %c1 = ad.constant 1 : i64
  %c3 = ad.constant 3 : i64
  %h = ad.arange %c1, %c3, %c1 : i64, i64, i64 -> tensor<2xi64>
  %slopes = ad.cast %h : tensor<2xi64> -> tensor<2xf32>
  %sv = ad.reshape %slopes [2, 1, 1] : tensor<2xf32> -> tensor<2x1x1xf32>
  %n = ad.sym_size %ids dim 1 : tensor<1x?xi64>
  %pos = ad.arange %c0, %n, %c1 : i64, index, i64 -> tensor<?xi64>
  %squares = ad.mul %pos, %pos : tensor<?xi64>, tensor<?xi64> -> tensor<?xi64>
  %bias = ad.mul %sv, %squares : tensor<2x1x1xf32>, tensor<?xi64> -> tensor<2x1x?xf32>
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
// A shift along the sequence by a concatenation (each token would see the step's tokens only).
// A range that indexes the step's rows (`x[arange(seq)]`) reaches no embedding and no RoPE
// table: it is no position, and only the concatenation is named.
// CHECK: 1 op(s) mix token positions outside the cached attention{{.*}}: model.shift: ad.cat (concatenates over token axis 1).
func.func @shift_by_cat(%x: tensor<1x?x8xf32> {ad.input = "x"}, %h: tensor<?x8xf32> {ad.input = "h"}, %seq: index) -> (tensor<1x?x8xf32>, tensor<?x8xf32>) {
  %zero = ad.constant 0 : i64
  %one = ad.constant 1 : i64
  %rows = ad.arange %zero, %seq, %one : i64, index, i64 -> tensor<?xi64> loc("model.rows")
  %picked = ad.torch_op "aten.index.Tensor"(%h, %rows) [#ad.ref<0>, [#ad.ref<1>]] {} : (tensor<?x8xf32>, tensor<?xi64>) -> tensor<?x8xf32>
  %s = ad.cat %x, %x dim 1 : (tensor<1x?x8xf32>, tensor<1x?x8xf32>) -> tensor<1x?x8xf32> loc("model.shift")
  func.return %s, %picked : tensor<1x?x8xf32>, tensor<?x8xf32>
}

// -----
// A range over the step's tokens from 0 that indexes a position table but is also compared
// with each row's length (a padding mask, as XLM's): that use is no position, so the range is
// not replaced by the real positions and stays refused, naming its layer.
// CHECK: 1 op(s) mix token positions outside the cached attention{{.*}}: model.embed_positions: ad.arange (counts the tokens of the step (positions not from position_ids)).
func.func @positions_also_compared(%ids: tensor<?x?xi64> {ad.input = "input_ids"}, %lengths: tensor<?x1xi64> {ad.input = "lengths"}, %table: tensor<64x8xf32> {ad.param = "model.embed_positions.weight"}, %q: tensor<?x2x?x8xf32> {ad.input = "q"}, %k: tensor<?x2x?x8xf32> {ad.input = "k"}, %v: tensor<?x2x?x8xf32> {ad.input = "v"}) -> (tensor<?x8xf32>, tensor<?x?xi1>, tensor<?x2x?x8xf32>) {
  %c0 = ad.constant 0 : i64
  %c1 = ad.constant 1 : i64
  %n = ad.sym_size %ids dim 1 : tensor<?x?xi64>
  %pos = ad.arange %c0, %n, %c1 : i64, index, i64 -> tensor<?xi64> loc("model.embed_positions")
  %e = ad.embedding %table, %pos : (tensor<64x8xf32>, tensor<?xi64>) -> tensor<?x8xf32>
  %padding = ad.lt %pos, %lengths : tensor<?xi64>, tensor<?x1xi64> -> tensor<?x?xi1>
  %o = ad.attention %q, %k, %v causal : (tensor<?x2x?x8xf32>, tensor<?x2x?x8xf32>, tensor<?x2x?x8xf32>) -> tensor<?x2x?x8xf32> loc("model.layers.0.self_attn")
  func.return %e, %padding, %o : tensor<?x8xf32>, tensor<?x?xi1>, tensor<?x2x?x8xf32>
}

// -----

// DeepSeek sparse attention's selection (an indexer's topk scattered into the mask) over an
// attention that is not MLA: refused by name, not cached without its selection.
// CHECK: model.layers.0.self_attn: DeepSeek sparse attention (a key selection by its indexer's top-k) is cached only over MLA in the slot form (paged=false); this attention is not MLA (the log says why)
func.func @sparse_not_mla(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x2x?x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}, %iq: tensor<1x?x3x4xf32> {ad.input = "iq"}, %ik: tensor<1x?x4xf32> {ad.input = "ik"}, %iw: tensor<1x?x3xf32> {ad.input = "iw"}, %position_ids: tensor<1x?xi64> {ad.input = "position_ids"}) -> tensor<1x2x?x8xf32> {
  %s = ad.sym_size %q dim 2 : tensor<1x2x?x8xf32>
  %a = ad.unsqueeze %position_ids dim 2 : tensor<1x?xi64> -> tensor<1x?x1xi64>
  %b = ad.unsqueeze %position_ids dim 1 : tensor<1x?xi64> -> tensor<1x1x?xi64>
  %causal3 = ad.le %b, %a : tensor<1x1x?xi64>, tensor<1x?x1xi64> -> tensor<1x?x?xi1>
  %causal = ad.unsqueeze %causal3 dim 1 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %kt = ad.transpose %ik -1, -2 : tensor<1x?x4xf32> -> tensor<1x4x?xf32>
  %kt1 = ad.unsqueeze %kt dim 1 : tensor<1x4x?xf32> -> tensor<1x1x4x?xf32>
  %dots = ad.matmul %iq, %kt1 : (tensor<1x?x3x4xf32>, tensor<1x1x4x?xf32>) -> tensor<1x?x3x?xf32>
  %relu = ad.relu %dots : tensor<1x?x3x?xf32> -> tensor<1x?x3x?xf32>
  %row = ad.unsqueeze %iw dim -2 : tensor<1x?x3xf32> -> tensor<1x?x1x3xf32>
  %weighted = ad.matmul %row, %relu : (tensor<1x?x1x3xf32>, tensor<1x?x3x?xf32>) -> tensor<1x?x1x?xf32>
  %index = ad.squeeze %weighted dim [-2] : tensor<1x?x1x?xf32> -> tensor<1x?x?xf32>
  %not_causal = ad.bitwise_not %causal3 : tensor<1x?x?xi1> -> tensor<1x?x?xi1>
  %masked = ad.torch_op "aten.masked_fill.Scalar"(%index, %not_causal) [#ad.ref<0>, #ad.ref<1>, 0xfff0000000000000 : f64] {} : (tensor<1x?x?xf32>, tensor<1x?x?xi1>) -> tensor<1x?x?xf32>
  %values, %indices = ad.torch_op "aten.topk.default"(%masked) [#ad.ref<0>, 2 : i64] {} unpack : (tensor<1x?x?xf32>) -> (tensor<1x?x?xf32>, tensor<1x?x?xi64>)
  %ones = ad.torch_op "aten.new_ones.default"(%indices, %s) [#ad.ref<0>, [1 : i64, #ad.ref<1>, #ad.ref<1>]] {dtype = i1, pin_memory = false} : (tensor<1x?x?xi64>, index) -> tensor<1x?x?xi1>
  %dropped = ad.torch_op "aten.scatter.value"(%ones, %indices) [#ad.ref<0>, -1 : i64, #ad.ref<1>, false] {} : (tensor<1x?x?xi1>, tensor<1x?x?xi64>) -> tensor<1x?x?xi1>
  %dropped4 = ad.unsqueeze %dropped dim 1 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %kept = ad.bitwise_not %dropped4 : tensor<1x1x?x?xi1> -> tensor<1x1x?x?xi1>
  %mask = ad.bitwise_and %kept, %causal : tensor<1x1x?x?xi1>, tensor<1x1x?x?xi1> -> tensor<1x1x?x?xi1>
  %o = ad.attention %q, %k, %v mask %mask scale 0.35355339059327379 : f64 : (tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x1x?x?xi1>) -> tensor<1x2x?x8xf32> loc("model.layers.0.self_attn")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----

// A bias gathered like Inkling's but by the key-query distance (keys ahead, which causality
// masks): the masked positions are not those outside 0..extent-1 of the backward distance.
// CHECK: model.layers.1.self_attn: its score bias gathered from a table of 3 is not zeroed exactly outside the query-key distances 0 .. 2; only a bias gathered by the query-key distance can be cached
func.func @distance_bias_ahead(%ids: tensor<1x?xi64> {ad.input = "input_ids"}, %q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x2x?x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}, %logits: tensor<1x2x?x3xf32> {ad.input = "logits"}) -> tensor<1x2x?x8xf32> {
  %c0 = ad.constant 0 : i64
  %c1 = ad.constant 1 : i64
  %c3 = ad.constant 3 : i64
  %n = ad.sym_size %ids dim 1 : tensor<1x?xi64>
  %pos = ad.arange %c0, %n, %c1 : i64, index, i64 -> tensor<?xi64>
  %qp = ad.unsqueeze %pos dim 1 : tensor<?xi64> -> tensor<?x1xi64>
  %kp = ad.unsqueeze %pos dim 0 : tensor<?xi64> -> tensor<1x?xi64>
  %d2 = ad.sub %kp, %qp : tensor<1x?xi64>, tensor<?x1xi64> -> tensor<?x?xi64>
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
  %o = ad.attention %q, %k, %v mask %mask scale 1.250000e-01 : f64 : (tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>, tensor<1x2x?x?xf32>) -> tensor<1x2x?x8xf32> loc("model.layers.1.self_attn")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----

// A left pad of 3 tokens whose convolutions look back 1 + 1 = 2 only (the pad's first row would
// reach the step's tokens) is no form a token window caches: the pad and both convolutions are
// refused.
// CHECK: insert-cached-attention: 3 op(s) mix token positions outside the cached attention, and nothing caches their state between steps, so generation would be wrong: model.layers.0.qkv_proj: ad.torch_op (aten.pad.default on a tensor with a token axis); model.layers.0.qkv_proj.conv_qk_depthwise: ad.torch_op (aten.conv1d.default on a tensor with a token axis); model.layers.0.qkv_proj.conv_qk_grouped: ad.torch_op (aten.conv1d.default on a tensor with a token axis).
func.func @pad_wider_than_the_convolutions(%x: tensor<?x8x?xf32> {ad.input = "x"}, %w1: tensor<8x1x2xf32> {ad.param = "model.layers.0.qkv_proj.conv_qk_depthwise.weight"}, %w2: tensor<8x4x2xf32> {ad.param = "model.layers.0.qkv_proj.conv_qk_grouped.weight"}) -> tensor<?x8x?xf32> {
  %pad = ad.torch_op "aten.pad.default"(%x) [#ad.ref<0>, [3 : i64, 0 : i64]] {} : (tensor<?x8x?xf32>) -> tensor<?x8x?xf32> loc("model.layers.0.qkv_proj")
  %c1 = ad.torch_op "aten.conv1d.default"(%pad, %w1) [#ad.ref<0>, #ad.ref<1>, none, [1 : i64], [0 : i64], [1 : i64], 8 : i64] {} : (tensor<?x8x?xf32>, tensor<8x1x2xf32>) -> tensor<?x8x?xf32> loc("model.layers.0.qkv_proj.conv_qk_depthwise")
  %c2 = ad.torch_op "aten.conv1d.default"(%c1, %w2) [#ad.ref<0>, #ad.ref<1>, none, [1 : i64], [0 : i64], [1 : i64], 2 : i64] {} : (tensor<?x8x?xf32>, tensor<8x4x2xf32>) -> tensor<?x8x?xf32> loc("model.layers.0.qkv_proj.conv_qk_grouped")
  func.return %c2 : tensor<?x8x?xf32>
}

// -----

// Inkling2's pad of 3 tokens cut to its last seq + 2 rows (-(seq + 2)) before unfold(-1, 4, 1):
// the cut drops a row of the pad, so the windows are not each token's and the 3 before it; no
// form a token window caches: the pad, the cut and the unfold are refused (the flip of the
// unfolded taps' axis moves no token).
// CHECK: insert-cached-attention: 3 op(s) mix token positions outside the cached attention, and nothing caches their state between steps, so generation would be wrong: model.layers.1.self_attn.k_proj.sconv: ad.torch_op (aten.pad.default on a tensor with a token axis); model.layers.1.self_attn.k_proj.sconv: ad.slice (slices token axis 2 by [?:end:1]); model.layers.1.self_attn.k_proj.sconv: ad.torch_op (aten.unfold.default on a tensor with a token axis).
func.func @unfold_of_a_cut_pad(%ids: tensor<?x?xi64> {ad.input = "input_ids"}, %x: tensor<?x8x?xf32> {ad.input = "x"}) -> tensor<?x8x?x4xf32> {
  %n = ad.sym_size %ids dim 1 : tensor<?x?xi64>
  %pad = ad.torch_op "aten.pad.default"(%x) [#ad.ref<0>, [3 : i64, 0 : i64]] {} : (tensor<?x8x?xf32>) -> tensor<?x8x?xf32> loc("model.layers.1.self_attn.k_proj.sconv")
  %add = ad.torch_op "_operator.add"(%n) [#ad.ref<0>, 2 : i64] {} : (index) -> index
  %neg = ad.torch_op "_operator.neg"(%add) [#ad.ref<0>] {} : (index) -> index
  %cut = ad.slice %pad dim 2 [%neg, 9223372036854775807, 1] : tensor<?x8x?xf32> -> tensor<?x8x?xf32> loc("model.layers.1.self_attn.k_proj.sconv")
  %unfold = ad.torch_op "aten.unfold.default"(%cut) [#ad.ref<0>, -1 : i64, 4 : i64, 1 : i64] {} : (tensor<?x8x?xf32>) -> tensor<?x8x?x4xf32> loc("model.layers.1.self_attn.k_proj.sconv")
  %flip = ad.torch_op "aten.flip.default"(%unfold) [#ad.ref<0>, [-1 : i64]] {} : (tensor<?x8x?x4xf32>) -> tensor<?x8x?x4xf32> loc("model.layers.1.self_attn.k_proj.sconv")
  func.return %flip : tensor<?x8x?x4xf32>
}

// -----

// A flip over a token axis (the sequence reversed) is a mixer; over a static axis it is not.
// CHECK: insert-cached-attention: 1 op(s) mix token positions outside the cached attention, and nothing caches their state between steps, so generation would be wrong: model.layers.0.mixer: ad.torch_op (aten.flip.default flips over token axis 2).
func.func @flip_of_the_tokens(%x: tensor<?x8x?xf32> {ad.input = "x"}) -> tensor<?x8x?xf32> {
  %channels = ad.torch_op "aten.flip.default"(%x) [#ad.ref<0>, [1 : i64]] {} : (tensor<?x8x?xf32>) -> tensor<?x8x?xf32> loc("model.layers.0.mixer")
  %tokens = ad.torch_op "aten.flip.default"(%channels) [#ad.ref<0>, [1 : i64, -1 : i64]] {} : (tensor<?x8x?xf32>) -> tensor<?x8x?xf32> loc("model.layers.0.mixer")
  func.return %tokens : tensor<?x8x?xf32>
}

// -----
// A shift whose start row is the sequence's own first token (h[:, :1]) is no shift a token
// window caches: in a decode step the start would be the new token.
// CHECK: insert-cached-attention: 3 op(s) mix token positions outside the cached attention, and nothing caches their state between steps, so generation would be wrong: model.layers.0.first: ad.slice (slices token axis 1 by [0:1:1]); model.layers.0.shift: ad.cat (concatenates over token axis 1); model.layers.0.shift: ad.slice (slices token axis 1 by [0:-1:1]).
func.func @shift_from_a_token(%h: tensor<?x?x4xf32> {ad.input = "h"}) -> tensor<?x?x4xf32> {
  %start = ad.slice %h dim 1 [0, 1, 1] : tensor<?x?x4xf32> -> tensor<?x1x4xf32> loc("model.layers.0.first")
  %cat = ad.cat %start, %h dim 1 : (tensor<?x1x4xf32>, tensor<?x?x4xf32>) -> tensor<?x?x4xf32> loc("model.layers.0.shift")
  %shift = ad.slice %cat dim 1 [0, -1, 1] : tensor<?x?x4xf32> -> tensor<?x?x4xf32> loc("model.layers.0.shift")
  func.return %shift : tensor<?x?x4xf32>
}

// -----
// A convolution that looks back further than the rows a cached token window holds (2 back, 1
// row) mixes positions the window does not cache.
// CHECK: insert-cached-attention: 1 op(s) mix token positions outside the cached attention, and nothing caches their state between steps, so generation would be wrong: model.layers.0.conv: ad.torch_op (aten.conv1d.default on a tensor with a token axis).
func.func @conv_past_its_window(%x: tensor<?x8x?xf32> {ad.input = "x"}, %w: tensor<8x1x3xf32> {ad.param = "model.layers.0.conv.weight"}, %state: tensor<2x8x1xf32> {ad.input = "token_window_0", ad.cache = "model.layers.0 token_window"}, %slots: tensor<?xi64> {ad.input = "cache_slots", ad.cache_slots = ""}, %starts: tensor<?xi64> {ad.input = "cache_starts", ad.cache_starts = ""}) -> tensor<?x8x?xf32> {
  %window = ad.cached_token_window %x state %state slots %slots starts %starts dim 2 : (tensor<?x8x?xf32>, tensor<2x8x1xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<?x8x?xf32>
  %c = ad.torch_op "aten.conv1d.default"(%window, %w) [#ad.ref<0>, #ad.ref<1>, none, [1 : i64], [0 : i64], [1 : i64], 8 : i64] {} : (tensor<?x8x?xf32>, tensor<8x1x3xf32>) -> tensor<?x8x?xf32> loc("model.layers.0.conv")
  func.return %c : tensor<?x8x?xf32>
}

// -----
// CHECK: cpmant.encoder.layers.0.self_att.self_attention: its probabilities are zeroed after the softmax under a mask other than its scores' one
func.func @zeroed_under_another_mask(%position_ids: tensor<1x?xi64> {ad.input = "position_ids"}, %q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x2x?x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}) -> tensor<1x2x?x8xf32> {
  %a = ad.unsqueeze %position_ids dim 2 : tensor<1x?xi64> -> tensor<1x?x1xi64>
  %b = ad.unsqueeze %position_ids dim 1 : tensor<1x?xi64> -> tensor<1x1x?xi64>
  %later = ad.gt %b, %a : tensor<1x1x?xi64>, tensor<1x?x1xi64> -> tensor<1x?x?xi1>
  %m = ad.unsqueeze %later dim 1 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %earlier = ad.lt %b, %a : tensor<1x1x?xi64>, tensor<1x?x1xi64> -> tensor<1x?x?xi1>
  %other = ad.unsqueeze %earlier dim 1 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %kt = ad.transpose %k 2, 3 : tensor<1x2x?x8xf32> -> tensor<1x2x8x?xf32>
  %s = ad.matmul %q, %kt : (tensor<1x2x?x8xf32>, tensor<1x2x8x?xf32>) -> tensor<1x2x?x?xf32>
  %ninf = ad.torch_op "aten.scalar_tensor.default"() [0xFFF0000000000000 : f64] {dtype = f32} : () -> tensor<f32>
  %masked = ad.torch_op "aten.masked_fill.Tensor"(%s, %m, %ninf) [#ad.ref<0>, #ad.ref<1>, #ad.ref<2>] {} : (tensor<1x2x?x?xf32>, tensor<1x1x?x?xi1>, tensor<f32>) -> tensor<1x2x?x?xf32>
  %p = ad.softmax %masked dim -1 : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32>
  %zero = ad.torch_op "aten.scalar_tensor.default"() [0 : i64] {dtype = f32} : () -> tensor<f32>
  %pz = ad.torch_op "aten.masked_fill.Tensor"(%p, %other, %zero) [#ad.ref<0>, #ad.ref<1>, #ad.ref<2>] {} : (tensor<1x2x?x?xf32>, tensor<1x1x?x?xi1>, tensor<f32>) -> tensor<1x2x?x?xf32>
  %o = ad.matmul %pz, %v : (tensor<1x2x?x?xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x8xf32> loc("cpmant.encoder.layers.0.self_att.self_attention")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----
// Two such softmaxes: the first is named, the other counted.
// CHECK: insert-cached-attention: the attention at model.layers.0.self_attn (and 1 more) is no form it caches: its input is not the scores plus a mask, nor masked_fill of them; 4 op(s) mix token positions
func.func @two_unmatched_softmaxes(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x2x?x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}) -> tensor<1x2x?x8xf32> {
  %kt = ad.transpose %k 2, 3 : tensor<1x2x?x8xf32> -> tensor<1x2x8x?xf32>
  %s = ad.matmul %q, %kt : (tensor<1x2x?x8xf32>, tensor<1x2x8x?xf32>) -> tensor<1x2x?x?xf32> loc("model.layers.0.self_attn")
  %p = ad.softmax %s dim -1 : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32> loc("model.layers.0.self_attn")
  %o = ad.matmul %p, %v : (tensor<1x2x?x?xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x8xf32> loc("model.layers.0.self_attn")
  %kt1 = ad.transpose %k 2, 3 : tensor<1x2x?x8xf32> -> tensor<1x2x8x?xf32>
  %s1 = ad.matmul %o, %kt1 : (tensor<1x2x?x8xf32>, tensor<1x2x8x?xf32>) -> tensor<1x2x?x?xf32> loc("model.layers.1.self_attn")
  %p1 = ad.softmax %s1 dim -1 : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32> loc("model.layers.1.self_attn")
  %o1 = ad.matmul %p1, %v : (tensor<1x2x?x?xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x8xf32> loc("model.layers.1.self_attn")
  func.return %o1 : tensor<1x2x?x8xf32>
}

// -----
// MPT's masked_fill, but filling with -1 (not a very negative number): the scores are not masked.
// CHECK: insert-cached-attention: the attention at transformer.blocks.0.attn is no form it caches: its masked_fill does not fill the scores with a very negative number;
func.func @masked_fill_not_very_negative(%ids: tensor<1x?xi64> {ad.input = "input_ids"}, %q: tensor<1x2x?x8xf32> {ad.input = "q"}, %k: tensor<1x2x?x8xf32> {ad.input = "k"}, %v: tensor<1x2x?x8xf32> {ad.input = "v"}) -> tensor<1x2x?x8xf32> {
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
  %masked = ad.torch_op "aten.masked_fill.Scalar"(%biased, %later) [#ad.ref<0>, #ad.ref<1>, -1.000000e+00 : f64] {} : (tensor<1x2x?x?xf32>, tensor<?x?xi1>) -> tensor<1x2x?x?xf32>
  %p = ad.softmax %masked dim -1 : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32> loc("transformer.blocks.0.attn")
  %o = ad.matmul %p, %v : (tensor<1x2x?x?xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x8xf32> loc("transformer.blocks.0.attn")
  func.return %o : tensor<1x2x?x8xf32>
}
