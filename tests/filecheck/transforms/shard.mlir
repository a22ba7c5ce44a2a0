// shard: tensor-parallel blocks found by dataflow and rewritten for world-size ranks.
// RUN: ad-opt %s --split-input-file -p 'shard{world-size=2}' | filecheck %s
// RUN: ad-opt %s --split-input-file > %t.before
// RUN: ad-opt %s --split-input-file -p 'shard{world-size=1}' | diff - %t.before

// An MLP block: gate/up column-wise, down row-wise, one all_reduce before the residual add.
// CHECK-LABEL: func.func @mlp
// CHECK-SAME:    %wg: tensor<8x8xf32> {ad.param = "mlp.gate.weight", ad.shard_dim = 0 : i64}
// CHECK-SAME:    %wu: tensor<8x8xf32> {ad.param = "mlp.up.weight", ad.shard_dim = 0 : i64}
// CHECK-SAME:    %wd: tensor<8x8xf32> {ad.param = "mlp.down.weight", ad.shard_dim = 1 : i64}
// CHECK-NEXT:    %g = ad.linear %x, %wg : (tensor<2x?x8xf32>, tensor<8x8xf32>) -> tensor<2x?x8xf32>
// CHECK-NEXT:    %s = ad.silu %g : tensor<2x?x8xf32> -> tensor<2x?x8xf32>
// CHECK-NEXT:    %u = ad.linear %x, %wu : (tensor<2x?x8xf32>, tensor<8x8xf32>) -> tensor<2x?x8xf32>
// CHECK-NEXT:    %m = ad.mul %s, %u : tensor<2x?x8xf32>, tensor<2x?x8xf32> -> tensor<2x?x8xf32>
// CHECK-NEXT:    %d = ad.linear %m, %wd : (tensor<2x?x8xf32>, tensor<8x8xf32>) -> tensor<2x?x8xf32>
// CHECK-NEXT:    %all_reduce = ad.all_reduce %d "sum" group "0" : tensor<2x?x8xf32> -> tensor<2x?x8xf32>
// CHECK-NEXT:    %reduced = ad.wait_tensor %all_reduce : tensor<2x?x8xf32> -> tensor<2x?x8xf32>
// CHECK-NEXT:    %r = ad.add %x, %reduced : tensor<2x?x8xf32>, tensor<2x?x8xf32> -> tensor<2x?x8xf32>
// CHECK-NEXT:    func.return %r
func.func @mlp(%x: tensor<2x?x8xf32> {ad.input = "x"}, %wg: tensor<16x8xf32> {ad.param = "mlp.gate.weight"}, %wu: tensor<16x8xf32> {ad.param = "mlp.up.weight"}, %wd: tensor<8x16xf32> {ad.param = "mlp.down.weight"}) -> tensor<2x?x8xf32> {
  %g = ad.linear %x, %wg : (tensor<2x?x8xf32>, tensor<16x8xf32>) -> tensor<2x?x16xf32>
  %s = ad.silu %g : tensor<2x?x16xf32> -> tensor<2x?x16xf32>
  %u = ad.linear %x, %wu : (tensor<2x?x8xf32>, tensor<16x8xf32>) -> tensor<2x?x16xf32>
  %m = ad.mul %s, %u : tensor<2x?x16xf32>, tensor<2x?x16xf32> -> tensor<2x?x16xf32>
  %d = ad.linear %m, %wd : (tensor<2x?x16xf32>, tensor<8x16xf32>) -> tensor<2x?x8xf32>
  %r = ad.add %x, %d : tensor<2x?x8xf32>, tensor<2x?x8xf32> -> tensor<2x?x8xf32>
  func.return %r : tensor<2x?x8xf32>
}

// -----

// Parallel blocks (GPT-J style): the two partial sums meet in one add, reduced once after it.
// An opening bias is sharded with its weight; a closing bias is added once, after the reduction,
// so that block reduces on its own.
// CHECK-LABEL: func.func @parallel
// CHECK-SAME:    %b1: tensor<8xf32> {ad.param = "b1", ad.shard_dim = 0 : i64}
// CHECK-NEXT:    %h1 = ad.linear %x, %w1 bias %b1 : (tensor<4x8xf32>, tensor<8x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
// CHECK-NEXT:    %a1 = ad.relu %h1
// CHECK-NEXT:    %o1 = ad.linear %a1, %w2 : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
// CHECK-NEXT:    %h2 = ad.linear %x, %w3
// CHECK-NEXT:    %a2 = ad.tanh %h2
// CHECK-NEXT:    %o2 = ad.linear %a2, %w4 : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
// CHECK-NEXT:    %s = ad.add %o1, %o2
// CHECK-NEXT:    %all_reduce = ad.all_reduce %s "sum" group "0"
// CHECK-NEXT:    %reduced = ad.wait_tensor %all_reduce
// CHECK-NEXT:    %h3 = ad.linear %reduced, %w5
// CHECK-NEXT:    %a3 = ad.gelu %h3
// CHECK-NEXT:    %[[O3:.*]] = ad.linear %a3, %w6 : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
// CHECK-NEXT:    %[[R:.*]] = ad.all_reduce %[[O3]] "sum" group "0"
// CHECK-NEXT:    %[[W:.*]] = ad.wait_tensor %[[R]]
// CHECK-NEXT:    %[[B:.*]] = ad.add %[[W]], %b6 : tensor<4x8xf32>, tensor<8xf32> -> tensor<4x8xf32>
// CHECK-NEXT:    func.return %[[B]]
// CHECK-NOT:     ad.all_reduce
func.func @parallel(%x: tensor<4x8xf32> {ad.input = "x"}, %w1: tensor<16x8xf32> {ad.param = "w1"}, %b1: tensor<16xf32> {ad.param = "b1"}, %w2: tensor<8x16xf32> {ad.param = "w2"}, %w3: tensor<16x8xf32> {ad.param = "w3"}, %w4: tensor<8x16xf32> {ad.param = "w4"}, %w5: tensor<16x8xf32> {ad.param = "w5"}, %w6: tensor<8x16xf32> {ad.param = "w6"}, %b6: tensor<8xf32> {ad.param = "b6"}) -> tensor<4x8xf32> {
  %h1 = ad.linear %x, %w1 bias %b1 : (tensor<4x8xf32>, tensor<16x8xf32>, tensor<16xf32>) -> tensor<4x16xf32>
  %a1 = ad.relu %h1 : tensor<4x16xf32> -> tensor<4x16xf32>
  %o1 = ad.linear %a1, %w2 : (tensor<4x16xf32>, tensor<8x16xf32>) -> tensor<4x8xf32>
  %h2 = ad.linear %x, %w3 : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32>
  %a2 = ad.tanh %h2 : tensor<4x16xf32> -> tensor<4x16xf32>
  %o2 = ad.linear %a2, %w4 : (tensor<4x16xf32>, tensor<8x16xf32>) -> tensor<4x8xf32>
  %s = ad.add %o1, %o2 : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  %h3 = ad.linear %s, %w5 : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32>
  %a3 = ad.gelu %h3 : tensor<4x16xf32> -> tensor<4x16xf32>
  %o3 = ad.linear %a3, %w6 bias %b6 : (tensor<4x16xf32>, tensor<8x16xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  func.return %o3 : tensor<4x8xf32>
}

// -----

// Parallel blocks with closing biases (Phi: attention's dense and the MLP's fc2 both have one):
// the partial sums still meet in one add, reduced once; both biases are added after it.
// CHECK-LABEL: func.func @parallel_biased
// CHECK-NEXT:    %h1 = ad.linear %x, %w1 : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
// CHECK-NEXT:    %o1 = ad.linear %h1, %w2 : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
// CHECK-NEXT:    %h2 = ad.linear %x, %w3 : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
// CHECK-NEXT:    %a2 = ad.gelu %h2
// CHECK-NEXT:    %o2 = ad.linear %a2, %w4 : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
// CHECK-NEXT:    %s = ad.add %o1, %o2
// CHECK-NEXT:    %all_reduce = ad.all_reduce %s "sum" group "0"
// CHECK-NEXT:    %reduced = ad.wait_tensor %all_reduce
// CHECK-NEXT:    %[[B2:.*]] = ad.add %reduced, %b2 : tensor<4x8xf32>, tensor<8xf32> -> tensor<4x8xf32>
// CHECK-NEXT:    %[[B4:.*]] = ad.add %[[B2]], %b4 : tensor<4x8xf32>, tensor<8xf32> -> tensor<4x8xf32>
// CHECK-NEXT:    %r = ad.add %[[B4]], %x
// CHECK-NEXT:    func.return %r
// CHECK-NOT:     ad.all_reduce
func.func @parallel_biased(%x: tensor<4x8xf32> {ad.input = "x"}, %w1: tensor<16x8xf32> {ad.param = "w1"}, %w2: tensor<8x16xf32> {ad.param = "w2"}, %b2: tensor<8xf32> {ad.param = "b2"}, %w3: tensor<16x8xf32> {ad.param = "w3"}, %w4: tensor<8x16xf32> {ad.param = "w4"}, %b4: tensor<8xf32> {ad.param = "b4"}) -> tensor<4x8xf32> {
  %h1 = ad.linear %x, %w1 : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32>
  %o1 = ad.linear %h1, %w2 bias %b2 : (tensor<4x16xf32>, tensor<8x16xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  %h2 = ad.linear %x, %w3 : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32>
  %a2 = ad.gelu %h2 : tensor<4x16xf32> -> tensor<4x16xf32>
  %o2 = ad.linear %a2, %w4 bias %b4 : (tensor<4x16xf32>, tensor<8x16xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  %s = ad.add %o1, %o2 : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  %r = ad.add %s, %x : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  func.return %r : tensor<4x8xf32>
}

// -----

// Left whole (the log says why): a block whose intermediate is also a result of the function,
// and one whose intermediate is read whole along the split dim (a [16] weight added to a split
// [4, 16]).
// CHECK-LABEL: func.func @ambiguous
// CHECK-NOT:     ad.shard_dim
// CHECK-NOT:     ad.all_reduce
// CHECK:         func.return
func.func @ambiguous(%x: tensor<4x8xf32> {ad.input = "x"}, %w1: tensor<16x8xf32> {ad.param = "w1"}, %w2: tensor<8x16xf32> {ad.param = "w2"}, %w3: tensor<16x8xf32> {ad.param = "w3"}, %c: tensor<16xf32> {ad.param = "c"}, %w4: tensor<8x16xf32> {ad.param = "w4"}) -> (tensor<4x16xf32>, tensor<4x8xf32>, tensor<4x8xf32>) {
  %h1 = ad.linear %x, %w1 : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32>
  %o1 = ad.linear %h1, %w2 : (tensor<4x16xf32>, tensor<8x16xf32>) -> tensor<4x8xf32>
  %h3 = ad.linear %x, %w3 : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32>
  %a3 = ad.add %h3, %c : tensor<4x16xf32>, tensor<16xf32> -> tensor<4x16xf32>
  %a4 = ad.exp %a3 : tensor<4x16xf32> -> tensor<4x16xf32>
  %o3 = ad.linear %a4, %w4 : (tensor<4x16xf32>, tensor<8x16xf32>) -> tensor<4x8xf32>
  func.return %h1, %o1, %o3 : tensor<4x16xf32>, tensor<4x8xf32>, tensor<4x8xf32>
}

// -----

// Hints override detection: detection alone pairs %wa with %wb (and leaves %wc replicated, its
// result is the function's); with %wa replicated, %wb colwise and %wc rowwise, the block is
// %wb -> %wc.
// CHECK-LABEL: func.func @hinted
// CHECK-SAME:    %wa: tensor<16x8xf32> {ad.param = "wa"}
// CHECK-SAME:    %wb: tensor<8x16xf32> {ad.param = "wb", ad.shard_dim = 0 : i64}
// CHECK-SAME:    %wc: tensor<8x8xf32> {ad.param = "wc", ad.shard_dim = 1 : i64}
// CHECK-NEXT:    %a = ad.linear %x, %wa {ad.shard = "replicated"} : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32>
// CHECK-NEXT:    %b = ad.linear %a, %wb {ad.shard = "colwise"} : (tensor<4x16xf32>, tensor<8x16xf32>) -> tensor<4x8xf32>
// CHECK-NEXT:    %r = ad.relu %b : tensor<4x8xf32> -> tensor<4x8xf32>
// CHECK-NEXT:    %c = ad.linear %r, %wc {ad.shard = "rowwise"} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
// CHECK-NEXT:    %all_reduce = ad.all_reduce %c
// CHECK-NEXT:    %reduced = ad.wait_tensor %all_reduce
// CHECK-NEXT:    func.return %reduced
func.func @hinted(%x: tensor<4x8xf32> {ad.input = "x"}, %wa: tensor<16x8xf32> {ad.param = "wa"}, %wb: tensor<16x16xf32> {ad.param = "wb"}, %wc: tensor<8x16xf32> {ad.param = "wc"}) -> tensor<4x8xf32> {
  %a = ad.linear %x, %wa {ad.shard = "replicated"} : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32>
  %b = ad.linear %a, %wb {ad.shard = "colwise"} : (tensor<4x16xf32>, tensor<16x16xf32>) -> tensor<4x16xf32>
  %r = ad.relu %b : tensor<4x16xf32> -> tensor<4x16xf32>
  %c = ad.linear %r, %wc {ad.shard = "rowwise"} : (tensor<4x16xf32>, tensor<8x16xf32>) -> tensor<4x8xf32>
  func.return %c : tensor<4x8xf32>
}

// -----

// CHECK-LABEL: func.func @unhinted
// CHECK-SAME:    %wa: tensor<8x8xf32> {ad.param = "wa", ad.shard_dim = 0 : i64}
// CHECK-SAME:    %wb: tensor<16x8xf32> {ad.param = "wb", ad.shard_dim = 1 : i64}
// CHECK-SAME:    %wc: tensor<8x16xf32> {ad.param = "wc"}
// CHECK:         %b = ad.linear %a, %wb
// CHECK-NEXT:    ad.all_reduce %b
func.func @unhinted(%x: tensor<4x8xf32> {ad.input = "x"}, %wa: tensor<16x8xf32> {ad.param = "wa"}, %wb: tensor<16x16xf32> {ad.param = "wb"}, %wc: tensor<8x16xf32> {ad.param = "wc"}) -> tensor<4x8xf32> {
  %a = ad.linear %x, %wa : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32>
  %b = ad.linear %a, %wb : (tensor<4x16xf32>, tensor<16x16xf32>) -> tensor<4x16xf32>
  %r = ad.relu %b : tensor<4x16xf32> -> tensor<4x16xf32>
  %c = ad.linear %r, %wc : (tensor<4x16xf32>, tensor<8x16xf32>) -> tensor<4x8xf32>
  func.return %c : tensor<4x8xf32>
}

// -----

// Views with explicit sizes inside a block (heads written out, as older HF attention code does):
// the size at the split dim becomes the local one (4 heads -> 2, 16 features -> 8); -1 stays.
// CHECK-LABEL: func.func @mlp_with_views
// CHECK:         %v = ad.reshape %u [2, -1, 2, 4] : tensor<2x?x8xf32> -> tensor<2x?x2x4xf32>
// CHECK:         %b = ad.reshape %a [2, -1, 8] : tensor<2x?x2x4xf32> -> tensor<2x?x8xf32>
// CHECK:         ad.all_reduce %d "sum"
func.func @mlp_with_views(%x: tensor<2x?x8xf32> {ad.input = "x"}, %wu: tensor<16x8xf32> {ad.param = "mlp.up.weight"}, %wd: tensor<8x16xf32> {ad.param = "mlp.down.weight"}) -> tensor<2x?x8xf32> {
  %u = ad.linear %x, %wu : (tensor<2x?x8xf32>, tensor<16x8xf32>) -> tensor<2x?x16xf32>
  %v = ad.reshape %u [2, -1, 4, 4] : tensor<2x?x16xf32> -> tensor<2x?x4x4xf32>
  %a = ad.relu %v : tensor<2x?x4x4xf32> -> tensor<2x?x4x4xf32>
  %b = ad.reshape %a [2, -1, 16] : tensor<2x?x4x4xf32> -> tensor<2x?x16xf32>
  %d = ad.linear %b, %wd : (tensor<2x?x16xf32>, tensor<8x16xf32>) -> tensor<2x?x8xf32>
  func.return %d : tensor<2x?x8xf32>
}

// -----

// Eager attention (two matmuls over [b, heads, s, d] and a softmax, no SDPA op): split along the
// heads, a batch dim of both matmuls (2 heads -> 1 per rank); one all_reduce after o.
// CHECK-LABEL: func.func @eager_attention
// CHECK:         %s = ad.matmul %qt, %ktt : (tensor<1x1x?x4xf32>, tensor<1x1x4x?xf32>) -> tensor<1x1x?x?xf32>
// CHECK:         %a = ad.matmul %p, %vt : (tensor<1x1x?x?xf32>, tensor<1x1x?x4xf32>) -> tensor<1x1x?x4xf32>
// CHECK:         %o = ad.linear %ar, %wo : (tensor<1x?x4xf32>, tensor<8x4xf32>) -> tensor<1x?x8xf32>
// CHECK-NEXT:    ad.all_reduce %o "sum"
func.func @eager_attention(%x: tensor<1x?x8xf32> {ad.input = "x"}, %wq: tensor<8x8xf32> {ad.param = "attn.q.weight"}, %wk: tensor<8x8xf32> {ad.param = "attn.k.weight"}, %wv: tensor<8x8xf32> {ad.param = "attn.v.weight"}, %wo: tensor<8x8xf32> {ad.param = "attn.o.weight"}) -> tensor<1x?x8xf32> {
  %q = ad.linear %x, %wq : (tensor<1x?x8xf32>, tensor<8x8xf32>) -> tensor<1x?x8xf32>
  %k = ad.linear %x, %wk : (tensor<1x?x8xf32>, tensor<8x8xf32>) -> tensor<1x?x8xf32>
  %v = ad.linear %x, %wv : (tensor<1x?x8xf32>, tensor<8x8xf32>) -> tensor<1x?x8xf32>
  %qh = ad.reshape %q [1, -1, 2, 4] : tensor<1x?x8xf32> -> tensor<1x?x2x4xf32>
  %kh = ad.reshape %k [1, -1, 2, 4] : tensor<1x?x8xf32> -> tensor<1x?x2x4xf32>
  %vh = ad.reshape %v [1, -1, 2, 4] : tensor<1x?x8xf32> -> tensor<1x?x2x4xf32>
  %qt = ad.transpose %qh 1, 2 : tensor<1x?x2x4xf32> -> tensor<1x2x?x4xf32>
  %kt = ad.transpose %kh 1, 2 : tensor<1x?x2x4xf32> -> tensor<1x2x?x4xf32>
  %vt = ad.transpose %vh 1, 2 : tensor<1x?x2x4xf32> -> tensor<1x2x?x4xf32>
  %ktt = ad.transpose %kt 2, 3 : tensor<1x2x?x4xf32> -> tensor<1x2x4x?xf32>
  %s = ad.matmul %qt, %ktt : (tensor<1x2x?x4xf32>, tensor<1x2x4x?xf32>) -> tensor<1x2x?x?xf32>
  %p = ad.softmax %s dim -1 : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xf32>
  %a = ad.matmul %p, %vt : (tensor<1x2x?x?xf32>, tensor<1x2x?x4xf32>) -> tensor<1x2x?x4xf32>
  %at = ad.transpose %a 1, 2 : tensor<1x2x?x4xf32> -> tensor<1x?x2x4xf32>
  %ar = ad.reshape %at [1, -1, 8] : tensor<1x?x2x4xf32> -> tensor<1x?x8xf32>
  %o = ad.linear %ar, %wo : (tensor<1x?x8xf32>, tensor<8x8xf32>) -> tensor<1x?x8xf32>
  func.return %o : tensor<1x?x8xf32>
}

// -----

// A matmul whose split dim is its rows on one side and what it contracts on the other (a
// [.., 2, 4] @ [.., 4, 2] of two split linears): the block stays whole.
// CHECK-LABEL: func.func @matmul_over_the_split_dim
// CHECK-SAME:    %wa: tensor<8x8xf32> {ad.param = "blk.a.weight"}
// CHECK-NOT:     ad.all_reduce
// CHECK:         func.return
func.func @matmul_over_the_split_dim(%x: tensor<1x?x8xf32> {ad.input = "x"}, %wa: tensor<8x8xf32> {ad.param = "blk.a.weight"}, %wb: tensor<8x8xf32> {ad.param = "blk.b.weight"}, %wo: tensor<8x4xf32> {ad.param = "blk.o.weight"}) -> tensor<1x?x8xf32> {
  %a = ad.linear %x, %wa : (tensor<1x?x8xf32>, tensor<8x8xf32>) -> tensor<1x?x8xf32>
  %b = ad.linear %x, %wb : (tensor<1x?x8xf32>, tensor<8x8xf32>) -> tensor<1x?x8xf32>
  %ah = ad.reshape %a [1, -1, 2, 4] : tensor<1x?x8xf32> -> tensor<1x?x2x4xf32>
  %bh = ad.reshape %b [1, -1, 4, 2] : tensor<1x?x8xf32> -> tensor<1x?x4x2xf32>
  %m = ad.matmul %ah, %bh : (tensor<1x?x2x4xf32>, tensor<1x?x4x2xf32>) -> tensor<1x?x2x2xf32>
  %mr = ad.reshape %m [1, -1, 4] : tensor<1x?x2x2xf32> -> tensor<1x?x4xf32>
  %o = ad.linear %mr, %wo : (tensor<1x?x4xf32>, tensor<8x4xf32>) -> tensor<1x?x8xf32>
  func.return %o : tensor<1x?x8xf32>
}
