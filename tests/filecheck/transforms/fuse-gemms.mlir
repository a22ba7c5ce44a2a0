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

// -----

// Per-channel FP8 gate/up (a compressed-tensors FP8-dynamic checkpoint's) on one quantized input
// and its per-token scale: the fp8 weights and their [N, 1] scales are concatenated along N.
// CHECK-LABEL: func.func @gate_up_fp8_channel
// CHECK-NEXT:    %[[W:.*]] = ad.cat %wg, %wu dim 0 : (tensor<128x64xf8E4M3FN>, tensor<128x64xf8E4M3FN>) -> tensor<256x64xf8E4M3FN>
// CHECK-NEXT:    %[[S:.*]] = ad.cat %sg, %su dim 0 : (tensor<128x1xf32>, tensor<128x1xf32>) -> tensor<256x1xf32>
// CHECK-NEXT:    %[[Y:.*]] = ad.linear_fp8 %q, %[[W]], %s, %[[S]] : (tensor<1x?x64xf8E4M3FN>, tensor<256x64xf8E4M3FN>, tensor<1x?x1xf32>, tensor<256x1xf32>) -> tensor<1x?x256xbf16>
// CHECK-NEXT:    %[[G:.*]] = ad.slice %[[Y]] dim 2 [0, 128, 1]
// CHECK-NEXT:    %[[U:.*]] = ad.slice %[[Y]] dim 2 [128, 256, 1]
// CHECK-NEXT:    func.return %[[G]], %[[U]]
func.func @gate_up_fp8_channel(%wg: tensor<128x64xf8E4M3FN> {ad.param = "g.weight"}, %sg: tensor<128x1xf32> {ad.param = "g.weight_scale"}, %wu: tensor<128x64xf8E4M3FN> {ad.param = "u.weight"}, %su: tensor<128x1xf32> {ad.param = "u.weight_scale"}, %q: tensor<1x?x64xf8E4M3FN> {ad.input = "q"}, %s: tensor<1x?x1xf32> {ad.input = "s"}) -> (tensor<1x?x128xbf16>, tensor<1x?x128xbf16>) {
  %g = ad.linear_fp8 %q, %wg, %s, %sg : (tensor<1x?x64xf8E4M3FN>, tensor<128x64xf8E4M3FN>, tensor<1x?x1xf32>, tensor<128x1xf32>) -> tensor<1x?x128xbf16>
  %u = ad.linear_fp8 %q, %wu, %s, %su : (tensor<1x?x64xf8E4M3FN>, tensor<128x64xf8E4M3FN>, tensor<1x?x1xf32>, tensor<128x1xf32>) -> tensor<1x?x128xbf16>
  func.return %g, %u : tensor<1x?x128xbf16>, tensor<1x?x128xbf16>
}

// -----

// Not fused: per-tensor weight scales (one value a part does not concatenate into one scale),
// and per-channel FP8 linears on one fp8 input with two different input scales.
// CHECK-LABEL: func.func @fp8_channel_not_fused
// CHECK-NOT:     ad.cat
// CHECK:         ad.linear_fp8 %q, %wa, %s, %ta
// CHECK-NEXT:    ad.linear_fp8 %q, %wb, %s, %tb
// CHECK-NEXT:    ad.linear_fp8 %q, %wc, %s, %sc
// CHECK-NEXT:    ad.linear_fp8 %q, %wd, %s2, %sd
// CHECK-NOT:     ad.cat
func.func @fp8_channel_not_fused(%wa: tensor<32x64xf8E4M3FN> {ad.param = "a.weight"}, %ta: tensor<f32> {ad.param = "a.weight_scale"}, %wb: tensor<32x64xf8E4M3FN> {ad.param = "b.weight"}, %tb: tensor<f32> {ad.param = "b.weight_scale"}, %wc: tensor<32x64xf8E4M3FN> {ad.param = "c.weight"}, %sc: tensor<32x1xf32> {ad.param = "c.weight_scale"}, %wd: tensor<32x64xf8E4M3FN> {ad.param = "d.weight"}, %sd: tensor<32x1xf32> {ad.param = "d.weight_scale"}, %q: tensor<4x64xf8E4M3FN> {ad.input = "q"}, %s: tensor<4x1xf32> {ad.input = "s"}, %s2: tensor<4x1xf32> {ad.input = "s2"}) -> (tensor<4x32xbf16>, tensor<4x32xbf16>, tensor<4x32xbf16>, tensor<4x32xbf16>) {
  %a = ad.linear_fp8 %q, %wa, %s, %ta : (tensor<4x64xf8E4M3FN>, tensor<32x64xf8E4M3FN>, tensor<4x1xf32>, tensor<f32>) -> tensor<4x32xbf16>
  %b = ad.linear_fp8 %q, %wb, %s, %tb : (tensor<4x64xf8E4M3FN>, tensor<32x64xf8E4M3FN>, tensor<4x1xf32>, tensor<f32>) -> tensor<4x32xbf16>
  %c = ad.linear_fp8 %q, %wc, %s, %sc : (tensor<4x64xf8E4M3FN>, tensor<32x64xf8E4M3FN>, tensor<4x1xf32>, tensor<32x1xf32>) -> tensor<4x32xbf16>
  %d = ad.linear_fp8 %q, %wd, %s2, %sd : (tensor<4x64xf8E4M3FN>, tensor<32x64xf8E4M3FN>, tensor<4x1xf32>, tensor<32x1xf32>) -> tensor<4x32xbf16>
  func.return %a, %b, %c, %d : tensor<4x32xbf16>, tensor<4x32xbf16>, tensor<4x32xbf16>, tensor<4x32xbf16>
}

// -----

// NVFP4 Q/K/V (a ModelOpt NVFP4 checkpoint's): the packed codes and their e4m3 block scales are
// concatenated along N; each part's global scale (one value) is expanded over its rows and the
// three concatenated: the merged GEMM's global scale is one per row.
// CHECK-LABEL: func.func @qkv_nvfp4
// CHECK-NEXT:    %[[W:.*]] = ad.cat %wq, %wk, %wv dim 0 : (tensor<64x32xui8>, tensor<32x32xui8>, tensor<32x32xui8>) -> tensor<128x32xui8>
// CHECK-NEXT:    %[[GQ:.*]] = ad.expand %gq [64] : tensor<f32> -> tensor<64xf32>
// CHECK-NEXT:    %[[GK:.*]] = ad.expand %gk [32] : tensor<f32> -> tensor<32xf32>
// CHECK-NEXT:    %[[GV:.*]] = ad.expand %gv [32] : tensor<f32> -> tensor<32xf32>
// CHECK-NEXT:    %[[S:.*]] = ad.cat %sq, %sk, %sv dim 0 : (tensor<64x4xf8E4M3FN>, tensor<32x4xf8E4M3FN>, tensor<32x4xf8E4M3FN>) -> tensor<128x4xf8E4M3FN>
// CHECK-NEXT:    %[[G:.*]] = ad.cat %[[GQ]], %[[GK]], %[[GV]] dim 0 : (tensor<64xf32>, tensor<32xf32>, tensor<32xf32>) -> tensor<128xf32>
// CHECK-NEXT:    %[[B:.*]] = ad.cat %bq, %bk, %bv dim 0
// CHECK-NEXT:    %[[Y:.*]] = ad.linear_nvfp4 %x, %[[W]], %[[S]], %[[G]] bias %[[B]] : (tensor<1x?x64xbf16>, tensor<128x32xui8>, tensor<128x4xf8E4M3FN>, tensor<128xf32>, tensor<128xbf16>) -> tensor<1x?x128xbf16>
// CHECK-NEXT:    %[[Q:.*]] = ad.slice %[[Y]] dim 2 [0, 64, 1]
// CHECK-NEXT:    %[[K:.*]] = ad.slice %[[Y]] dim 2 [64, 96, 1]
// CHECK-NEXT:    %[[V:.*]] = ad.slice %[[Y]] dim 2 [96, 128, 1]
// CHECK-NEXT:    func.return %[[Q]], %[[K]], %[[V]]
func.func @qkv_nvfp4(%wq: tensor<64x32xui8> {ad.param = "q.weight"}, %sq: tensor<64x4xf8E4M3FN> {ad.param = "q.weight_scale"}, %gq: tensor<f32> {ad.param = "q.weight_scale_2"}, %bq: tensor<64xbf16> {ad.param = "q.bias"}, %wk: tensor<32x32xui8> {ad.param = "k.weight"}, %sk: tensor<32x4xf8E4M3FN> {ad.param = "k.weight_scale"}, %gk: tensor<f32> {ad.param = "k.weight_scale_2"}, %bk: tensor<32xbf16> {ad.param = "k.bias"}, %wv: tensor<32x32xui8> {ad.param = "v.weight"}, %sv: tensor<32x4xf8E4M3FN> {ad.param = "v.weight_scale"}, %gv: tensor<f32> {ad.param = "v.weight_scale_2"}, %bv: tensor<32xbf16> {ad.param = "v.bias"}, %x: tensor<1x?x64xbf16> {ad.input = "x"}) -> (tensor<1x?x64xbf16>, tensor<1x?x32xbf16>, tensor<1x?x32xbf16>) {
  %q = ad.linear_nvfp4 %x, %wq, %sq, %gq bias %bq : (tensor<1x?x64xbf16>, tensor<64x32xui8>, tensor<64x4xf8E4M3FN>, tensor<f32>, tensor<64xbf16>) -> tensor<1x?x64xbf16>
  %k = ad.linear_nvfp4 %x, %wk, %sk, %gk bias %bk : (tensor<1x?x64xbf16>, tensor<32x32xui8>, tensor<32x4xf8E4M3FN>, tensor<f32>, tensor<32xbf16>) -> tensor<1x?x32xbf16>
  %v = ad.linear_nvfp4 %x, %wv, %sv, %gv bias %bv : (tensor<1x?x64xbf16>, tensor<32x32xui8>, tensor<32x4xf8E4M3FN>, tensor<f32>, tensor<32xbf16>) -> tensor<1x?x32xbf16>
  func.return %q, %k, %v : tensor<1x?x64xbf16>, tensor<1x?x32xbf16>, tensor<1x?x32xbf16>
}

// -----

// Int4 Q/K/V with biases (a GPTQ checkpoint's, act-order): the packed words [K / 8, N], the zero
// points [G, N / 8] and the scales [G, N] are concatenated along N (dim 1), the biases along
// theirs; the one g_idx the three share, the group size and the zero offset are kept.
// CHECK-LABEL: func.func @qkv_int4
// CHECK-NEXT:    %[[W:.*]] = ad.cat %wq, %wk, %wv dim 1 : (tensor<8x64xi32>, tensor<8x32xi32>, tensor<8x32xi32>) -> tensor<8x128xi32>
// CHECK-NEXT:    %[[Z:.*]] = ad.cat %zq, %zk, %zv dim 1 : (tensor<4x8xi32>, tensor<4x4xi32>, tensor<4x4xi32>) -> tensor<4x16xi32>
// CHECK-NEXT:    %[[S:.*]] = ad.cat %sq, %sk, %sv dim 1 : (tensor<4x64xf16>, tensor<4x32xf16>, tensor<4x32xf16>) -> tensor<4x128xf16>
// CHECK-NEXT:    %[[B:.*]] = ad.cat %bq, %bk, %bv dim 0 : (tensor<64xbf16>, tensor<32xbf16>, tensor<32xbf16>) -> tensor<128xbf16>
// CHECK-NEXT:    %[[Y:.*]] = ad.linear_int4 %x, %[[W]], %[[Z]], %[[S]] g_idx %g bias %[[B]] group 16 zero_offset 1 : (tensor<1x?x64xbf16>, tensor<8x128xi32>, tensor<4x16xi32>, tensor<4x128xf16>, tensor<64xi32>, tensor<128xbf16>) -> tensor<1x?x128xbf16>
// CHECK-NEXT:    %[[Q:.*]] = ad.slice %[[Y]] dim 2 [0, 64, 1] : tensor<1x?x128xbf16> -> tensor<1x?x64xbf16>
// CHECK-NEXT:    %[[K:.*]] = ad.slice %[[Y]] dim 2 [64, 96, 1] : tensor<1x?x128xbf16> -> tensor<1x?x32xbf16>
// CHECK-NEXT:    %[[V:.*]] = ad.slice %[[Y]] dim 2 [96, 128, 1] : tensor<1x?x128xbf16> -> tensor<1x?x32xbf16>
// CHECK-NEXT:    func.return %[[Q]], %[[K]], %[[V]]
func.func @qkv_int4(%wq: tensor<8x64xi32> {ad.param = "q.qweight"}, %zq: tensor<4x8xi32> {ad.param = "q.qzeros"}, %sq: tensor<4x64xf16> {ad.param = "q.scales"}, %bq: tensor<64xbf16> {ad.param = "q.bias"}, %wk: tensor<8x32xi32> {ad.param = "k.qweight"}, %zk: tensor<4x4xi32> {ad.param = "k.qzeros"}, %sk: tensor<4x32xf16> {ad.param = "k.scales"}, %bk: tensor<32xbf16> {ad.param = "k.bias"}, %wv: tensor<8x32xi32> {ad.param = "v.qweight"}, %zv: tensor<4x4xi32> {ad.param = "v.qzeros"}, %sv: tensor<4x32xf16> {ad.param = "v.scales"}, %bv: tensor<32xbf16> {ad.param = "v.bias"}, %g: tensor<64xi32> {ad.param = "q.g_idx"}, %x: tensor<1x?x64xbf16> {ad.input = "x"}) -> (tensor<1x?x64xbf16>, tensor<1x?x32xbf16>, tensor<1x?x32xbf16>) {
  %q = ad.linear_int4 %x, %wq, %zq, %sq g_idx %g bias %bq group 16 zero_offset 1 : (tensor<1x?x64xbf16>, tensor<8x64xi32>, tensor<4x8xi32>, tensor<4x64xf16>, tensor<64xi32>, tensor<64xbf16>) -> tensor<1x?x64xbf16>
  %k = ad.linear_int4 %x, %wk, %zk, %sk g_idx %g bias %bk group 16 zero_offset 1 : (tensor<1x?x64xbf16>, tensor<8x32xi32>, tensor<4x4xi32>, tensor<4x32xf16>, tensor<64xi32>, tensor<32xbf16>) -> tensor<1x?x32xbf16>
  %v = ad.linear_int4 %x, %wv, %zv, %sv g_idx %g bias %bv group 16 zero_offset 1 : (tensor<1x?x64xbf16>, tensor<8x32xi32>, tensor<4x4xi32>, tensor<4x32xf16>, tensor<64xi32>, tensor<32xbf16>) -> tensor<1x?x32xbf16>
  func.return %q, %k, %v : tensor<1x?x64xbf16>, tensor<1x?x32xbf16>, tensor<1x?x32xbf16>
}

// -----

// Not fused: an NVFP4 linear whose global scale is not a weight (no per-row scale can be made
// of it at compile time) beside one whose is, and an NVFP4 linear beside a plain one.
// CHECK-LABEL: func.func @nvfp4_not_fused
// CHECK-NOT:     ad.cat
// CHECK:         ad.linear_nvfp4 %x, %wa, %sa, %ga
// CHECK-NEXT:    ad.linear_nvfp4 %x, %wb, %sb, %gb
// CHECK-NEXT:    ad.linear %x, %wc
// CHECK-NOT:     ad.cat
func.func @nvfp4_not_fused(%wa: tensor<32x32xui8> {ad.param = "a.weight"}, %sa: tensor<32x4xf8E4M3FN> {ad.param = "a.weight_scale"}, %ga: tensor<f32> {ad.input = "ga"}, %wb: tensor<32x32xui8> {ad.param = "b.weight"}, %sb: tensor<32x4xf8E4M3FN> {ad.param = "b.weight_scale"}, %gb: tensor<f32> {ad.param = "b.weight_scale_2"}, %wc: tensor<32x64xbf16> {ad.param = "c.weight"}, %x: tensor<4x64xbf16> {ad.input = "x"}) -> (tensor<4x32xbf16>, tensor<4x32xbf16>, tensor<4x32xbf16>) {
  %a = ad.linear_nvfp4 %x, %wa, %sa, %ga : (tensor<4x64xbf16>, tensor<32x32xui8>, tensor<32x4xf8E4M3FN>, tensor<f32>) -> tensor<4x32xbf16>
  %b = ad.linear_nvfp4 %x, %wb, %sb, %gb : (tensor<4x64xbf16>, tensor<32x32xui8>, tensor<32x4xf8E4M3FN>, tensor<f32>) -> tensor<4x32xbf16>
  %c = ad.linear %x, %wc : (tensor<4x64xbf16>, tensor<32x64xbf16>) -> tensor<4x32xbf16>
  func.return %a, %b, %c : tensor<4x32xbf16>, tensor<4x32xbf16>, tensor<4x32xbf16>
}

// -----

// Not fused: int4 linears of one input whose rows fall in groups otherwise: two act-orders
// (g_idx %ga, %gb: each row's group differs), one without g_idx beside one with, and zero points
// stored with another offset (GPTQ v1's 1 against AWQ's 0).
// CHECK-LABEL: func.func @int4_not_fused
// CHECK-NOT:     ad.cat
// CHECK:         ad.linear_int4 %x, %wa, %za, %sa g_idx %ga group 16 zero_offset 1
// CHECK-NEXT:    ad.linear_int4 %x, %wb, %zb, %sb g_idx %gb group 16 zero_offset 1
// CHECK-NEXT:    ad.linear_int4 %x, %wc, %zc, %sc group 16 zero_offset 1
// CHECK-NEXT:    ad.linear_int4 %x, %wd, %zd, %sd group 16 zero_offset 0
// CHECK-NOT:     ad.cat
func.func @int4_not_fused(%wa: tensor<8x32xi32> {ad.param = "a.qweight"}, %za: tensor<4x4xi32> {ad.param = "a.qzeros"}, %sa: tensor<4x32xf16> {ad.param = "a.scales"}, %ga: tensor<64xi32> {ad.param = "a.g_idx"}, %wb: tensor<8x32xi32> {ad.param = "b.qweight"}, %zb: tensor<4x4xi32> {ad.param = "b.qzeros"}, %sb: tensor<4x32xf16> {ad.param = "b.scales"}, %gb: tensor<64xi32> {ad.param = "b.g_idx"}, %wc: tensor<8x32xi32> {ad.param = "c.qweight"}, %zc: tensor<4x4xi32> {ad.param = "c.qzeros"}, %sc: tensor<4x32xf16> {ad.param = "c.scales"}, %wd: tensor<8x32xi32> {ad.param = "d.qweight"}, %zd: tensor<4x4xi32> {ad.param = "d.qzeros"}, %sd: tensor<4x32xf16> {ad.param = "d.scales"}, %x: tensor<4x64xbf16> {ad.input = "x"}) -> (tensor<4x32xbf16>, tensor<4x32xbf16>, tensor<4x32xbf16>, tensor<4x32xbf16>) {
  %a = ad.linear_int4 %x, %wa, %za, %sa g_idx %ga group 16 zero_offset 1 : (tensor<4x64xbf16>, tensor<8x32xi32>, tensor<4x4xi32>, tensor<4x32xf16>, tensor<64xi32>) -> tensor<4x32xbf16>
  %b = ad.linear_int4 %x, %wb, %zb, %sb g_idx %gb group 16 zero_offset 1 : (tensor<4x64xbf16>, tensor<8x32xi32>, tensor<4x4xi32>, tensor<4x32xf16>, tensor<64xi32>) -> tensor<4x32xbf16>
  %c = ad.linear_int4 %x, %wc, %zc, %sc group 16 zero_offset 1 : (tensor<4x64xbf16>, tensor<8x32xi32>, tensor<4x4xi32>, tensor<4x32xf16>) -> tensor<4x32xbf16>
  %d = ad.linear_int4 %x, %wd, %zd, %sd group 16 zero_offset 0 : (tensor<4x64xbf16>, tensor<8x32xi32>, tensor<4x4xi32>, tensor<4x32xf16>) -> tensor<4x32xbf16>
  func.return %a, %b, %c, %d : tensor<4x32xbf16>, tensor<4x32xbf16>, tensor<4x32xbf16>, tensor<4x32xbf16>
}
