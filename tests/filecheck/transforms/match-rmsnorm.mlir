// match-rmsnorm: the RMSNorm spellings of the HF families become one ad.rms_norm; chains the op
// cannot stand for stay as they are.
// RUN: ad-opt %s --split-input-file -p match-rmsnorm | filecheck %s

// Llama/Qwen2/Mistral in bf16: x.to(f32), pow 2, mean(-1, keepdim), + eps, rsqrt, x * r,
// .to(bf16), weight * n. The op takes the bf16 input, not its f32 cast.
// CHECK-LABEL: func.func @llama_bf16
// CHECK-NEXT:    %[[N:.*]] = ad.rms_norm %x weight %w eps 1.000000e-05 : (tensor<2x?x64xbf16>, tensor<64xbf16>) -> tensor<2x?x64xbf16>
// CHECK-NEXT:    func.return %[[N]]
func.func @llama_bf16(%x: tensor<2x?x64xbf16>, %w: tensor<64xbf16>) -> tensor<2x?x64xbf16> {
  %two = ad.constant 2 : i64
  %eps = ad.constant 1.0e-05 : f64
  %xf = ad.cast %x : tensor<2x?x64xbf16> -> tensor<2x?x64xf32>
  %sq = ad.pow %xf, %two : tensor<2x?x64xf32>, i64 -> tensor<2x?x64xf32>
  %mean = ad.mean %sq dim [-1] keepdim : tensor<2x?x64xf32> -> tensor<2x?x1xf32>
  %var = ad.add %mean, %eps : tensor<2x?x1xf32>, f64 -> tensor<2x?x1xf32>
  %r = ad.rsqrt %var : tensor<2x?x1xf32> -> tensor<2x?x1xf32>
  %n = ad.mul %xf, %r : tensor<2x?x64xf32>, tensor<2x?x1xf32> -> tensor<2x?x64xf32>
  %nb = ad.cast %n : tensor<2x?x64xf32> -> tensor<2x?x64xbf16>
  %y = ad.mul %w, %nb : tensor<64xbf16>, tensor<2x?x64xbf16> -> tensor<2x?x64xbf16>
  func.return %y : tensor<2x?x64xbf16>
}

// -----

// The same in f32 (no casts): the weight multiply is in fp32 anyway, and the op keeps Llama's
// plain form (no weight_in_fp32).
// CHECK-LABEL: func.func @llama_f32
// CHECK-NEXT:    %[[N:.*]] = ad.rms_norm %x weight %w eps 1.000000e-05 : (tensor<2x?x64xf32>, tensor<64xf32>) -> tensor<2x?x64xf32>
// CHECK-NEXT:    func.return %[[N]]
func.func @llama_f32(%x: tensor<2x?x64xf32>, %w: tensor<64xf32>) -> tensor<2x?x64xf32> {
  %two = ad.constant 2 : i64
  %eps = ad.constant 1.0e-05 : f64
  %sq = ad.pow %x, %two : tensor<2x?x64xf32>, i64 -> tensor<2x?x64xf32>
  %mean = ad.mean %sq dim [-1] keepdim : tensor<2x?x64xf32> -> tensor<2x?x1xf32>
  %var = ad.add %mean, %eps : tensor<2x?x1xf32>, f64 -> tensor<2x?x1xf32>
  %r = ad.rsqrt %var : tensor<2x?x1xf32> -> tensor<2x?x1xf32>
  %n = ad.mul %x, %r : tensor<2x?x64xf32>, tensor<2x?x1xf32> -> tensor<2x?x64xf32>
  %y = ad.mul %w, %n : tensor<64xf32>, tensor<2x?x64xf32> -> tensor<2x?x64xf32>
  func.return %y : tensor<2x?x64xf32>
}

// -----

// Gemma in bf16: x.float(), the same normalization, then n * (1.0 + w.float()) in f32 and
// .type_as(x): the weight multiply is in fp32 with offset 1.
// CHECK-LABEL: func.func @gemma_bf16
// CHECK-NEXT:    %[[N:.*]] = ad.rms_norm %x weight %w eps 1.000000e-06 offset 1.000000e+00 weight_in_fp32 : (tensor<3x64xbf16>, tensor<64xbf16>) -> tensor<3x64xbf16>
// CHECK-NEXT:    func.return %[[N]]
func.func @gemma_bf16(%x: tensor<3x64xbf16>, %w: tensor<64xbf16>) -> tensor<3x64xbf16> {
  %two = ad.constant 2 : i64
  %eps = ad.constant 1.0e-06 : f64
  %one = ad.constant 1.0 : f64
  %xf = ad.cast %x : tensor<3x64xbf16> -> tensor<3x64xf32>
  %sq = ad.pow %xf, %two : tensor<3x64xf32>, i64 -> tensor<3x64xf32>
  %mean = ad.mean %sq dim [-1] keepdim : tensor<3x64xf32> -> tensor<3x1xf32>
  %var = ad.add %mean, %eps : tensor<3x1xf32>, f64 -> tensor<3x1xf32>
  %r = ad.rsqrt %var : tensor<3x1xf32> -> tensor<3x1xf32>
  %n = ad.mul %xf, %r : tensor<3x64xf32>, tensor<3x1xf32> -> tensor<3x64xf32>
  %wf = ad.cast %w : tensor<64xbf16> -> tensor<64xf32>
  %w1 = ad.add %one, %wf : f64, tensor<64xf32> -> tensor<64xf32>
  %y = ad.mul %n, %w1 : tensor<3x64xf32>, tensor<64xf32> -> tensor<3x64xf32>
  %yb = ad.cast %y : tensor<3x64xf32> -> tensor<3x64xbf16>
  func.return %yb : tensor<3x64xbf16>
}

// -----

// fp32, x * x for the square, rsqrt * x operand order, no weight.
// CHECK-LABEL: func.func @fp32_square_no_weight
// CHECK-NEXT:    %[[N:.*]] = ad.rms_norm %x eps 1.000000e-06 : (tensor<4x32xf32>) -> tensor<4x32xf32>
// CHECK-NEXT:    func.return %[[N]]
func.func @fp32_square_no_weight(%x: tensor<4x32xf32>) -> tensor<4x32xf32> {
  %eps = ad.constant 1.0e-06 : f64
  %sq = ad.mul %x, %x : tensor<4x32xf32>, tensor<4x32xf32> -> tensor<4x32xf32>
  %mean = ad.mean %sq dim [1] keepdim : tensor<4x32xf32> -> tensor<4x1xf32>
  %var = ad.add %eps, %mean : f64, tensor<4x1xf32> -> tensor<4x1xf32>
  %r = ad.rsqrt %var : tensor<4x1xf32> -> tensor<4x1xf32>
  %n = ad.mul %r, %x : tensor<4x1xf32>, tensor<4x32xf32> -> tensor<4x32xf32>
  func.return %n : tensor<4x32xf32>
}

// -----

// Not an RMSNorm over the last dim: the mean reduces dim 0.
// CHECK-LABEL: func.func @mean_over_rows
// CHECK-NOT:     ad.rms_norm
// CHECK:         ad.rsqrt
func.func @mean_over_rows(%x: tensor<4x32xf32>) -> tensor<4x32xf32> {
  %two = ad.constant 2 : i64
  %eps = ad.constant 1.0e-06 : f64
  %sq = ad.pow %x, %two : tensor<4x32xf32>, i64 -> tensor<4x32xf32>
  %mean = ad.mean %sq dim [0] keepdim : tensor<4x32xf32> -> tensor<1x32xf32>
  %var = ad.add %mean, %eps : tensor<1x32xf32>, f64 -> tensor<1x32xf32>
  %r = ad.rsqrt %var : tensor<1x32xf32> -> tensor<1x32xf32>
  %n = ad.mul %x, %r : tensor<4x32xf32>, tensor<1x32xf32> -> tensor<4x32xf32>
  func.return %n : tensor<4x32xf32>
}

// -----

// The reciprocal root is also returned: replacing the chain would lose it (and recompute it).
// CHECK-LABEL: func.func @rsqrt_used_twice
// CHECK-NOT:     ad.rms_norm
// CHECK:         ad.rsqrt
func.func @rsqrt_used_twice(%x: tensor<4x32xf32>) -> (tensor<4x32xf32>, tensor<4x1xf32>) {
  %two = ad.constant 2 : i64
  %eps = ad.constant 1.0e-06 : f64
  %sq = ad.pow %x, %two : tensor<4x32xf32>, i64 -> tensor<4x32xf32>
  %mean = ad.mean %sq dim [-1] keepdim : tensor<4x32xf32> -> tensor<4x1xf32>
  %var = ad.add %mean, %eps : tensor<4x1xf32>, f64 -> tensor<4x1xf32>
  %r = ad.rsqrt %var : tensor<4x1xf32> -> tensor<4x1xf32>
  %n = ad.mul %x, %r : tensor<4x32xf32>, tensor<4x1xf32> -> tensor<4x32xf32>
  func.return %n, %r : tensor<4x32xf32>, tensor<4x1xf32>
}

// -----

// Normalizing in bf16 (no cast to f32 first) rounds differently from the op's fp32 math.
// CHECK-LABEL: func.func @bf16_math
// CHECK-NOT:     ad.rms_norm
// CHECK:         ad.rsqrt
func.func @bf16_math(%x: tensor<4x32xbf16>) -> tensor<4x32xbf16> {
  %two = ad.constant 2 : i64
  %eps = ad.constant 1.0e-06 : f64
  %sq = ad.pow %x, %two : tensor<4x32xbf16>, i64 -> tensor<4x32xbf16>
  %mean = ad.mean %sq dim [-1] keepdim : tensor<4x32xbf16> -> tensor<4x1xbf16>
  %var = ad.add %mean, %eps : tensor<4x1xbf16>, f64 -> tensor<4x1xbf16>
  %r = ad.rsqrt %var : tensor<4x1xbf16> -> tensor<4x1xbf16>
  %n = ad.mul %x, %r : tensor<4x32xbf16>, tensor<4x1xbf16> -> tensor<4x32xbf16>
  func.return %n : tensor<4x32xbf16>
}

// -----

// A bf16 input normalized in f32 but cast to f16 at the end: no op form has that result type.
// CHECK-LABEL: func.func @cast_to_another_dtype
// CHECK-NOT:     ad.rms_norm
// CHECK:         ad.rsqrt
func.func @cast_to_another_dtype(%x: tensor<4x32xbf16>) -> tensor<4x32xf16> {
  %two = ad.constant 2 : i64
  %eps = ad.constant 1.0e-06 : f64
  %xf = ad.cast %x : tensor<4x32xbf16> -> tensor<4x32xf32>
  %sq = ad.pow %xf, %two : tensor<4x32xf32>, i64 -> tensor<4x32xf32>
  %mean = ad.mean %sq dim [-1] keepdim : tensor<4x32xf32> -> tensor<4x1xf32>
  %var = ad.add %mean, %eps : tensor<4x1xf32>, f64 -> tensor<4x1xf32>
  %r = ad.rsqrt %var : tensor<4x1xf32> -> tensor<4x1xf32>
  %n = ad.mul %xf, %r : tensor<4x32xf32>, tensor<4x1xf32> -> tensor<4x32xf32>
  %nh = ad.cast %n : tensor<4x32xf32> -> tensor<4x32xf16>
  func.return %nh : tensor<4x32xf16>
}

// -----

// The mean of x^3, not of x^2: no RMSNorm.
// CHECK-LABEL: func.func @cube
// CHECK-NOT:     ad.rms_norm
// CHECK:         ad.rsqrt
func.func @cube(%x: tensor<4x32xf32>) -> tensor<4x32xf32> {
  %three = ad.constant 3 : i64
  %eps = ad.constant 1.0e-06 : f64
  %cb = ad.pow %x, %three : tensor<4x32xf32>, i64 -> tensor<4x32xf32>
  %mean = ad.mean %cb dim [-1] keepdim : tensor<4x32xf32> -> tensor<4x1xf32>
  %var = ad.add %mean, %eps : tensor<4x1xf32>, f64 -> tensor<4x1xf32>
  %r = ad.rsqrt %var : tensor<4x1xf32> -> tensor<4x1xf32>
  %n = ad.mul %x, %r : tensor<4x32xf32>, tensor<4x1xf32> -> tensor<4x32xf32>
  func.return %n : tensor<4x32xf32>
}

// -----

// eps subtracted, not added: no RMSNorm.
// CHECK-LABEL: func.func @eps_subtracted
// CHECK-NOT:     ad.rms_norm
// CHECK:         ad.rsqrt
func.func @eps_subtracted(%x: tensor<4x32xf32>) -> tensor<4x32xf32> {
  %two = ad.constant 2 : i64
  %eps = ad.constant 1.0e-06 : f64
  %sq = ad.pow %x, %two : tensor<4x32xf32>, i64 -> tensor<4x32xf32>
  %mean = ad.mean %sq dim [-1] keepdim : tensor<4x32xf32> -> tensor<4x1xf32>
  %var = ad.sub %mean, %eps : tensor<4x1xf32>, f64 -> tensor<4x1xf32>
  %r = ad.rsqrt %var : tensor<4x1xf32> -> tensor<4x1xf32>
  %n = ad.mul %x, %r : tensor<4x32xf32>, tensor<4x1xf32> -> tensor<4x32xf32>
  func.return %n : tensor<4x32xf32>
}
