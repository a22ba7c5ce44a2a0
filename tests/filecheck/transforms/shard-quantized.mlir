// shard on quantized linears: each opens and closes a block as `ad.linear` does, every scale that
// follows the weight's N (column-wise) or K (row-wise) cut with it, the others whole; the closing
// bias is added after the all_reduce. World size 2, 64 x 64 weights.
// RUN: ad-opt %s --split-input-file -p 'shard{world-size=2}' | filecheck %s

// Blocks [32, 32]: the opener's [64, 64] weight and [2, 2] scales -> [32, 64] and [1, 2] (one
// block row a rank), the closer's -> [64, 32] and [2, 1] (one block column).
// CHECK-LABEL: func.func @fp8_block(
// CHECK-SAME:  %w1: tensor<32x64xf8E4M3FN> {ad.param = "w1", ad.shard_dim = 0 : i64}, %s1: tensor<1x2xf32> {ad.param = "s1", ad.shard_dim = 0 : i64}
// CHECK-SAME:  %w2: tensor<64x32xf8E4M3FN> {ad.param = "w2", ad.shard_dim = 1 : i64}, %s2: tensor<2x1xf32> {ad.param = "s2", ad.shard_dim = 1 : i64}, %b2: tensor<64xf32> {ad.param = "b2"}
// CHECK-NEXT:  %h = ad.linear_fp8_block %x, %w1, %s1 block [32, 32] : (tensor<4x64xf32>, tensor<32x64xf8E4M3FN>, tensor<1x2xf32>) -> tensor<4x32xf32>
// CHECK-NEXT:  %o = ad.linear_fp8_block %h, %w2, %s2 block [32, 32] : (tensor<4x32xf32>, tensor<64x32xf8E4M3FN>, tensor<2x1xf32>) -> tensor<4x64xf32>
// CHECK-NEXT:  %[[R:.*]] = ad.all_reduce %o "sum" group "0" : tensor<4x64xf32> -> tensor<4x64xf32>
// CHECK-NEXT:  %[[W:.*]] = ad.wait_tensor %[[R]]
// CHECK-NEXT:  %[[B:.*]] = ad.add %[[W]], %b2
// CHECK-NEXT:  func.return %[[B]]
func.func @fp8_block(%x: tensor<4x64xf32> {ad.input = "x"}, %w1: tensor<64x64xf8E4M3FN> {ad.param = "w1"},
                     %s1: tensor<2x2xf32> {ad.param = "s1"}, %w2: tensor<64x64xf8E4M3FN> {ad.param = "w2"},
                     %s2: tensor<2x2xf32> {ad.param = "s2"}, %b2: tensor<64xf32> {ad.param = "b2"}) -> tensor<4x64xf32> {
  %h = ad.linear_fp8_block %x, %w1, %s1 block [32, 32] : (tensor<4x64xf32>, tensor<64x64xf8E4M3FN>, tensor<2x2xf32>) -> tensor<4x64xf32>
  %o = ad.linear_fp8_block %h, %w2, %s2 bias %b2 block [32, 32] : (tensor<4x64xf32>, tensor<64x64xf8E4M3FN>, tensor<2x2xf32>, tensor<64xf32>) -> tensor<4x64xf32>
  func.return %o : tensor<4x64xf32>
}

// -----

// FP8 with per-token activations: the opener's per-channel scales [64, 1] (and bias) cut with its
// rows, the closer's per-tensor scale whole; the closer's input is quantized per token on the
// rank's 32 features.
// CHECK-LABEL: func.func @fp8(
// CHECK-SAME:  %w1: tensor<32x64xf8E4M3FN> {ad.param = "w1", ad.shard_dim = 0 : i64}, %s1: tensor<32x1xf32> {ad.param = "s1", ad.shard_dim = 0 : i64}, %b1: tensor<32xf32> {ad.param = "b1", ad.shard_dim = 0 : i64}
// CHECK-SAME:  %w2: tensor<64x32xf8E4M3FN> {ad.param = "w2", ad.shard_dim = 1 : i64}, %s2: tensor<1xf32> {ad.param = "s2"})
// CHECK-NEXT:  %q, %qs = ad.quantize_fp8_dynamic %x per_token : tensor<4x64xf32> -> (tensor<4x64xf8E4M3FN>, tensor<4x1xf32>)
// CHECK-NEXT:  %h = ad.linear_fp8 %q, %w1, %qs, %s1 bias %b1 : (tensor<4x64xf8E4M3FN>, tensor<32x64xf8E4M3FN>, tensor<4x1xf32>, tensor<32x1xf32>, tensor<32xf32>) -> tensor<4x32xf32>
// CHECK-NEXT:  %hq, %hs = ad.quantize_fp8_dynamic %h per_token : tensor<4x32xf32> -> (tensor<4x32xf8E4M3FN>, tensor<4x1xf32>)
// CHECK-NEXT:  %o = ad.linear_fp8 %hq, %w2, %hs, %s2 : (tensor<4x32xf8E4M3FN>, tensor<64x32xf8E4M3FN>, tensor<4x1xf32>, tensor<1xf32>) -> tensor<4x64xf32>
// CHECK-NEXT:  ad.all_reduce %o "sum" group "0"
func.func @fp8(%x: tensor<4x64xf32> {ad.input = "x"}, %w1: tensor<64x64xf8E4M3FN> {ad.param = "w1"},
               %s1: tensor<64x1xf32> {ad.param = "s1"}, %b1: tensor<64xf32> {ad.param = "b1"},
               %w2: tensor<64x64xf8E4M3FN> {ad.param = "w2"}, %s2: tensor<1xf32> {ad.param = "s2"}) -> tensor<4x64xf32> {
  %q, %qs = ad.quantize_fp8_dynamic %x per_token : tensor<4x64xf32> -> (tensor<4x64xf8E4M3FN>, tensor<4x1xf32>)
  %h = ad.linear_fp8 %q, %w1, %qs, %s1 bias %b1 : (tensor<4x64xf8E4M3FN>, tensor<64x64xf8E4M3FN>, tensor<4x1xf32>, tensor<64x1xf32>, tensor<64xf32>) -> tensor<4x64xf32>
  %hq, %hs = ad.quantize_fp8_dynamic %h per_token : tensor<4x64xf32> -> (tensor<4x64xf8E4M3FN>, tensor<4x1xf32>)
  %o = ad.linear_fp8 %hq, %w2, %hs, %s2 : (tensor<4x64xf8E4M3FN>, tensor<64x64xf8E4M3FN>, tensor<4x1xf32>, tensor<1xf32>) -> tensor<4x64xf32>
  func.return %o : tensor<4x64xf32>
}

// -----

// Int4 in groups of 32 (K = N = 64): the opener's words [8, 64], zero points [2, 8] and scales
// [2, 64] cut along N -> [8, 32], [2, 4], [2, 32]; the closer's along K -> [4, 64], [1, 8],
// [1, 64] (32 rows, one group a rank).
// CHECK-LABEL: func.func @int4(
// CHECK-SAME:  %q1: tensor<8x32xi32> {ad.param = "q1", ad.shard_dim = 1 : i64}, %z1: tensor<2x4xi32> {ad.param = "z1", ad.shard_dim = 1 : i64}, %s1: tensor<2x32xf16> {ad.param = "s1", ad.shard_dim = 1 : i64}
// CHECK-SAME:  %q2: tensor<4x64xi32> {ad.param = "q2", ad.shard_dim = 0 : i64}, %z2: tensor<1x8xi32> {ad.param = "z2", ad.shard_dim = 0 : i64}, %s2: tensor<1x64xf16> {ad.param = "s2", ad.shard_dim = 0 : i64})
// CHECK-NEXT:  %h = ad.linear_int4 %x, %q1, %z1, %s1 group 32 zero_offset 1 : (tensor<4x64xf32>, tensor<8x32xi32>, tensor<2x4xi32>, tensor<2x32xf16>) -> tensor<4x32xf32>
// CHECK-NEXT:  %o = ad.linear_int4 %h, %q2, %z2, %s2 group 32 zero_offset 1 : (tensor<4x32xf32>, tensor<4x64xi32>, tensor<1x8xi32>, tensor<1x64xf16>) -> tensor<4x64xf32>
// CHECK-NEXT:  ad.all_reduce %o "sum" group "0"
func.func @int4(%x: tensor<4x64xf32> {ad.input = "x"}, %q1: tensor<8x64xi32> {ad.param = "q1"},
                %z1: tensor<2x8xi32> {ad.param = "z1"}, %s1: tensor<2x64xf16> {ad.param = "s1"},
                %q2: tensor<8x64xi32> {ad.param = "q2"}, %z2: tensor<2x8xi32> {ad.param = "z2"},
                %s2: tensor<2x64xf16> {ad.param = "s2"}) -> tensor<4x64xf32> {
  %h = ad.linear_int4 %x, %q1, %z1, %s1 group 32 zero_offset 1 : (tensor<4x64xf32>, tensor<8x64xi32>, tensor<2x8xi32>, tensor<2x64xf16>) -> tensor<4x64xf32>
  %o = ad.linear_int4 %h, %q2, %z2, %s2 group 32 zero_offset 1 : (tensor<4x64xf32>, tensor<8x64xi32>, tensor<2x8xi32>, tensor<2x64xf16>) -> tensor<4x64xf32>
  func.return %o : tensor<4x64xf32>
}

// -----

// NVFP4 (K = 64: 32 bytes, 4 groups of 16 a row): the opener's codes, block scales and per-row
// global scale [64] cut along N; the closer's codes [64, 32] and scales [64, 4] along K -> [64, 16]
// and [64, 2] (two 16-groups a rank), its one-value global scale whole.
// CHECK-LABEL: func.func @nvfp4(
// CHECK-SAME:  %w1: tensor<32x32xui8> {ad.param = "w1", ad.shard_dim = 0 : i64}, %s1: tensor<32x4xf8E4M3FN> {ad.param = "s1", ad.shard_dim = 0 : i64}, %g1: tensor<32xf32> {ad.param = "g1", ad.shard_dim = 0 : i64}
// CHECK-SAME:  %w2: tensor<64x16xui8> {ad.param = "w2", ad.shard_dim = 1 : i64}, %s2: tensor<64x2xf8E4M3FN> {ad.param = "s2", ad.shard_dim = 1 : i64}, %g2: tensor<f32> {ad.param = "g2"})
// CHECK-NEXT:  %h = ad.linear_nvfp4 %x, %w1, %s1, %g1 : (tensor<4x64xf32>, tensor<32x32xui8>, tensor<32x4xf8E4M3FN>, tensor<32xf32>) -> tensor<4x32xf32>
// CHECK-NEXT:  %o = ad.linear_nvfp4 %h, %w2, %s2, %g2 : (tensor<4x32xf32>, tensor<64x16xui8>, tensor<64x2xf8E4M3FN>, tensor<f32>) -> tensor<4x64xf32>
// CHECK-NEXT:  ad.all_reduce %o "sum" group "0"
func.func @nvfp4(%x: tensor<4x64xf32> {ad.input = "x"}, %w1: tensor<64x32xui8> {ad.param = "w1"},
                 %s1: tensor<64x4xf8E4M3FN> {ad.param = "s1"}, %g1: tensor<64xf32> {ad.param = "g1"},
                 %w2: tensor<64x32xui8> {ad.param = "w2"}, %s2: tensor<64x4xf8E4M3FN> {ad.param = "s2"},
                 %g2: tensor<f32> {ad.param = "g2"}) -> tensor<4x64xf32> {
  %h = ad.linear_nvfp4 %x, %w1, %s1, %g1 : (tensor<4x64xf32>, tensor<64x32xui8>, tensor<64x4xf8E4M3FN>, tensor<64xf32>) -> tensor<4x64xf32>
  %o = ad.linear_nvfp4 %h, %w2, %s2, %g2 : (tensor<4x64xf32>, tensor<64x32xui8>, tensor<64x4xf8E4M3FN>, tensor<f32>) -> tensor<4x64xf32>
  func.return %o : tensor<4x64xf32>
}

// -----

// Int4 in one group over K (GPTQ's group_size -1, the loader's group of K): the closer's words are
// cut along K, its one row of zero points and scales is every rank's (local K 32 < group 64:
// every row in group 0, as in the whole weight).
// CHECK-LABEL: func.func @int4_one_group(
// CHECK-SAME:  %q2: tensor<4x64xi32> {ad.param = "q2", ad.shard_dim = 0 : i64}, %z2: tensor<1x8xi32> {ad.param = "z2"}, %s2: tensor<1x64xf16> {ad.param = "s2"})
// CHECK:       %o = ad.linear_int4 %h, %q2, %z2, %s2 group 64 zero_offset 1 : (tensor<4x32xf32>, tensor<4x64xi32>, tensor<1x8xi32>, tensor<1x64xf16>) -> tensor<4x64xf32>
// CHECK-NEXT:  ad.all_reduce %o "sum" group "0"
func.func @int4_one_group(%x: tensor<4x64xf32> {ad.input = "x"}, %q1: tensor<8x64xi32> {ad.param = "q1"},
                          %z1: tensor<1x8xi32> {ad.param = "z1"}, %s1: tensor<1x64xf16> {ad.param = "s1"},
                          %q2: tensor<8x64xi32> {ad.param = "q2"}, %z2: tensor<1x8xi32> {ad.param = "z2"},
                          %s2: tensor<1x64xf16> {ad.param = "s2"}) -> tensor<4x64xf32> {
  %h = ad.linear_int4 %x, %q1, %z1, %s1 group 64 zero_offset 1 : (tensor<4x64xf32>, tensor<8x64xi32>, tensor<1x8xi32>, tensor<1x64xf16>) -> tensor<4x64xf32>
  %o = ad.linear_int4 %h, %q2, %z2, %s2 group 64 zero_offset 1 : (tensor<4x64xf32>, tensor<8x64xi32>, tensor<1x8xi32>, tensor<1x64xf16>) -> tensor<4x64xf32>
  func.return %o : tensor<4x64xf32>
}
