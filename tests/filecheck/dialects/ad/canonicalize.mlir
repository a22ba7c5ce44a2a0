// The `ad` canonicalization patterns, CSE and DCE; each case also shows what must stay.
// RUN: ad-opt %s -p canonicalize --split-input-file | filecheck %s

// CHECK-LABEL: func.func @identity_cast
// CHECK-NEXT: %[[C:.*]] = ad.cast %x : tensor<4x?xf32> -> tensor<4x?xbf16>
// CHECK-NEXT: func.return %x, %[[C]]
func.func @identity_cast(%x: tensor<4x?xf32>) -> (tensor<4x?xf32>, tensor<4x?xbf16>) {
  %0 = ad.cast %x : tensor<4x?xf32> -> tensor<4x?xf32>
  %1 = ad.cast %0 : tensor<4x?xf32> -> tensor<4x?xbf16>
  func.return %0, %1 : tensor<4x?xf32>, tensor<4x?xbf16>
}

// -----

// bf16 -> f32 -> bf16 is exact both ways: gone. f32 -> bf16 -> f32 rounds: stays.
// bf16 -> f32 -> f16 is one bf16 -> f16 cast.
// CHECK-LABEL: func.func @cast_chains
// CHECK-NEXT: %[[DOWN:.*]] = ad.cast %y : tensor<8xf32> -> tensor<8xbf16>
// CHECK-NEXT: %[[UP:.*]] = ad.cast %[[DOWN]] : tensor<8xbf16> -> tensor<8xf32>
// CHECK-NEXT: %[[DIRECT:.*]] = ad.cast %x : tensor<8xbf16> -> tensor<8xf16>
// CHECK-NEXT: func.return %x, %[[UP]], %[[DIRECT]]
func.func @cast_chains(%x: tensor<8xbf16>, %y: tensor<8xf32>) -> (tensor<8xbf16>, tensor<8xf32>, tensor<8xf16>) {
  %0 = ad.cast %x : tensor<8xbf16> -> tensor<8xf32>
  %1 = ad.cast %0 : tensor<8xf32> -> tensor<8xbf16>
  %2 = ad.cast %y : tensor<8xf32> -> tensor<8xbf16>
  %3 = ad.cast %2 : tensor<8xbf16> -> tensor<8xf32>
  %4 = ad.cast %0 : tensor<8xf32> -> tensor<8xf16>
  func.return %1, %3, %4 : tensor<8xbf16>, tensor<8xf32>, tensor<8xf16>
}

// -----

// x*1, 1*x, x+0, x-0, x/1 go when the result keeps x's type; an integer tensor times 1.0
// is float, and 0 + x with alpha 2 is 2x: those stay.
// CHECK-LABEL: func.func @neutral_scalars
// CHECK-NEXT: %[[ONE:.*]] = ad.constant 1.000000e+00 : f64
// CHECK-NEXT: %[[ZERO:.*]] = ad.constant 0 : i64
// CHECK-NEXT: %[[PROMOTED:.*]] = ad.mul %i, %[[ONE]] : tensor<4xi64>, f64 -> tensor<4xf32>
// CHECK-NEXT: %[[SCALED:.*]] = ad.add %[[ZERO]], %x alpha 2 : i64 : i64, tensor<4xf32> -> tensor<4xf32>
// CHECK-NEXT: func.return %x, %x, %x, %x, %x, %[[PROMOTED]], %[[SCALED]]
func.func @neutral_scalars(%x: tensor<4xf32>, %i: tensor<4xi64>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) {
  %one = ad.constant 1.000000e+00 : f64
  %zero = ad.constant 0 : i64
  %0 = ad.mul %x, %one : tensor<4xf32>, f64 -> tensor<4xf32>
  %1 = ad.mul %one, %x : f64, tensor<4xf32> -> tensor<4xf32>
  %2 = ad.add %x, %zero alpha 3 : i64 : tensor<4xf32>, i64 -> tensor<4xf32>
  %3 = ad.sub %x, %zero : tensor<4xf32>, i64 -> tensor<4xf32>
  %4 = ad.div %x, %one : tensor<4xf32>, f64 -> tensor<4xf32>
  %5 = ad.mul %i, %one : tensor<4xi64>, f64 -> tensor<4xf32>
  %6 = ad.add %zero, %x alpha 2 : i64 : i64, tensor<4xf32> -> tensor<4xf32>
  func.return %0, %1, %2, %3, %4, %5, %6 : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
}

// -----

// A broadcasting x + 0 changes the shape: it stays.
// CHECK-LABEL: func.func @broadcasting_add_zero
// CHECK: ad.add %x, %{{.*}} : tensor<1x4xf32>, tensor<3x4xf32> -> tensor<3x4xf32>
func.func @broadcasting_add_zero(%x: tensor<1x4xf32>) -> tensor<3x4xf32> {
  %zero = ad.constant 0.000000e+00 : f64
  %z = ad.constant 0 : i64
  %3 = ad.constant 3 : i64
  %zeros = ad.full [3, 4], %zero : f64 -> tensor<3x4xf32>
  %0 = ad.add %x, %zeros : tensor<1x4xf32>, tensor<3x4xf32> -> tensor<3x4xf32>
  func.return %0 : tensor<3x4xf32>
}

// -----

// CHECK-LABEL: func.func @double_neg
// CHECK-NEXT: %[[N:.*]] = ad.neg %x
// CHECK-NEXT: func.return %x, %[[N]]
func.func @double_neg(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %0 = ad.neg %x : tensor<4xf32> -> tensor<4xf32>
  %1 = ad.neg %0 : tensor<4xf32> -> tensor<4xf32>
  %2 = ad.neg %1 : tensor<4xf32> -> tensor<4xf32>
  func.return %1, %2 : tensor<4xf32>, tensor<4xf32>
}

// -----

// No-op views go; real ones stay. A reshape between two types with two dynamic dims may
// move elements between them: it stays.
// CHECK-LABEL: func.func @views
// CHECK-NEXT: %[[R:.*]] = ad.reshape %x [%s, 8] : tensor<2x?x4xf32> -> tensor<?x8xf32>
// CHECK-NEXT: %[[T:.*]] = ad.transpose %x 0, 1
// CHECK-NEXT: %[[S:.*]] = ad.slice %x dim 2 [0, 3, 1]
// CHECK-NEXT: %[[E:.*]] = ad.expand %y [2, %s, 4] : tensor<2x1x4xf32> -> tensor<2x?x4xf32>
// CHECK-NEXT: %[[D:.*]] = ad.reshape %z [%s, %t] : tensor<?x?xf32> -> tensor<?x?xf32>
// CHECK-NEXT: func.return %x, %x, %x, %x, %x, %x, %x, %[[R]], %[[T]], %[[S]], %[[E]], %[[D]]
func.func @views(%x: tensor<2x?x4xf32>, %y: tensor<2x1x4xf32>, %z: tensor<?x?xf32>, %s: index, %t: index) -> (tensor<2x?x4xf32>, tensor<2x?x4xf32>, tensor<2x?x4xf32>, tensor<2x?x4xf32>, tensor<2x?x4xf32>, tensor<2x?x4xf32>, tensor<2x?x4xf32>, tensor<?x8xf32>, tensor<?x2x4xf32>, tensor<2x?x3xf32>, tensor<2x?x4xf32>, tensor<?x?xf32>) {
  %0 = ad.reshape %x [2, %s, 4] : tensor<2x?x4xf32> -> tensor<2x?x4xf32>
  %1 = ad.permute %x [0, 1, 2] : tensor<2x?x4xf32> -> tensor<2x?x4xf32>
  %2 = ad.transpose %x -1, 2 : tensor<2x?x4xf32> -> tensor<2x?x4xf32>
  %3 = ad.expand %x [-1, -1, 4] : tensor<2x?x4xf32> -> tensor<2x?x4xf32>
  %4 = ad.slice %x dim 2 [0, 9223372036854775807, 1] : tensor<2x?x4xf32> -> tensor<2x?x4xf32>
  %5 = ad.slice %x dim 0 [0, 2, 1] : tensor<2x?x4xf32> -> tensor<2x?x4xf32>
  %6 = ad.alias %x : tensor<2x?x4xf32> -> tensor<2x?x4xf32>
  %7 = ad.reshape %x [%s, 8] : tensor<2x?x4xf32> -> tensor<?x8xf32>
  %8 = ad.transpose %x 0, 1 : tensor<2x?x4xf32> -> tensor<?x2x4xf32>
  %9 = ad.slice %x dim 2 [0, 3, 1] : tensor<2x?x4xf32> -> tensor<2x?x3xf32>
  %10 = ad.expand %y [2, %s, 4] : tensor<2x1x4xf32> -> tensor<2x?x4xf32>
  %11 = ad.reshape %z [%s, %t] : tensor<?x?xf32> -> tensor<?x?xf32>
  func.return %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11 : tensor<2x?x4xf32>, tensor<2x?x4xf32>, tensor<2x?x4xf32>, tensor<2x?x4xf32>, tensor<2x?x4xf32>, tensor<2x?x4xf32>, tensor<2x?x4xf32>, tensor<?x8xf32>, tensor<?x2x4xf32>, tensor<2x?x3xf32>, tensor<2x?x4xf32>, tensor<?x?xf32>
}

// -----

// An expand to a dynamic size may broadcast a dynamic dim of size 1: it stays.
// CHECK-LABEL: func.func @dynamic_expand
// CHECK-NEXT: ad.expand %x [%s, 4]
func.func @dynamic_expand(%x: tensor<?x4xf32>, %s: index) -> tensor<?x4xf32> {
  %0 = ad.expand %x [%s, 4] : tensor<?x4xf32> -> tensor<?x4xf32>
  func.return %0 : tensor<?x4xf32>
}

// -----

// CHECK-LABEL: func.func @reshape_chain
// CHECK-NEXT: %[[R:.*]] = ad.reshape %x [4, 6] : tensor<2x3x4xf32> -> tensor<4x6xf32>
// CHECK-NEXT: func.return %[[R]]
func.func @reshape_chain(%x: tensor<2x3x4xf32>) -> tensor<4x6xf32> {
  %0 = ad.reshape %x [6, 4] : tensor<2x3x4xf32> -> tensor<6x4xf32>
  %1 = ad.reshape %0 [4, 6] : tensor<6x4xf32> -> tensor<4x6xf32>
  func.return %1 : tensor<4x6xf32>
}

// -----

// Metadata assertions and eval-mode dropout compute nothing; other opaque ops stay.
// CHECK-LABEL: func.func @opaque
// CHECK-NOT: _assert_tensor_metadata
// CHECK-NOT: aten.dropout
// CHECK: %[[C:.*]] = ad.torch_op "aten.cumsum.default"(%x)
// CHECK-NEXT: func.return %x, %[[C]]
func.func @opaque(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  ad.torch_op "aten._assert_tensor_metadata.default"(%x) [#ad.ref<0>] {dtype = f32} : (tensor<4xf32>) -> ()
  %0 = ad.torch_op "aten.dropout.default"(%x) [#ad.ref<0>, 1.000000e-01 : f64, false] {} : (tensor<4xf32>) -> tensor<4xf32>
  %1 = ad.torch_op "aten.cumsum.default"(%x) [#ad.ref<0>, 0 : i64] {} : (tensor<4xf32>) -> tensor<4xf32>
  func.return %0, %1 : tensor<4xf32>, tensor<4xf32>
}

// -----

// Training-mode dropout is random: it stays.
// CHECK-LABEL: func.func @train_dropout
// CHECK-NEXT: ad.torch_op "aten.dropout.default"
func.func @train_dropout(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = ad.torch_op "aten.dropout.default"(%x) [#ad.ref<0>, 1.000000e-01 : f64, true] {} : (tensor<4xf32>) -> tensor<4xf32>
  func.return %0 : tensor<4xf32>
}

// -----

// CSE merges equal pure ops (and constants); DCE drops unused pure ops.
// CHECK-LABEL: func.func @cse_dce
// CHECK-NEXT: %[[C:.*]] = ad.constant 2.000000e+00 : f64
// CHECK-NEXT: %[[M:.*]] = ad.mul %x, %[[C]]
// CHECK-NEXT: %[[S:.*]] = ad.add %[[M]], %[[M]]
// CHECK-NEXT: func.return %[[S]]
func.func @cse_dce(%x: tensor<4xf32>) -> tensor<4xf32> {
  %c0 = ad.constant 2.000000e+00 : f64
  %c1 = ad.constant 2.000000e+00 : f64
  %0 = ad.mul %x, %c0 : tensor<4xf32>, f64 -> tensor<4xf32>
  %1 = ad.mul %x, %c1 : tensor<4xf32>, f64 -> tensor<4xf32>
  %dead = ad.exp %x : tensor<4xf32> -> tensor<4xf32>
  %2 = ad.add %0, %1 : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  func.return %2 : tensor<4xf32>
}

// -----

// i32 -> f64 is exact, but f64 -> i8 of an out-of-range value is not i32 -> i8 wrap-around:
// that chain stays; i32 -> f64 -> i32 and i32 -> f64 -> f32 fold.
// CHECK-LABEL: func.func @int_float_int
// CHECK-NEXT: %[[W:.*]] = ad.cast %x : tensor<4xi32> -> tensor<4xf64>
// CHECK-NEXT: %[[N:.*]] = ad.cast %[[W]] : tensor<4xf64> -> tensor<4xi8>
// CHECK-NEXT: %[[F:.*]] = ad.cast %x : tensor<4xi32> -> tensor<4xf32>
// CHECK-NEXT: func.return %x, %[[N]], %[[F]]
func.func @int_float_int(%x: tensor<4xi32>) -> (tensor<4xi32>, tensor<4xi8>, tensor<4xf32>) {
  %0 = ad.cast %x : tensor<4xi32> -> tensor<4xf64>
  %1 = ad.cast %0 : tensor<4xf64> -> tensor<4xi32>
  %2 = ad.cast %0 : tensor<4xf64> -> tensor<4xi8>
  %3 = ad.cast %0 : tensor<4xf64> -> tensor<4xf32>
  func.return %1, %2, %3 : tensor<4xi32>, tensor<4xi8>, tensor<4xf32>
}

// -----

// x @ w.T (Falcon's FalconLinear: aten.numpy_T), w.t(), transpose and permute of a matrix:
// linear(x, w); the opaque transposes go with their last reader. A transpose read elsewhere
// too stays for that reader; a batched (3-D) transposed operand and a plain matrix stay. The
// three spellings of x @ w.T become one linear (CSE).
// CHECK-LABEL: func.func @matmul_of_transposed_matrix
// CHECK-NEXT:    %a = ad.linear %x, %w : (tensor<1x?x64xf32>, tensor<32x64xf32>) -> tensor<1x?x32xf32>
// CHECK-NEXT:    %t2 = ad.torch_op "aten.t.default"(%v)
// CHECK-NEXT:    %d = ad.linear %x, %v : (tensor<1x?x64xf32>, tensor<32x64xf32>) -> tensor<1x?x32xf32>
// CHECK-NEXT:    %bt = ad.transpose %bw -1, -2
// CHECK-NEXT:    %e = ad.matmul %y, %bt
// CHECK-NEXT:    %f = ad.matmul %x, %m
// CHECK-NEXT:    func.return %a, %a, %a, %d, %t2, %e, %f
// CHECK-NOT:     numpy_T
func.func @matmul_of_transposed_matrix(%x: tensor<1x?x64xf32>, %w: tensor<32x64xf32>, %v: tensor<32x64xf32>, %y: tensor<2x5x64xf32>, %bw: tensor<2x32x64xf32>, %m: tensor<64x32xf32>) -> (tensor<1x?x32xf32>, tensor<1x?x32xf32>, tensor<1x?x32xf32>, tensor<1x?x32xf32>, tensor<64x32xf32>, tensor<2x5x32xf32>, tensor<1x?x32xf32>) {
  %t = ad.torch_op "aten.numpy_T.default"(%w) [#ad.ref<0>] {} : (tensor<32x64xf32>) -> tensor<64x32xf32>
  %a = ad.matmul %x, %t : (tensor<1x?x64xf32>, tensor<64x32xf32>) -> tensor<1x?x32xf32>
  %t1 = ad.transpose %w 0, 1 : tensor<32x64xf32> -> tensor<64x32xf32>
  %b = ad.matmul %x, %t1 : (tensor<1x?x64xf32>, tensor<64x32xf32>) -> tensor<1x?x32xf32>
  %p = ad.permute %w [1, 0] : tensor<32x64xf32> -> tensor<64x32xf32>
  %c = ad.matmul %x, %p : (tensor<1x?x64xf32>, tensor<64x32xf32>) -> tensor<1x?x32xf32>
  %t2 = ad.torch_op "aten.t.default"(%v) [#ad.ref<0>] {} : (tensor<32x64xf32>) -> tensor<64x32xf32>
  %d = ad.matmul %x, %t2 : (tensor<1x?x64xf32>, tensor<64x32xf32>) -> tensor<1x?x32xf32>
  %bt = ad.transpose %bw -1, -2 : tensor<2x32x64xf32> -> tensor<2x64x32xf32>
  %e = ad.matmul %y, %bt : (tensor<2x5x64xf32>, tensor<2x64x32xf32>) -> tensor<2x5x32xf32>
  %f = ad.matmul %x, %m : (tensor<1x?x64xf32>, tensor<64x32xf32>) -> tensor<1x?x32xf32>
  func.return %a, %b, %c, %d, %t2, %e, %f : tensor<1x?x32xf32>, tensor<1x?x32xf32>, tensor<1x?x32xf32>, tensor<1x?x32xf32>, tensor<64x32xf32>, tensor<2x5x32xf32>, tensor<1x?x32xf32>
}

// -----

// Collectives communicate: canonicalize (CSE, DCE) keeps every one, even unused or repeated.
// CHECK-LABEL: func.func @collectives_stay
// CHECK-NEXT:    ad.all_reduce %x "sum" group "0"
// CHECK-NEXT:    ad.all_reduce %x "sum" group "0"
// CHECK-NEXT:    func.return
func.func @collectives_stay(%x: tensor<4xf32>) {
  %0 = ad.all_reduce %x "sum" group "0" : tensor<4xf32> -> tensor<4xf32>
  %1 = ad.all_reduce %x "sum" group "0" : tensor<4xf32> -> tensor<4xf32>
  func.return
}

// -----

// AOTAutograd's linears (torch.compile): mm(x2d, w.t()) and addmm(b, x2d, w.t()) are linears;
// one over rows flattened out of [batch, seq, h] and viewed back after becomes the linear over
// [batch, seq, h], its views folded (as a torch.export graph has it). Rows used flat (an MoE
// block's tokens) stay flat; an addmm with beta != 1 stays.
// CHECK-LABEL: func.func @aot_linears
// CHECK-NEXT:    %flat = ad.reshape %x [10, 64]
// CHECK-NEXT:    %[[Q:.*]] = ad.linear %x, %w : (tensor<2x5x64xf32>, tensor<32x64xf32>) -> tensor<2x5x32xf32>
// CHECK-NEXT:    %heads = ad.reshape %[[Q]] [2, 5, -1, 8] : tensor<2x5x32xf32> -> tensor<2x5x4x8xf32>
// CHECK-NEXT:    %biased = ad.linear %flat, %w bias %b : (tensor<10x64xf32>, tensor<32x64xf32>, tensor<32xf32>) -> tensor<10x32xf32>
// CHECK-NEXT:    %t2 = ad.torch_op "aten.t.default"(%w)
// CHECK-NEXT:    %scaled = ad.addmm %b, %flat, %t2 beta 2 : i64 :
// CHECK-NEXT:    func.return %heads, %biased, %scaled
// CHECK-NOT:     ad.mm
func.func @aot_linears(%x: tensor<2x5x64xf32>, %w: tensor<32x64xf32>, %b: tensor<32xf32>) -> (tensor<2x5x4x8xf32>, tensor<10x32xf32>, tensor<10x32xf32>) {
  %flat = ad.reshape %x [10, 64] : tensor<2x5x64xf32> -> tensor<10x64xf32>
  %t = ad.torch_op "aten.t.default"(%w) [#ad.ref<0>] {} : (tensor<32x64xf32>) -> tensor<64x32xf32>
  %q = ad.mm %flat, %t : (tensor<10x64xf32>, tensor<64x32xf32>) -> tensor<10x32xf32>
  %heads = ad.reshape %q [2, 5, -1, 8] : tensor<10x32xf32> -> tensor<2x5x4x8xf32>
  %t1 = ad.torch_op "aten.t.default"(%w) [#ad.ref<0>] {} : (tensor<32x64xf32>) -> tensor<64x32xf32>
  %biased = ad.addmm %b, %flat, %t1 : (tensor<32xf32>, tensor<10x64xf32>, tensor<64x32xf32>) -> tensor<10x32xf32>
  %t2 = ad.torch_op "aten.t.default"(%w) [#ad.ref<0>] {} : (tensor<32x64xf32>) -> tensor<64x32xf32>
  %scaled = ad.addmm %b, %flat, %t2 beta 2 : i64 : (tensor<32xf32>, tensor<10x64xf32>, tensor<64x32xf32>) -> tensor<10x32xf32>
  func.return %heads, %biased, %scaled : tensor<2x5x4x8xf32>, tensor<10x32xf32>, tensor<10x32xf32>
}

// -----

// The SDPA backend ops AOTAutograd leaves (the CPU flash op with its mask and scale, the
// efficient op with is_causal) are ad.attention when their extra results are unused; the math
// op whose probabilities are read stays. A boolean mask that torch made where(m, 0, -inf) for
// the backend op is the boolean mask again (its fills go). Fewer key/value heads than query
// heads, which the fused backends take as they are, are grouped-query attention.
// CHECK-LABEL: func.func @sdpa_backends
// CHECK-NEXT:    %flash = ad.attention %q, %k, %v mask %mask scale 2.500000e-01 : f64 :
// CHECK-NEXT:    %efficient = ad.attention %q, %k, %v causal :
// CHECK-NEXT:    %math, %probs = ad.torch_op "aten._scaled_dot_product_attention_math.default"
// CHECK-NEXT:    %boolean = ad.attention %q, %k, %v mask %m : (tensor<1x2x5x8xf32>, tensor<1x2x5x8xf32>, tensor<1x2x5x8xf32>, tensor<1x1x5x5xi1>)
// CHECK-NEXT:    %grouped = ad.attention %q, %k1, %k1 causal gqa : (tensor<1x2x5x8xf32>, tensor<1x1x5x8xf32>, tensor<1x1x5x8xf32>)
// CHECK-NEXT:    func.return %flash, %efficient, %math, %probs, %boolean, %grouped
func.func @sdpa_backends(%q: tensor<1x2x5x8xf32>, %k: tensor<1x2x5x8xf32>, %v: tensor<1x2x5x8xf32>, %mask: tensor<1x1x5x5xf32>, %m: tensor<1x1x5x5xi1>, %k1: tensor<1x1x5x8xf32>) -> (tensor<1x2x5x8xf32>, tensor<1x2x5x8xf32>, tensor<1x2x5x8xf32>, tensor<1x2x5x5xf32>, tensor<1x2x5x8xf32>, tensor<1x2x5x8xf32>) {
  %flash, %lse = ad.torch_op "aten._scaled_dot_product_flash_attention_for_cpu.default"(%q, %k, %v, %mask) [#ad.ref<0>, #ad.ref<1>, #ad.ref<2>] {attn_mask = #ad.ref<3>, scale = 2.500000e-01 : f64} unpack : (tensor<1x2x5x8xf32>, tensor<1x2x5x8xf32>, tensor<1x2x5x8xf32>, tensor<1x1x5x5xf32>) -> (tensor<1x2x5x8xf32>, tensor<1x2x5xf32>)
  %efficient, %lse2, %seed, %offset = ad.torch_op "aten._scaled_dot_product_efficient_attention.default"(%q, %k, %v) [#ad.ref<0>, #ad.ref<1>, #ad.ref<2>, none, false, 0.000000e+00 : f64, true] {} unpack : (tensor<1x2x5x8xf32>, tensor<1x2x5x8xf32>, tensor<1x2x5x8xf32>) -> (tensor<1x2x5x8xf32>, tensor<1x2x5xf32>, tensor<i64>, tensor<i64>)
  %math, %probs = ad.torch_op "aten._scaled_dot_product_attention_math.default"(%q, %k, %v) [#ad.ref<0>, #ad.ref<1>, #ad.ref<2>] {} unpack : (tensor<1x2x5x8xf32>, tensor<1x2x5x8xf32>, tensor<1x2x5x8xf32>) -> (tensor<1x2x5x8xf32>, tensor<1x2x5x5xf32>)
  %ninf = ad.torch_op "aten.scalar_tensor.default"() [0xfff0000000000000 : f64] {dtype = f32} : () -> tensor<f32>
  %zero = ad.torch_op "aten.scalar_tensor.default"() [0.000000e+00 : f64] {dtype = f32} : () -> tensor<f32>
  %additive = ad.where %m, %zero, %ninf : tensor<1x1x5x5xi1>, tensor<f32>, tensor<f32> -> tensor<1x1x5x5xf32>
  %boolean, %lse3 = ad.torch_op "aten._scaled_dot_product_flash_attention_for_cpu.default"(%q, %k, %v, %additive) [#ad.ref<0>, #ad.ref<1>, #ad.ref<2>] {attn_mask = #ad.ref<3>} unpack : (tensor<1x2x5x8xf32>, tensor<1x2x5x8xf32>, tensor<1x2x5x8xf32>, tensor<1x1x5x5xf32>) -> (tensor<1x2x5x8xf32>, tensor<1x2x5xf32>)
  %grouped, %lse4 = ad.torch_op "aten._scaled_dot_product_flash_attention_for_cpu.default"(%q, %k1, %k1) [#ad.ref<0>, #ad.ref<1>, #ad.ref<2>, 0.000000e+00 : f64, true] {} unpack : (tensor<1x2x5x8xf32>, tensor<1x1x5x8xf32>, tensor<1x1x5x8xf32>) -> (tensor<1x2x5x8xf32>, tensor<1x2x5xf32>)
  func.return %flash, %efficient, %math, %probs, %boolean, %grouped : tensor<1x2x5x8xf32>, tensor<1x2x5x8xf32>, tensor<1x2x5x8xf32>, tensor<1x2x5x5xf32>, tensor<1x2x5x8xf32>, tensor<1x2x5x8xf32>
}

// -----

// SDPA as torch's math backend writes it out (AOTAutograd's form where no fused backend takes
// the call: one key/value head broadcast over the query heads) is ad.attention: q and k^T each
// scaled by sqrt(scale) (here the default 8^-0.5), the matmuls broadcasting k and v, a boolean
// mask as where(m, 0, -inf), _safe_softmax; bf16 q, k, v computed in f32 and cast back, with
// its scale (0.5^2). Probabilities read elsewhere, or q and k scaled by different numbers, stay.
// CHECK-LABEL: func.func @math_sdpa
// CHECK-NOT:     scalar_tensor
// CHECK:         %out = ad.attention %q, %k, %v mask %m : (tensor<1x4x5x8xf32>, tensor<1x1x5x8xf32>, tensor<1x1x5x8xf32>, tensor<1x1x5x5xi1>) -> tensor<1x4x5x8xf32>
// CHECK-NEXT:    %half_root = ad.constant
// CHECK-NEXT:    %half = ad.attention %hq, %hk, %hk scale 2.500000e-01 : f64 : (tensor<1x4x5x8xbf16>, tensor<1x4x5x8xbf16>, tensor<1x4x5x8xbf16>) -> tensor<1x4x5x8xbf16>
// CHECK-NEXT:    %qs2 = ad.mul %q, %root
// CHECK-NEXT:    %s2 = ad.matmul %qs2, %kb
// CHECK-NEXT:    %p2 = ad.torch_op "aten._safe_softmax.default"(%s2)
// CHECK-NEXT:    %read = ad.matmul %p2, %vb
// CHECK-NEXT:    %qs3 = ad.mul %q, %half_root
// CHECK-NEXT:    %s3 = ad.matmul %qs3, %kb
// CHECK-NEXT:    %p3 = ad.torch_op "aten._safe_softmax.default"(%s3)
// CHECK-NEXT:    %other = ad.matmul %p3, %vb
// CHECK-NEXT:    func.return %out, %half, %read, %p2, %other
func.func @math_sdpa(%q: tensor<1x4x5x8xf32>, %k: tensor<1x1x5x8xf32>, %v: tensor<1x1x5x8xf32>, %m: tensor<1x1x5x5xi1>, %hq: tensor<1x4x5x8xbf16>, %hk: tensor<1x4x5x8xbf16>) -> (tensor<1x4x5x8xf32>, tensor<1x4x5x8xbf16>, tensor<1x4x5x8xf32>, tensor<1x4x5x5xf32>, tensor<1x4x5x8xf32>) {
  %root = ad.constant 0.5946035575013605 : f64
  %ninf = ad.torch_op "aten.scalar_tensor.default"() [0xfff0000000000000 : f64] {dtype = f32} : () -> tensor<f32>
  %zero = ad.torch_op "aten.scalar_tensor.default"() [0.000000e+00 : f64] {dtype = f32} : () -> tensor<f32>
  %mask = ad.where %m, %zero, %ninf : tensor<1x1x5x5xi1>, tensor<f32>, tensor<f32> -> tensor<1x1x5x5xf32>
  %qs = ad.mul %q, %root : tensor<1x4x5x8xf32>, f64 -> tensor<1x4x5x8xf32>
  %kt = ad.transpose %k -2, -1 : tensor<1x1x5x8xf32> -> tensor<1x1x8x5xf32>
  %ks = ad.mul %kt, %root : tensor<1x1x8x5xf32>, f64 -> tensor<1x1x8x5xf32>
  %kb = ad.expand %ks [1, 4, 8, 5] : tensor<1x1x8x5xf32> -> tensor<1x4x8x5xf32>
  %s = ad.matmul %qs, %kb : (tensor<1x4x5x8xf32>, tensor<1x4x8x5xf32>) -> tensor<1x4x5x5xf32>
  %x = ad.add %s, %mask : tensor<1x4x5x5xf32>, tensor<1x1x5x5xf32> -> tensor<1x4x5x5xf32>
  %p = ad.torch_op "aten._safe_softmax.default"(%x) [#ad.ref<0>, -1 : i64] {} : (tensor<1x4x5x5xf32>) -> tensor<1x4x5x5xf32>
  %vb = ad.expand %v [1, 4, 5, 8] : tensor<1x1x5x8xf32> -> tensor<1x4x5x8xf32>
  %out = ad.matmul %p, %vb : (tensor<1x4x5x5xf32>, tensor<1x4x5x8xf32>) -> tensor<1x4x5x8xf32>
  %half_root = ad.constant 0.5 : f64
  %fq = ad.cast %hq : tensor<1x4x5x8xbf16> -> tensor<1x4x5x8xf32>
  %fk = ad.cast %hk : tensor<1x4x5x8xbf16> -> tensor<1x4x5x8xf32>
  %fq2 = ad.mul %fq, %half_root : tensor<1x4x5x8xf32>, f64 -> tensor<1x4x5x8xf32>
  %fkt = ad.transpose %fk -2, -1 : tensor<1x4x5x8xf32> -> tensor<1x4x8x5xf32>
  %fk2 = ad.mul %fkt, %half_root : tensor<1x4x8x5xf32>, f64 -> tensor<1x4x8x5xf32>
  %fs = ad.matmul %fq2, %fk2 : (tensor<1x4x5x8xf32>, tensor<1x4x8x5xf32>) -> tensor<1x4x5x5xf32>
  %fp = ad.torch_op "aten._safe_softmax.default"(%fs) [#ad.ref<0>, -1 : i64] {} : (tensor<1x4x5x5xf32>) -> tensor<1x4x5x5xf32>
  %fv = ad.cast %hk : tensor<1x4x5x8xbf16> -> tensor<1x4x5x8xf32>
  %fo = ad.matmul %fp, %fv : (tensor<1x4x5x5xf32>, tensor<1x4x5x8xf32>) -> tensor<1x4x5x8xf32>
  %half = ad.cast %fo : tensor<1x4x5x8xf32> -> tensor<1x4x5x8xbf16>
  %qs2 = ad.mul %q, %root : tensor<1x4x5x8xf32>, f64 -> tensor<1x4x5x8xf32>
  %s2 = ad.matmul %qs2, %kb : (tensor<1x4x5x8xf32>, tensor<1x4x8x5xf32>) -> tensor<1x4x5x5xf32>
  %p2 = ad.torch_op "aten._safe_softmax.default"(%s2) [#ad.ref<0>, -1 : i64] {} : (tensor<1x4x5x5xf32>) -> tensor<1x4x5x5xf32>
  %read = ad.matmul %p2, %vb : (tensor<1x4x5x5xf32>, tensor<1x4x5x8xf32>) -> tensor<1x4x5x8xf32>
  %qs3 = ad.mul %q, %half_root : tensor<1x4x5x8xf32>, f64 -> tensor<1x4x5x8xf32>
  %s3 = ad.matmul %qs3, %kb : (tensor<1x4x5x8xf32>, tensor<1x4x8x5xf32>) -> tensor<1x4x5x5xf32>
  %p3 = ad.torch_op "aten._safe_softmax.default"(%s3) [#ad.ref<0>, -1 : i64] {} : (tensor<1x4x5x5xf32>) -> tensor<1x4x5x5xf32>
  %other = ad.matmul %p3, %vb : (tensor<1x4x5x5xf32>, tensor<1x4x5x8xf32>) -> tensor<1x4x5x8xf32>
  func.return %out, %half, %read, %p2, %other : tensor<1x4x5x8xf32>, tensor<1x4x5x8xbf16>, tensor<1x4x5x8xf32>, tensor<1x4x5x5xf32>, tensor<1x4x5x8xf32>
}

// -----

// An in-place binary op on a value an op computed as a tensor of its own, read nowhere else,
// is the functional op (torch.export keeps `x += y` on an intermediate). In place on an
// argument (the caller's tensor), on a value read again, on a view, or with another element
// type, it stays.
// CHECK-LABEL: func.func @in_place_binary
// CHECK-NEXT:    %x = ad.mul %a, %b
// CHECK-NEXT:    %added = ad.add %x, %b : tensor<2x4xf32>, tensor<2x4xf32> -> tensor<2x4xf32>
// CHECK-NEXT:    %arg = ad.torch_op "aten.add_.Tensor"(%a, %b)
// CHECK-NEXT:    %y = ad.sub %a, %b
// CHECK-NEXT:    %read = ad.torch_op "aten.mul_.Tensor"(%y, %b)
// CHECK-NEXT:    %v = ad.transpose %a 0, 1
// CHECK-NEXT:    %view = ad.torch_op "aten.sub_.Tensor"(%v, %c)
// CHECK-NEXT:    %z = ad.add %a, %b
// CHECK-NEXT:    %mixed = ad.torch_op "aten.div_.Tensor"(%z, %h)
// CHECK-NEXT:    func.return %added, %arg, %read, %y, %view, %mixed
func.func @in_place_binary(%a: tensor<2x4xf32>, %b: tensor<2x4xf32>, %c: tensor<4x2xf32>, %h: tensor<2x4xbf16>) -> (tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<4x2xf32>, tensor<2x4xf32>) {
  %x = ad.mul %a, %b : tensor<2x4xf32>, tensor<2x4xf32> -> tensor<2x4xf32>
  %added = ad.torch_op "aten.add_.Tensor"(%x, %b) [#ad.ref<0>, #ad.ref<1>] {} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  %arg = ad.torch_op "aten.add_.Tensor"(%a, %b) [#ad.ref<0>, #ad.ref<1>] {} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  %y = ad.sub %a, %b : tensor<2x4xf32>, tensor<2x4xf32> -> tensor<2x4xf32>
  %read = ad.torch_op "aten.mul_.Tensor"(%y, %b) [#ad.ref<0>, #ad.ref<1>] {} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  %v = ad.transpose %a 0, 1 : tensor<2x4xf32> -> tensor<4x2xf32>
  %view = ad.torch_op "aten.sub_.Tensor"(%v, %c) [#ad.ref<0>, #ad.ref<1>] {} : (tensor<4x2xf32>, tensor<4x2xf32>) -> tensor<4x2xf32>
  %z = ad.add %a, %b : tensor<2x4xf32>, tensor<2x4xf32> -> tensor<2x4xf32>
  %mixed = ad.torch_op "aten.div_.Tensor"(%z, %h) [#ad.ref<0>, #ad.ref<1>] {} : (tensor<2x4xf32>, tensor<2x4xbf16>) -> tensor<2x4xf32>
  func.return %added, %arg, %read, %y, %view, %mixed : tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<4x2xf32>, tensor<2x4xf32>
}

// -----

// reshape_as / view_as is a reshape to the other tensor's shape, one unknown size as -1; with
// two unknown sizes it stays.
// CHECK-LABEL: func.func @reshape_as
// CHECK-NEXT:    %r = ad.reshape %x [1, -1, 32] : tensor<1x?x16x2xf32> -> tensor<1x?x32xf32>
// CHECK-NEXT:    %two = ad.torch_op "aten.view_as.default"(%z, %w)
// CHECK-NEXT:    func.return %r, %two
func.func @reshape_as(%x: tensor<1x?x16x2xf32>, %y: tensor<1x?x32xf32>, %z: tensor<?x?x2xf32>, %w: tensor<?x?xf32>) -> (tensor<1x?x32xf32>, tensor<?x?xf32>) {
  %r = ad.torch_op "aten.reshape_as.default"(%x, %y) [#ad.ref<0>, #ad.ref<1>] {} : (tensor<1x?x16x2xf32>, tensor<1x?x32xf32>) -> tensor<1x?x32xf32>
  %two = ad.torch_op "aten.view_as.default"(%z, %w) [#ad.ref<0>, #ad.ref<1>] {} : (tensor<?x?x2xf32>, tensor<?x?xf32>) -> tensor<?x?xf32>
  func.return %r, %two : tensor<1x?x32xf32>, tensor<?x?xf32>
}

// -----

// A clone is its input's value (repeat_kv's clone before the view, through torch.compile); a
// clone the function returns stays. A cat drops operands with no extent along its dim, and
// torch.cat's legacy empty operand (1-D, size 0: XLM's empty cache) at any rank and dim; a
// cat of one operand is that operand.
// CHECK-LABEL: func.func @clones_and_empty_cats
// CHECK-NEXT:    %kept = ad.clone %x
// CHECK-NEXT:    %cat = ad.cat %x, %x dim 1 : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x8xf32>
// CHECK-NEXT:    func.return %x, %kept, %x, %cat, %x, %v
func.func @clones_and_empty_cats(%x: tensor<2x4xf32>, %e: tensor<2x0xf32>, %z: tensor<0xf32>, %v: tensor<3xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x8xf32>, tensor<2x4xf32>, tensor<3xf32>) {
  %c = ad.clone %x : tensor<2x4xf32> -> tensor<2x4xf32>
  %r = ad.reshape %c [2, 4] : tensor<2x4xf32> -> tensor<2x4xf32>
  %kept = ad.clone %x : tensor<2x4xf32> -> tensor<2x4xf32>
  %one = ad.cat %x, %e dim 1 : (tensor<2x4xf32>, tensor<2x0xf32>) -> tensor<2x4xf32>
  %cat = ad.cat %x, %e, %x dim 1 : (tensor<2x4xf32>, tensor<2x0xf32>, tensor<2x4xf32>) -> tensor<2x8xf32>
  %legacy = ad.cat %z, %x dim 1 : (tensor<0xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  %flat = ad.cat %z, %v dim 0 : (tensor<0xf32>, tensor<3xf32>) -> tensor<3xf32>
  func.return %r, %kept, %one, %cat, %legacy, %flat : tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x8xf32>, tensor<2x4xf32>, tensor<3xf32>
}

// -----

// A 4-D matmul as AOTAutograd writes it out (operands viewed as [batch * heads] rows, bmm, the
// result viewed back) is the matmul over [batch, heads] (Gemma2's eager scores through
// torch.compile); the operands' views fold. A bmm whose result is not viewed back stays.
// CHECK-LABEL: func.func @bmm_over_merged_batch
// CHECK-NEXT:    %q3 = ad.reshape %q [4, 9, 32]
// CHECK-NEXT:    %k3 = ad.reshape %kt [4, 32, 9]
// CHECK-NEXT:    %s = ad.matmul %q, %kt : (tensor<1x4x9x32xf32>, tensor<1x4x32x9xf32>) -> tensor<1x4x9x9xf32>
// CHECK-NEXT:    %flat = ad.bmm %q3, %k3
// CHECK-NEXT:    func.return %s, %flat
func.func @bmm_over_merged_batch(%q: tensor<1x4x9x32xf32>, %kt: tensor<1x4x32x9xf32>) -> (tensor<1x4x9x9xf32>, tensor<4x9x9xf32>) {
  %q3 = ad.reshape %q [4, 9, 32] : tensor<1x4x9x32xf32> -> tensor<4x9x32xf32>
  %k3 = ad.reshape %kt [4, 32, 9] : tensor<1x4x32x9xf32> -> tensor<4x32x9xf32>
  %b = ad.bmm %q3, %k3 : (tensor<4x9x32xf32>, tensor<4x32x9xf32>) -> tensor<4x9x9xf32>
  %s = ad.reshape %b [1, 4, 9, 9] : tensor<4x9x9xf32> -> tensor<1x4x9x9xf32>
  %flat = ad.bmm %q3, %k3 : (tensor<4x9x32xf32>, tensor<4x32x9xf32>) -> tensor<4x9x9xf32>
  func.return %s, %flat : tensor<1x4x9x9xf32>, tensor<4x9x9xf32>
}
