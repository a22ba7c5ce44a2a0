// fuse-gemms: linears that read one input, with weight arguments, become one linear over the
// concatenated weights; each old result is a last-dim slice of it.
// RUN: ad-opt %s --split-input-file -p fuse-gemms | filecheck %s

// Q/K/V with biases (Qwen2): weights and biases are concatenated in order; the slices give
// back each projection's columns. The o_proj reads another input and stays.
// CHECK-LABEL: func.func @qkv
// CHECK-NEXT:    %[[W:.*]] = ad.cat %wq, %wk, %wv dim 0 : (tensor<64x64xbf16>, tensor<32x64xbf16>, tensor<32x64xbf16>) -> tensor<128x64xbf16>
// CHECK-NEXT:    %[[B:.*]] = ad.cat %bq, %bk, %bv dim 0 : (tensor<64xbf16>, tensor<32xbf16>, tensor<32xbf16>) -> tensor<128xbf16>
// CHECK-NEXT:    %[[Y:.*]] = ad.linear %x, %[[W]] bias %[[B]] : (tensor<1x?x64xbf16>, tensor<128x64xbf16>, tensor<128xbf16>) -> tensor<1x?x128xbf16>
// CHECK-NEXT:    %[[Q:.*]] = ad.slice %[[Y]] dim 2 [0, 64, 1] : tensor<1x?x128xbf16> -> tensor<1x?x64xbf16>
// CHECK-NEXT:    %[[K:.*]] = ad.slice %[[Y]] dim 2 [64, 96, 1] : tensor<1x?x128xbf16> -> tensor<1x?x32xbf16>
// CHECK-NEXT:    %[[V:.*]] = ad.slice %[[Y]] dim 2 [96, 128, 1] : tensor<1x?x128xbf16> -> tensor<1x?x32xbf16>
// CHECK-NEXT:    %[[O:.*]] = ad.linear %[[Q]], %wo :
// CHECK-NEXT:    func.return %[[O]], %[[K]], %[[V]]
func.func @qkv(%wq: tensor<64x64xbf16> {ad.param = "q.weight"}, %wk: tensor<32x64xbf16> {ad.param = "k.weight"}, %wv: tensor<32x64xbf16> {ad.param = "v.weight"}, %bq: tensor<64xbf16> {ad.param = "q.bias"}, %bk: tensor<32xbf16> {ad.param = "k.bias"}, %bv: tensor<32xbf16> {ad.param = "v.bias"}, %wo: tensor<64x64xbf16> {ad.param = "o.weight"}, %x: tensor<1x?x64xbf16> {ad.input = "x"}) -> (tensor<1x?x64xbf16>, tensor<1x?x32xbf16>, tensor<1x?x32xbf16>) {
  %q = ad.linear %x, %wq bias %bq : (tensor<1x?x64xbf16>, tensor<64x64xbf16>, tensor<64xbf16>) -> tensor<1x?x64xbf16>
  %k = ad.linear %x, %wk bias %bk : (tensor<1x?x64xbf16>, tensor<32x64xbf16>, tensor<32xbf16>) -> tensor<1x?x32xbf16>
  %v = ad.linear %x, %wv bias %bv : (tensor<1x?x64xbf16>, tensor<32x64xbf16>, tensor<32xbf16>) -> tensor<1x?x32xbf16>
  %o = ad.linear %q, %wo : (tensor<1x?x64xbf16>, tensor<64x64xbf16>) -> tensor<1x?x64xbf16>
  func.return %o, %k, %v : tensor<1x?x64xbf16>, tensor<1x?x32xbf16>, tensor<1x?x32xbf16>
}

// -----

// Not fused: a weight that is a user input (it would be concatenated on every call), a linear
// with a bias beside one without, and a lone linear.
// CHECK-LABEL: func.func @not_fused
// CHECK-NOT:     ad.cat
// CHECK-COUNT-3: ad.linear %x
// CHECK-NOT:     ad.cat
func.func @not_fused(%w1: tensor<8x16xf32> {ad.param = "a.weight"}, %b1: tensor<8xf32> {ad.param = "a.bias"}, %w2: tensor<8x16xf32> {ad.param = "b.weight"}, %w3: tensor<8x16xf32> {ad.input = "w3"}, %x: tensor<4x16xf32> {ad.input = "x"}) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) {
  %a = ad.linear %x, %w1 bias %b1 : (tensor<4x16xf32>, tensor<8x16xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  %b = ad.linear %x, %w2 : (tensor<4x16xf32>, tensor<8x16xf32>) -> tensor<4x8xf32>
  %c = ad.linear %x, %w3 : (tensor<4x16xf32>, tensor<8x16xf32>) -> tensor<4x8xf32>
  func.return %a, %b, %c : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>
}

// -----

// Block-scaled FP8 Q/K/V (a fine-grained FP8 checkpoint's): the fp8 weights and their block
// scales are concatenated along N, the block size kept.
// CHECK-LABEL: func.func @qkv_fp8_block
// CHECK-NEXT:    %[[W:.*]] = ad.cat %wq, %wk, %wv dim 0 : (tensor<64x64xf8E4M3FN>, tensor<32x64xf8E4M3FN>, tensor<32x64xf8E4M3FN>) -> tensor<128x64xf8E4M3FN>
// CHECK-NEXT:    %[[S:.*]] = ad.cat %sq, %sk, %sv dim 0 : (tensor<4x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<8x2xf32>
// CHECK-NEXT:    %[[Y:.*]] = ad.linear_fp8_block %x, %[[W]], %[[S]] block [16, 32] : (tensor<1x?x64xbf16>, tensor<128x64xf8E4M3FN>, tensor<8x2xf32>) -> tensor<1x?x128xbf16>
// CHECK-NEXT:    %[[Q:.*]] = ad.slice %[[Y]] dim 2 [0, 64, 1] : tensor<1x?x128xbf16> -> tensor<1x?x64xbf16>
// CHECK-NEXT:    %[[K:.*]] = ad.slice %[[Y]] dim 2 [64, 96, 1] : tensor<1x?x128xbf16> -> tensor<1x?x32xbf16>
// CHECK-NEXT:    %[[V:.*]] = ad.slice %[[Y]] dim 2 [96, 128, 1] : tensor<1x?x128xbf16> -> tensor<1x?x32xbf16>
// CHECK-NEXT:    func.return %[[Q]], %[[K]], %[[V]]
func.func @qkv_fp8_block(%wq: tensor<64x64xf8E4M3FN> {ad.param = "q.weight"}, %sq: tensor<4x2xf32> {ad.param = "q.weight_scale_inv"}, %wk: tensor<32x64xf8E4M3FN> {ad.param = "k.weight"}, %sk: tensor<2x2xf32> {ad.param = "k.weight_scale_inv"}, %wv: tensor<32x64xf8E4M3FN> {ad.param = "v.weight"}, %sv: tensor<2x2xf32> {ad.param = "v.weight_scale_inv"}, %x: tensor<1x?x64xbf16> {ad.input = "x"}) -> (tensor<1x?x64xbf16>, tensor<1x?x32xbf16>, tensor<1x?x32xbf16>) {
  %q = ad.linear_fp8_block %x, %wq, %sq block [16, 32] : (tensor<1x?x64xbf16>, tensor<64x64xf8E4M3FN>, tensor<4x2xf32>) -> tensor<1x?x64xbf16>
  %k = ad.linear_fp8_block %x, %wk, %sk block [16, 32] : (tensor<1x?x64xbf16>, tensor<32x64xf8E4M3FN>, tensor<2x2xf32>) -> tensor<1x?x32xbf16>
  %v = ad.linear_fp8_block %x, %wv, %sv block [16, 32] : (tensor<1x?x64xbf16>, tensor<32x64xf8E4M3FN>, tensor<2x2xf32>) -> tensor<1x?x32xbf16>
  func.return %q, %k, %v : tensor<1x?x64xbf16>, tensor<1x?x32xbf16>, tensor<1x?x32xbf16>
}

// -----

// Not fused: a block-scaled weight whose rows end inside an N block (40 rows in blocks of 16:
// its last row of scales would cover the next weight's rows too), block-scaled linears of other
// block sizes, and a block-scaled linear beside a plain one.
// CHECK-LABEL: func.func @fp8_block_not_fused
// CHECK-NOT:     ad.cat
// CHECK:       ad.linear_fp8_block %x, %wa, %sa block [16, 32]
// CHECK-NEXT:  ad.linear_fp8_block %x, %wb, %sb block [16, 32]
// CHECK-NEXT:    ad.linear_fp8_block %x, %wc, %sc block [32, 32]
// CHECK-NEXT:    ad.linear %x, %wd
// CHECK-NOT:     ad.cat
func.func @fp8_block_not_fused(%wa: tensor<40x64xf8E4M3FN> {ad.param = "a.weight"}, %sa: tensor<3x2xf32> {ad.param = "a.weight_scale_inv"}, %wb: tensor<32x64xf8E4M3FN> {ad.param = "b.weight"}, %sb: tensor<2x2xf32> {ad.param = "b.weight_scale_inv"}, %wc: tensor<32x64xf8E4M3FN> {ad.param = "c.weight"}, %sc: tensor<1x2xf32> {ad.param = "c.weight_scale_inv"}, %wd: tensor<32x64xbf16> {ad.param = "d.weight"}, %x: tensor<4x64xbf16> {ad.input = "x"}) -> (tensor<4x40xbf16>, tensor<4x32xbf16>, tensor<4x32xbf16>, tensor<4x32xbf16>) {
  %a = ad.linear_fp8_block %x, %wa, %sa block [16, 32] : (tensor<4x64xbf16>, tensor<40x64xf8E4M3FN>, tensor<3x2xf32>) -> tensor<4x40xbf16>
  %b = ad.linear_fp8_block %x, %wb, %sb block [16, 32] : (tensor<4x64xbf16>, tensor<32x64xf8E4M3FN>, tensor<2x2xf32>) -> tensor<4x32xbf16>
  %c = ad.linear_fp8_block %x, %wc, %sc block [32, 32] : (tensor<4x64xbf16>, tensor<32x64xf8E4M3FN>, tensor<1x2xf32>) -> tensor<4x32xbf16>
  %d = ad.linear %x, %wd : (tensor<4x64xbf16>, tensor<32x64xbf16>) -> tensor<4x32xbf16>
  func.return %a, %b, %c, %d : tensor<4x40xbf16>, tensor<4x32xbf16>, tensor<4x32xbf16>, tensor<4x32xbf16>
}
