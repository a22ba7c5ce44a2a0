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
