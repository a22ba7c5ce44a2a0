// match-layernorm: the LayerNorm spellings of the models become one ad.layer_norm; chains the op
// cannot stand for stay as they are.
// RUN: ad-opt %s --split-input-file -p match-layernorm | filecheck %s

// nn.LayerNorm (GPT-2's ln_1), as the importer carries it: torch's layer_norm over the last dim.
// CHECK-LABEL: func.func @torch_layer_norm
// CHECK-NEXT:    %[[N:.*]] = ad.layer_norm %x weight %w bias %b eps 1.000000e-05 : (tensor<1x?x64xbf16> weight tensor<64xbf16> bias tensor<64xbf16>) -> tensor<1x?x64xbf16>
// CHECK-NEXT:    func.return %[[N]]
// CHECK-NOT:     ad.torch_op
func.func @torch_layer_norm(%x: tensor<1x?x64xbf16>, %w: tensor<64xbf16>, %b: tensor<64xbf16>) -> tensor<1x?x64xbf16> {
  %n = ad.torch_op "aten.layer_norm.default"(%x, %w, %b) [#ad.ref<0>, [64 : i64], #ad.ref<1>, #ad.ref<2>, 1.000000e-05 : f64, false] {} : (tensor<1x?x64xbf16>, tensor<64xbf16>, tensor<64xbf16>) -> tensor<1x?x64xbf16>
  func.return %n : tensor<1x?x64xbf16>
}

// -----

// OLMo: F.layer_norm(x.float(), shape, None, None, eps).to(x.dtype) is the LayerNorm of x,
// rounded once. Also F.layer_norm with its defaults left out, and eps as a keyword.
// CHECK-LABEL: func.func @olmo_casts
// CHECK-NEXT:    %[[N:.*]] = ad.layer_norm %x eps 1.000000e-05 : (tensor<1x?x64xbf16>) -> tensor<1x?x64xbf16>
// CHECK-NEXT:    %[[M:.*]] = ad.layer_norm %y eps 1.000000e-06 : (tensor<3x64xf32>) -> tensor<3x64xf32>
// CHECK-NEXT:    func.return %[[N]], %[[M]]
// CHECK-NOT:     ad.cast
func.func @olmo_casts(%x: tensor<1x?x64xbf16>, %y: tensor<3x64xf32>) -> (tensor<1x?x64xbf16>, tensor<3x64xf32>) {
  %xf = ad.cast %x : tensor<1x?x64xbf16> -> tensor<1x?x64xf32>
  %n = ad.torch_op "aten.layer_norm.default"(%xf) [#ad.ref<0>, [64 : i64], none, none, 1.000000e-05 : f64, false] {} : (tensor<1x?x64xf32>) -> tensor<1x?x64xf32>
  %nb = ad.cast %n : tensor<1x?x64xf32> -> tensor<1x?x64xbf16>
  %m = ad.torch_op "aten.layer_norm.default"(%y) [#ad.ref<0>, [64 : i64]] {eps = 1.000000e-06 : f64} : (tensor<3x64xf32>) -> tensor<3x64xf32>
  func.return %nb, %m : tensor<1x?x64xbf16>, tensor<3x64xf32>
}

// -----

// Cohere in bf16: x.to(f32), mean, x - mean, pow 2, mean, + eps, rsqrt, (x - mean) * r,
// w.to(f32) * n, .to(bf16). The op takes the bf16 input and the bf16 weight, not their casts.
// CHECK-LABEL: func.func @cohere_bf16
// CHECK-NEXT:    %[[N:.*]] = ad.layer_norm %x weight %w eps 1.000000e-05 : (tensor<2x?x64xbf16> weight tensor<64xbf16>) -> tensor<2x?x64xbf16>
// CHECK-NEXT:    func.return %[[N]]
// CHECK-NOT:     ad.rsqrt
func.func @cohere_bf16(%x: tensor<2x?x64xbf16>, %w: tensor<64xbf16>) -> tensor<2x?x64xbf16> {
  %two = ad.constant 2 : i64
  %eps = ad.constant 1.0e-05 : f64
  %xf = ad.cast %x : tensor<2x?x64xbf16> -> tensor<2x?x64xf32>
  %mean = ad.mean %xf dim [-1] keepdim : tensor<2x?x64xf32> -> tensor<2x?x1xf32>
  %d = ad.sub %xf, %mean : tensor<2x?x64xf32>, tensor<2x?x1xf32> -> tensor<2x?x64xf32>
  %sq = ad.pow %d, %two : tensor<2x?x64xf32>, i64 -> tensor<2x?x64xf32>
  %var = ad.mean %sq dim [-1] keepdim : tensor<2x?x64xf32> -> tensor<2x?x1xf32>
  %shifted = ad.add %var, %eps : tensor<2x?x1xf32>, f64 -> tensor<2x?x1xf32>
  %r = ad.rsqrt %shifted : tensor<2x?x1xf32> -> tensor<2x?x1xf32>
  %n = ad.mul %d, %r : tensor<2x?x64xf32>, tensor<2x?x1xf32> -> tensor<2x?x64xf32>
  %wf = ad.cast %w : tensor<64xbf16> -> tensor<64xf32>
  %y = ad.mul %wf, %n : tensor<64xf32>, tensor<2x?x64xf32> -> tensor<2x?x64xf32>
  %yb = ad.cast %y : tensor<2x?x64xf32> -> tensor<2x?x64xbf16>
  func.return %yb : tensor<2x?x64xbf16>
}

// -----

// fp32 with a bias: d * d for the square, r * d, eps first, n * w + b.
// CHECK-LABEL: func.func @fp32_weight_bias
// CHECK-NEXT:    %[[N:.*]] = ad.layer_norm %x weight %w bias %b eps 1.000000e-06 : (tensor<4x96xf32> weight tensor<96xf32> bias tensor<96xf32>) -> tensor<4x96xf32>
// CHECK-NEXT:    func.return %[[N]]
func.func @fp32_weight_bias(%x: tensor<4x96xf32>, %w: tensor<96xf32>, %b: tensor<96xf32>) -> tensor<4x96xf32> {
  %eps = ad.constant 1.0e-06 : f64
  %mean = ad.mean %x dim [1] keepdim : tensor<4x96xf32> -> tensor<4x1xf32>
  %d = ad.sub %x, %mean : tensor<4x96xf32>, tensor<4x1xf32> -> tensor<4x96xf32>
  %sq = ad.mul %d, %d : tensor<4x96xf32>, tensor<4x96xf32> -> tensor<4x96xf32>
  %var = ad.mean %sq dim [-1] keepdim : tensor<4x96xf32> -> tensor<4x1xf32>
  %shifted = ad.add %eps, %var : f64, tensor<4x1xf32> -> tensor<4x1xf32>
  %r = ad.rsqrt %shifted : tensor<4x1xf32> -> tensor<4x1xf32>
  %n = ad.mul %r, %d : tensor<4x1xf32>, tensor<4x96xf32> -> tensor<4x96xf32>
  %y = ad.mul %n, %w : tensor<4x96xf32>, tensor<96xf32> -> tensor<4x96xf32>
  %z = ad.add %b, %y : tensor<96xf32>, tensor<4x96xf32> -> tensor<4x96xf32>
  func.return %z : tensor<4x96xf32>
}

// -----

// A weight applied in bf16 after the cast (two roundings) is no ad.layer_norm weight: the op
// ends at the cast and the multiply stays. The normalized value has two users (a parallel
// block's attention and MLP): it is still one op.
// CHECK-LABEL: func.func @narrow_weight_two_users
// CHECK-NEXT:    %[[N:.*]] = ad.layer_norm %x eps 1.000000e-05 : (tensor<3x64xbf16>) -> tensor<3x64xbf16>
// CHECK-NEXT:    %[[Y:.*]] = ad.mul %w, %[[N]]
// CHECK-NEXT:    %[[E:.*]] = ad.exp %[[Y]]
// CHECK-NEXT:    func.return %[[Y]], %[[E]]
func.func @narrow_weight_two_users(%x: tensor<3x64xbf16>, %w: tensor<64xbf16>) -> (tensor<3x64xbf16>, tensor<3x64xbf16>) {
  %two = ad.constant 2 : i64
  %eps = ad.constant 1.0e-05 : f64
  %xf = ad.cast %x : tensor<3x64xbf16> -> tensor<3x64xf32>
  %mean = ad.mean %xf dim [-1] keepdim : tensor<3x64xf32> -> tensor<3x1xf32>
  %d = ad.sub %xf, %mean : tensor<3x64xf32>, tensor<3x1xf32> -> tensor<3x64xf32>
  %sq = ad.pow %d, %two : tensor<3x64xf32>, i64 -> tensor<3x64xf32>
  %var = ad.mean %sq dim [-1] keepdim : tensor<3x64xf32> -> tensor<3x1xf32>
  %shifted = ad.add %var, %eps : tensor<3x1xf32>, f64 -> tensor<3x1xf32>
  %r = ad.rsqrt %shifted : tensor<3x1xf32> -> tensor<3x1xf32>
  %n = ad.mul %d, %r : tensor<3x64xf32>, tensor<3x1xf32> -> tensor<3x64xf32>
  %nb = ad.cast %n : tensor<3x64xf32> -> tensor<3x64xbf16>
  %y = ad.mul %w, %nb : tensor<64xbf16>, tensor<3x64xbf16> -> tensor<3x64xbf16>
  %e = ad.exp %y : tensor<3x64xbf16> -> tensor<3x64xbf16>
  func.return %y, %e : tensor<3x64xbf16>, tensor<3x64xbf16>
}

// -----

// AOTAutograd's native_layer_norm (the torch.compile backend's graphs) whose mean and rstd are
// unused; where the rstd is read, the op stays.
// CHECK-LABEL: func.func @native_layer_norm
// CHECK-NEXT:    %[[N:.*]] = ad.layer_norm %x weight %w bias %b eps 1.000000e-05 : (tensor<2x96xf32> weight tensor<96xf32> bias tensor<96xf32>) -> tensor<2x96xf32>
// CHECK-NEXT:    %{{.*}}, %{{.*}}, %[[RSTD:.*]] = ad.torch_op "aten.native_layer_norm.default"(%x, %w, %b)
// CHECK-NEXT:    func.return %[[N]], %[[RSTD]]
func.func @native_layer_norm(%x: tensor<2x96xf32>, %w: tensor<96xf32>, %b: tensor<96xf32>) -> (tensor<2x96xf32>, tensor<2x1xf32>) {
  %0, %1, %2 = ad.torch_op "aten.native_layer_norm.default"(%x, %w, %b) [#ad.ref<0>, [96 : i64], #ad.ref<1>, #ad.ref<2>, 1.000000e-05 : f64] {} unpack : (tensor<2x96xf32>, tensor<96xf32>, tensor<96xf32>) -> (tensor<2x96xf32>, tensor<2x1xf32>, tensor<2x1xf32>)
  %3, %4, %5 = ad.torch_op "aten.native_layer_norm.default"(%x, %w, %b) [#ad.ref<0>, [96 : i64], #ad.ref<1>, #ad.ref<2>, 1.000000e-05 : f64] {} unpack : (tensor<2x96xf32>, tensor<96xf32>, tensor<96xf32>) -> (tensor<2x96xf32>, tensor<2x1xf32>, tensor<2x1xf32>)
  func.return %0, %5 : tensor<2x96xf32>, tensor<2x1xf32>
}

// -----

// Not LayerNorms: the centered value read elsewhere; a mean over another dim; an RMSNorm (no
// centering); native_layer_norm over two dims. All stay as they are.
// CHECK-LABEL: func.func @not_layer_norms
// CHECK-NOT:     ad.layer_norm
// CHECK:         %[[D:.*]] = ad.sub %x, %{{.*}}
// CHECK:         ad.rsqrt
// CHECK:         ad.mean %x dim [0] keepdim
// CHECK:         ad.rsqrt
// CHECK:         ad.pow %x
// CHECK:         ad.rsqrt
// CHECK:         ad.torch_op "aten.native_layer_norm.default"
// CHECK:         func.return %{{.*}}, %[[D]]
func.func @not_layer_norms(%x: tensor<4x96xf32>, %w2: tensor<2x96xf32>) -> (tensor<4x96xf32>, tensor<4x96xf32>, tensor<4x96xf32>, tensor<4x96xf32>, tensor<4x96xf32>) {
  %two = ad.constant 2 : i64
  %eps = ad.constant 1.0e-05 : f64
  %mean = ad.mean %x dim [-1] keepdim : tensor<4x96xf32> -> tensor<4x1xf32>
  %d = ad.sub %x, %mean : tensor<4x96xf32>, tensor<4x1xf32> -> tensor<4x96xf32>
  %sq = ad.pow %d, %two : tensor<4x96xf32>, i64 -> tensor<4x96xf32>
  %var = ad.mean %sq dim [-1] keepdim : tensor<4x96xf32> -> tensor<4x1xf32>
  %shifted = ad.add %var, %eps : tensor<4x1xf32>, f64 -> tensor<4x1xf32>
  %r = ad.rsqrt %shifted : tensor<4x1xf32> -> tensor<4x1xf32>
  %n = ad.mul %d, %r : tensor<4x96xf32>, tensor<4x1xf32> -> tensor<4x96xf32>
  %cmean = ad.mean %x dim [0] keepdim : tensor<4x96xf32> -> tensor<1x96xf32>
  %cd = ad.sub %x, %cmean : tensor<4x96xf32>, tensor<1x96xf32> -> tensor<4x96xf32>
  %csq = ad.pow %cd, %two : tensor<4x96xf32>, i64 -> tensor<4x96xf32>
  %cvar = ad.mean %csq dim [-1] keepdim : tensor<4x96xf32> -> tensor<4x1xf32>
  %cshifted = ad.add %cvar, %eps : tensor<4x1xf32>, f64 -> tensor<4x1xf32>
  %cr = ad.rsqrt %cshifted : tensor<4x1xf32> -> tensor<4x1xf32>
  %cn = ad.mul %cd, %cr : tensor<4x96xf32>, tensor<4x1xf32> -> tensor<4x96xf32>
  %rsq = ad.pow %x, %two : tensor<4x96xf32>, i64 -> tensor<4x96xf32>
  %rvar = ad.mean %rsq dim [-1] keepdim : tensor<4x96xf32> -> tensor<4x1xf32>
  %rshifted = ad.add %rvar, %eps : tensor<4x1xf32>, f64 -> tensor<4x1xf32>
  %rr = ad.rsqrt %rshifted : tensor<4x1xf32> -> tensor<4x1xf32>
  %rn = ad.mul %x, %rr : tensor<4x96xf32>, tensor<4x1xf32> -> tensor<4x96xf32>
  %x3 = ad.reshape %x [2, 2, 96] : tensor<4x96xf32> -> tensor<2x2x96xf32>
  %0, %1, %2 = ad.torch_op "aten.native_layer_norm.default"(%x3, %w2) [#ad.ref<0>, [2 : i64, 96 : i64], #ad.ref<1>, #ad.ref<1>, 1.000000e-05 : f64] {} unpack : (tensor<2x2x96xf32>, tensor<2x96xf32>) -> (tensor<2x2x96xf32>, tensor<2x1x1xf32>, tensor<2x1x1xf32>)
  %back = ad.reshape %0 [4, 96] : tensor<2x2x96xf32> -> tensor<4x96xf32>
  func.return %n, %cn, %rn, %back, %d : tensor<4x96xf32>, tensor<4x96xf32>, tensor<4x96xf32>, tensor<4x96xf32>, tensor<4x96xf32>
}

// -----

// A layer_norm call that cannot be read (here its normalized_shape is missing) stays as it is.
// CHECK-LABEL: func.func @unreadable_call
// CHECK-NEXT:    ad.torch_op "aten.layer_norm.default"(%x) [#ad.ref<0>]
func.func @unreadable_call(%x: tensor<3x64xf32>) -> tensor<3x64xf32> {
  %n = ad.torch_op "aten.layer_norm.default"(%x) [#ad.ref<0>] {} : (tensor<3x64xf32>) -> tensor<3x64xf32>
  func.return %n : tensor<3x64xf32>
}
