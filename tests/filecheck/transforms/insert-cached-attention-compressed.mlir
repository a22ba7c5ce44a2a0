// insert-cached-attention on DeepSeek-V4's attention as HF 5.24 writes it: one shared K = V
// head, the compressor's entries concatenated to it on the key axis (then repeat_kv: key and
// value), the compressor's block bias (masked_fill(new_zeros, arange(entries) >= (position_ids +
// 1) // rate, -inf)) concatenated to HF's mask, sinks. At compress rate 1 (HCA: one entry per
// token) the entries become `compressed` of one ad.cached_attention over a cache of their own
// [slots, max-seq, 1, head_dim] (marked "<layer> compressed"); both concatenations, the block
// bias and HF's mask (a window of 4) are gone. CSA below; at compress rate 2 a layer is refused by name.
// RUN: ad-opt %s --split-input-file --verify-diagnostics -p 'insert-cached-attention{max-batch=2 max-seq-len=16}' | filecheck %s
// RUN: not ad-opt %s -p 'insert-cached-attention{max-seq-len=16 paged=true page-size=4 num-pages=8}' 2>&1 | filecheck %s --check-prefix=PAGED

// PAGED: model.layers.0.self_attn: DeepSeek-V4's compressed K/V entries are cached in the slot form only (paged=false)

// CHECK-LABEL: func.func @hca
// CHECK-SAME:  %c_cache{{.*}}: tensor<2x16x1x8xf32> {ad.input = "c_cache_0", ad.cache = "model.layers.0.self_attn compressed"}
// CHECK-NOT:   ad.cat
// CHECK-NOT:   aten.masked_fill
// CHECK-NOT:   aten.new_zeros
// CHECK-NOT:   _operator.mul
// CHECK:       ad.cached_attention %q, %kv, %kv cache %k_cache{{.*}}, %v_cache{{.*}} block_tables %block_tables cache_starts %cache_starts scale 0.35355339059327379 window 4 sinks %sinks : tensor<2xf32> compressed %c, %c_cache : tensor<1x1x?x8xf32>, tensor<2x16x1x8xf32> : (tensor<1x2x?x8xf32>, tensor<1x1x?x8xf32>, tensor<1x1x?x8xf32>, tensor<2x16x1x8xf32>, tensor<2x16x1x8xf32>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<1x2x?x8xf32>
// CHECK-NEXT:  func.return
func.func @hca(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %kv: tensor<1x1x?x8xf32> {ad.input = "kv"}, %c: tensor<1x1x?x8xf32> {ad.input = "c"}, %sinks: tensor<2xf32> {ad.param = "model.layers.0.self_attn.sinks"}, %input_ids: tensor<1x?xi64> {ad.input = "input_ids"}, %position_ids: tensor<1x?xi64> {ad.input = "position_ids"}) -> tensor<1x2x?x8xf32> {
  %n = ad.sym_size %input_ids dim 1 : tensor<1x?xi64>
  %keys = ad.cat %kv, %c dim 2 : (tensor<1x1x?x8xf32>, tensor<1x1x?x8xf32>) -> tensor<1x1x?x8xf32>
  %m2 = ad.torch_op "_operator.mul"(%n) [2 : i64, #ad.ref<0>] {} : (index) -> index
  %ku = ad.unsqueeze %keys dim 2 : tensor<1x1x?x8xf32> -> tensor<1x1x1x?x8xf32>
  %ke = ad.expand %ku [1, 1, 2, %m2, 8] : tensor<1x1x1x?x8xf32> -> tensor<1x1x2x?x8xf32>
  %k = ad.reshape %ke [1, 2, %m2, 8] : tensor<1x1x2x?x8xf32> -> tensor<1x2x?x8xf32>
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
  %one = ad.constant 1 : i64
  %next = ad.add %position_ids, %one : tensor<1x?xi64>, i64 -> tensor<1x?xi64>
  %threshold = ad.torch_op "aten.floor_divide.default"(%next) [#ad.ref<0>, 1 : i64] {} : (tensor<1x?xi64>) -> tensor<1x?xi64>
  %zeros = ad.torch_op "aten.new_zeros.default"(%c, %n) [#ad.ref<0>, [1 : i64, 1 : i64, #ad.ref<1>, #ad.ref<1>]] {pin_memory = false} : (tensor<1x1x?x8xf32>, index) -> tensor<1x1x?x?xf32>
  %z = ad.constant 0 : i64
  %entries = ad.arange %z, %n, %one device <device "cpu"> : i64, index, i64 -> tensor<?xi64>
  %ev = ad.reshape %entries [1, 1, 1, -1] : tensor<?xi64> -> tensor<1x1x1x?xi64>
  %t1 = ad.unsqueeze %threshold dim 1 : tensor<1x?xi64> -> tensor<1x1x?xi64>
  %t2 = ad.unsqueeze %t1 dim -1 : tensor<1x1x?xi64> -> tensor<1x1x?x1xi64>
  %unseen = ad.ge %ev, %t2 : tensor<1x1x1x?xi64>, tensor<1x1x?x1xi64> -> tensor<1x1x?x?xi1>
  %bias = ad.torch_op "aten.masked_fill.Scalar"(%zeros, %unseen) [#ad.ref<0>, #ad.ref<1>, 0xfff0000000000000 : f64] {} : (tensor<1x1x?x?xf32>, tensor<1x1x?x?xi1>) -> tensor<1x1x?x?xf32>
  %full = ad.cat %mask, %bias dim -1 : (tensor<1x1x?x?xf32>, tensor<1x1x?x?xf32>) -> tensor<1x1x?x?xf32>
  %masked = ad.add %scaled, %full : tensor<1x2x?x?xf32>, tensor<1x1x?x?xf32> -> tensor<1x2x?x?xf32>
  %sv = ad.reshape %sinks [1, -1, 1, 1] : tensor<2xf32> -> tensor<1x2x1x1xf32>
  %se = ad.expand %sv [1, -1, %n, -1] : tensor<1x2x1x1xf32> -> tensor<1x2x?x1xf32>
  %sc = ad.cat %masked, %se dim -1 : (tensor<1x2x?x?xf32>, tensor<1x2x?x1xf32>) -> tensor<1x2x?x?xf32>
  %max, %idx = ad.torch_op "aten.max.dim"(%sc) [#ad.ref<0>, -1 : i64, true] {} unpack : (tensor<1x2x?x?xf32>) -> (tensor<1x2x?x1xf32>, tensor<1x2x?x1xi64>)
  %shifted = ad.sub %sc, %max : tensor<1x2x?x?xf32>, tensor<1x2x?x1xf32> -> tensor<1x2x?x?xf32>
  %p = ad.softmax %shifted dim -1 dtype f32 : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32>
  %dropped = ad.slice %p dim 3 [0, -1, 1] : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32>
  %o = ad.matmul %dropped, %k : (tensor<1x2x?x?xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x8xf32> loc("model.layers.0.self_attn")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----

// CSA at compress rate 1: each entry pools the previous token's half (shifted in by
// cat([zeros, ca], 1)[:, :-1]) with its own; the indexer's top-2 of sum_h w_h relu(q_h . k) * 0.5,
// -1 past the causal threshold, chooses the entries each query sees (scattered into the block
// bias). The indexer becomes ad.cached_index_topk over an index-key cache, its result the cached
// attention's `selected`; the shift a cached token window of one token over a per-slot state,
// its initial row the zeros, cut to the step's rows; the topk, the scatter and the masks are gone.
// CHECK-LABEL: func.func @csa
// CHECK-SAME:  %c_cache{{.*}}: tensor<2x16x1x8xf32> {ad.input = "c_cache_0", ad.cache = "model.layers.1.self_attn compressed"}
// CHECK-SAME:  %index_key_cache{{.*}}: tensor<2x16x4xf32> {ad.input = "index_key_cache_0", ad.cache = "model.layers.1.self_attn index_key"}
// CHECK-SAME:  %token_window{{.*}}: tensor<2x1x1x8xf32> {ad.input = "token_window_0", ad.cache = "model.layers.1.self_attn.compressor token_window"}
// CHECK:       %first = ad.torch_op "aten.new_zeros.default"
// CHECK-NEXT:  %window = ad.cached_token_window %ca initial %first state %token_window slots %cache_slots starts %cache_starts dim 1 : (tensor<1x?x1x8xf32>, tensor<2x1x1x8xf32>, tensor<?xi64>, tensor<?xi64>, tensor<1x1x1x8xf32>) -> tensor<1x?x1x8xf32>
// CHECK-NEXT:  %tokens = ad.sym_size %ca dim 1
// CHECK-NEXT:  %prev = ad.slice %window dim 1 [0, %tokens, 1]
// CHECK-NEXT:  %{{.*}} = ad.cat %prev, %cb dim 2
// CHECK-NOT:   aten.topk
// CHECK:       %[[SEL:.*]] = ad.cached_index_topk %iq, %ik, %iw cache %index_key_cache slots %cache_slots starts %cache_starts scale 5.000000e-01 topk 2
// CHECK-NOT:   aten.scatter_
// CHECK-NOT:   aten.full_like
// CHECK-NOT:   aten.masked_fill
// CHECK-NOT:   aten.topk
// CHECK-NOT:   _operator
// CHECK:       ad.cached_attention %q, %kv, %kv cache %k_cache{{.*}}, %v_cache{{.*}} block_tables %block_tables cache_starts %cache_starts scale 0.35355339059327379 window 4 sinks %sinks : tensor<2xf32> compressed %c, %c_cache : tensor<1x1x?x8xf32>, tensor<2x16x1x8xf32> selected %[[SEL]] : tensor<1x?x2xi64> :
// CHECK-NEXT:  func.return
func.func @csa(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %kv: tensor<1x1x?x8xf32> {ad.input = "kv"}, %ca: tensor<1x?x1x8xf32> {ad.input = "ca"}, %cb: tensor<1x?x1x8xf32> {ad.input = "cb"}, %iq: tensor<1x?x3x4xf32> {ad.input = "iq"}, %ik: tensor<1x?x4xf32> {ad.input = "ik"}, %iw: tensor<1x?x3xf32> {ad.input = "iw"}, %sinks: tensor<2xf32> {ad.param = "model.layers.1.self_attn.sinks"}, %input_ids: tensor<1x?xi64> {ad.input = "input_ids"}, %position_ids: tensor<1x?xi64> {ad.input = "position_ids"}) -> tensor<1x2x?x8xf32> {
  %n = ad.sym_size %input_ids dim 1 : tensor<1x?xi64>
  %first = ad.torch_op "aten.new_zeros.default"(%ca) [#ad.ref<0>, [1 : i64, 1 : i64, 1 : i64, 8 : i64]] {pin_memory = false} : (tensor<1x?x1x8xf32>) -> tensor<1x1x1x8xf32>
  %ca_after_fill = ad.cat %first, %ca dim 1 : (tensor<1x1x1x8xf32>, tensor<1x?x1x8xf32>) -> tensor<1x?x1x8xf32> loc("model.layers.1.self_attn.compressor")
  %prev = ad.slice %ca_after_fill dim 1 [0, -1, 1] : tensor<1x?x1x8xf32> -> tensor<1x?x1x8xf32>
  %pair = ad.cat %prev, %cb dim 2 : (tensor<1x?x1x8xf32>, tensor<1x?x1x8xf32>) -> tensor<1x?x2x8xf32>
  %pooled = ad.sum %pair dim [2] : tensor<1x?x2x8xf32> -> tensor<1x?x8xf32>
  %c = ad.unsqueeze %pooled dim 1 : tensor<1x?x8xf32> -> tensor<1x1x?x8xf32>
  %ikt = ad.transpose %ik -1, -2 : tensor<1x?x4xf32> -> tensor<1x4x?xf32>
  %iku = ad.unsqueeze %ikt dim 1 : tensor<1x4x?xf32> -> tensor<1x1x4x?xf32>
  %dots = ad.matmul %iq, %iku : (tensor<1x?x3x4xf32>, tensor<1x1x4x?xf32>) -> tensor<1x?x3x?xf32>
  %relu = ad.relu %dots : tensor<1x?x3x?xf32> -> tensor<1x?x3x?xf32>
  %half = ad.constant 5.000000e-01 : f64
  %scored = ad.mul %relu, %half : tensor<1x?x3x?xf32>, f64 -> tensor<1x?x3x?xf32>
  %wu = ad.unsqueeze %iw dim -1 : tensor<1x?x3xf32> -> tensor<1x?x3x1xf32>
  %weighed = ad.mul %scored, %wu : tensor<1x?x3x?xf32>, tensor<1x?x3x1xf32> -> tensor<1x?x3x?xf32>
  %index = ad.sum %weighed dim [2] : tensor<1x?x3x?xf32> -> tensor<1x?x?xf32>
  %count = ad.torch_op "torch.sym_min"(%n) [#ad.ref<0>, 2 : i64] {} : (index) -> index
  %one = ad.constant 1 : i64
  %next = ad.add %position_ids, %one : tensor<1x?xi64>, i64 -> tensor<1x?xi64>
  %threshold = ad.torch_op "aten.floor_divide.default"(%next) [#ad.ref<0>, 1 : i64] {} : (tensor<1x?xi64>) -> tensor<1x?xi64>
  %z = ad.constant 0 : i64
  %entries = ad.arange %z, %n, %one device <device "cpu"> : i64, index, i64 -> tensor<?xi64>
  %ev = ad.reshape %entries [1, 1, -1] : tensor<?xi64> -> tensor<1x1x?xi64>
  %tu = ad.unsqueeze %threshold dim -1 : tensor<1x?xi64> -> tensor<1x?x1xi64>
  %future = ad.ge %ev, %tu : tensor<1x1x?xi64>, tensor<1x?x1xi64> -> tensor<1x?x?xi1>
  %index_masked = ad.torch_op "aten.masked_fill.Scalar"(%index, %future) [#ad.ref<0>, #ad.ref<1>, 0xfff0000000000000 : f64] {} : (tensor<1x?x?xf32>, tensor<1x?x?xi1>) -> tensor<1x?x?xf32>
  %values, %picked = ad.torch_op "aten.topk.default"(%index_masked, %count) [#ad.ref<0>, #ad.ref<1>] {} unpack : (tensor<1x?x?xf32>, index) -> (tensor<1x?x?xf32>, tensor<1x?x?xi64>)
  %late = ad.ge %picked, %tu : tensor<1x?x?xi64>, tensor<1x?x1xi64> -> tensor<1x?x?xi1>
  %none = ad.torch_op "aten.full_like.default"(%picked) [#ad.ref<0>, -1 : i64] {pin_memory = false} : (tensor<1x?x?xi64>) -> tensor<1x?x?xi64>
  %chosen = ad.where %late, %none, %picked : tensor<1x?x?xi1>, tensor<1x?x?xi64>, tensor<1x?x?xi64> -> tensor<1x?x?xi64>
  %listed = ad.ge %chosen, %z : tensor<1x?x?xi64>, i64 -> tensor<1x?x?xi1>
  %past = ad.torch_op "aten.full_like.default"(%chosen, %n) [#ad.ref<0>, #ad.ref<1>] {pin_memory = false} : (tensor<1x?x?xi64>, index) -> tensor<1x?x?xi64>
  %safe = ad.where %listed, %chosen, %past : tensor<1x?x?xi1>, tensor<1x?x?xi64>, tensor<1x?x?xi64> -> tensor<1x?x?xi64>
  %n1 = ad.torch_op "_operator.add"(%n) [#ad.ref<0>, 1 : i64] {} : (index) -> index
  %unseen = ad.torch_op "aten.new_full.default"(%c, %n, %n1) [#ad.ref<0>, [1 : i64, 1 : i64, #ad.ref<1>, #ad.ref<2>], 0xfff0000000000000 : f64] {pin_memory = false} : (tensor<1x1x?x8xf32>, index, index) -> tensor<1x1x?x?xf32>
  %su = ad.unsqueeze %safe dim 1 : tensor<1x?x?xi64> -> tensor<1x1x?x?xi64>
  %seen = ad.torch_op "aten.scatter_.value"(%unseen, %su) [#ad.ref<0>, -1 : i64, #ad.ref<1>, 0.000000e+00 : f64] {} : (tensor<1x1x?x?xf32>, tensor<1x1x?x?xi64>) -> tensor<1x1x?x?xf32>
  %bias = ad.slice %seen dim 3 [0, %n, 1] : tensor<1x1x?x?xf32> -> tensor<1x1x?x?xf32>
  %keys = ad.cat %kv, %c dim 2 : (tensor<1x1x?x8xf32>, tensor<1x1x?x8xf32>) -> tensor<1x1x?x8xf32>
  %m2 = ad.torch_op "_operator.mul"(%n) [2 : i64, #ad.ref<0>] {} : (index) -> index
  %ku = ad.unsqueeze %keys dim 2 : tensor<1x1x?x8xf32> -> tensor<1x1x1x?x8xf32>
  %ke = ad.expand %ku [1, 1, 2, %m2, 8] : tensor<1x1x1x?x8xf32> -> tensor<1x1x2x?x8xf32>
  %k = ad.reshape %ke [1, 2, %m2, 8] : tensor<1x1x2x?x8xf32> -> tensor<1x2x?x8xf32>
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
  %full = ad.cat %mask, %bias dim -1 : (tensor<1x1x?x?xf32>, tensor<1x1x?x?xf32>) -> tensor<1x1x?x?xf32>
  %masked = ad.add %scaled, %full : tensor<1x2x?x?xf32>, tensor<1x1x?x?xf32> -> tensor<1x2x?x?xf32>
  %sv = ad.reshape %sinks [1, -1, 1, 1] : tensor<2xf32> -> tensor<1x2x1x1xf32>
  %se = ad.expand %sv [1, -1, %n, -1] : tensor<1x2x1x1xf32> -> tensor<1x2x?x1xf32>
  %sc = ad.cat %masked, %se dim -1 : (tensor<1x2x?x?xf32>, tensor<1x2x?x1xf32>) -> tensor<1x2x?x?xf32>
  %max, %idx = ad.torch_op "aten.max.dim"(%sc) [#ad.ref<0>, -1 : i64, true] {} unpack : (tensor<1x2x?x?xf32>) -> (tensor<1x2x?x1xf32>, tensor<1x2x?x1xi64>)
  %shifted = ad.sub %sc, %max : tensor<1x2x?x?xf32>, tensor<1x2x?x1xf32> -> tensor<1x2x?x?xf32>
  %p = ad.softmax %shifted dim -1 dtype f32 : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32>
  %dropped = ad.slice %p dim 3 [0, -1, 1] : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32>
  %o = ad.matmul %dropped, %k : (tensor<1x2x?x?xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x8xf32> loc("model.layers.1.self_attn")
  func.return %o : tensor<1x2x?x8xf32>
}

// -----

// CHECK: model.layers.1.self_attn: its keys concatenate the compressed K/V entries of DeepSeek-V4 HCA at compress rate 2, which are not cached (only DeepSeek-V4's CSA and HCA at compress rate 1 as transformers 5.24 writes them are: one entry per token)
func.func @rate_two(%q: tensor<1x2x?x8xf32> {ad.input = "q"}, %kv: tensor<1x1x?x8xf32> {ad.input = "kv"}, %c: tensor<1x1x?x8xf32> {ad.input = "c"}, %sinks: tensor<2xf32> {ad.param = "model.layers.1.self_attn.sinks"}, %input_ids: tensor<1x?xi64> {ad.input = "input_ids"}, %position_ids: tensor<1x?xi64> {ad.input = "position_ids"}) -> tensor<1x2x?x8xf32> {
  %n = ad.sym_size %input_ids dim 1 : tensor<1x?xi64>
  %e = ad.sym_size %c dim 2 : tensor<1x1x?x8xf32>
  %keys = ad.cat %kv, %c dim 2 : (tensor<1x1x?x8xf32>, tensor<1x1x?x8xf32>) -> tensor<1x1x?x8xf32>
  %kt = ad.transpose %keys 2, 3 : tensor<1x1x?x8xf32> -> tensor<1x1x8x?xf32>
  %s = ad.matmul %q, %kt : (tensor<1x2x?x8xf32>, tensor<1x1x8x?xf32>) -> tensor<1x2x?x?xf32>
  %scaling = ad.constant 0.35355339059327379 : f64
  %scaled = ad.mul %s, %scaling : tensor<1x2x?x?xf32>, f64 -> tensor<1x2x?x?xf32>
  %a = ad.unsqueeze %position_ids dim 2 : tensor<1x?xi64> -> tensor<1x?x1xi64>
  %b = ad.unsqueeze %position_ids dim 1 : tensor<1x?xi64> -> tensor<1x1x?xi64>
  %causal = ad.le %b, %a : tensor<1x1x?xi64>, tensor<1x?x1xi64> -> tensor<1x?x?xi1>
  %mu = ad.unsqueeze %causal dim 1 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %zero = ad.constant 0.000000e+00 : f64
  %inf = ad.constant 0xFFF0000000000000 : f64
  %mask = ad.where %mu, %zero, %inf : tensor<1x1x?x?xi1>, f64, f64 -> tensor<1x1x?x?xf32>
  %one = ad.constant 1 : i64
  %next = ad.add %position_ids, %one : tensor<1x?xi64>, i64 -> tensor<1x?xi64>
  %threshold = ad.torch_op "aten.floor_divide.default"(%next) [#ad.ref<0>, 2 : i64] {} : (tensor<1x?xi64>) -> tensor<1x?xi64>
  %zeros = ad.torch_op "aten.new_zeros.default"(%c, %n, %e) [#ad.ref<0>, [1 : i64, 1 : i64, #ad.ref<1>, #ad.ref<2>]] {pin_memory = false} : (tensor<1x1x?x8xf32>, index, index) -> tensor<1x1x?x?xf32>
  %z = ad.constant 0 : i64
  %entries = ad.arange %z, %e, %one device <device "cpu"> : i64, index, i64 -> tensor<?xi64>
  %ev = ad.reshape %entries [1, 1, 1, -1] : tensor<?xi64> -> tensor<1x1x1x?xi64>
  %t1 = ad.unsqueeze %threshold dim 1 : tensor<1x?xi64> -> tensor<1x1x?xi64>
  %t2 = ad.unsqueeze %t1 dim -1 : tensor<1x1x?xi64> -> tensor<1x1x?x1xi64>
  %unseen = ad.ge %ev, %t2 : tensor<1x1x1x?xi64>, tensor<1x1x?x1xi64> -> tensor<1x1x?x?xi1>
  %bias = ad.torch_op "aten.masked_fill.Scalar"(%zeros, %unseen) [#ad.ref<0>, #ad.ref<1>, 0xfff0000000000000 : f64] {} : (tensor<1x1x?x?xf32>, tensor<1x1x?x?xi1>) -> tensor<1x1x?x?xf32>
  %full = ad.cat %mask, %bias dim -1 : (tensor<1x1x?x?xf32>, tensor<1x1x?x?xf32>) -> tensor<1x1x?x?xf32>
  %masked = ad.add %scaled, %full : tensor<1x2x?x?xf32>, tensor<1x1x?x?xf32> -> tensor<1x2x?x?xf32>
  %p = ad.softmax %masked dim -1 dtype f32 : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32>
  %o = ad.matmul %p, %keys : (tensor<1x2x?x?xf32>, tensor<1x1x?x8xf32>) -> tensor<1x2x?x8xf32> loc("model.layers.1.self_attn")
  func.return %o : tensor<1x2x?x8xf32>
}
