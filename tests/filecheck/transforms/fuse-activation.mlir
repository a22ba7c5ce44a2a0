// fuse-activation: the activation of an ungated MLP's up projection between GEMMs (with the
// bias add when the GEMM does not do it) becomes one ad.activation.
// RUN: ad-opt %s --split-input-file -p fuse-activation | filecheck %s

// nn.Linear adds its bias inside the GEMM: the op is the activation alone. StarCoder2's
// gelu_pytorch_tanh, GPT-NeoX's erf GELU, OPT's ReLU, a SiLU.
// CHECK-LABEL: func.func @linear_with_bias
// CHECK-NEXT:    %h = ad.linear %x, %w1 bias %b1 : (tensor<1x?x64xbf16>, tensor<200x64xbf16>, tensor<200xbf16>) -> tensor<1x?x200xbf16>
// CHECK-NEXT:    %[[T:.*]] = ad.activation "gelu_tanh" %h : (tensor<1x?x200xbf16>) -> tensor<1x?x200xbf16>
// CHECK-NEXT:    %o = ad.linear %[[T]], %w2 bias %b2
// CHECK-NEXT:    %[[E:.*]] = ad.activation "gelu" %h : (tensor<1x?x200xbf16>) -> tensor<1x?x200xbf16>
// CHECK-NEXT:    %o2 = ad.linear %[[E]], %w2
// CHECK-NEXT:    %[[R:.*]] = ad.activation "relu" %h : (tensor<1x?x200xbf16>) -> tensor<1x?x200xbf16>
// CHECK-NEXT:    %o3 = ad.linear %[[R]], %w2
// CHECK-NEXT:    %[[S:.*]] = ad.activation "silu" %h : (tensor<1x?x200xbf16>) -> tensor<1x?x200xbf16>
// CHECK-NEXT:    %o4 = ad.linear %[[S]], %w2
// CHECK-NEXT:    func.return
// CHECK-NOT:     ad.gelu %
// CHECK-NOT:     ad.relu
// CHECK-NOT:     ad.silu %
func.func @linear_with_bias(%x: tensor<1x?x64xbf16>, %w1: tensor<200x64xbf16>, %b1: tensor<200xbf16>, %w2: tensor<64x200xbf16>, %b2: tensor<64xbf16>) -> (tensor<1x?x64xbf16>, tensor<1x?x64xbf16>, tensor<1x?x64xbf16>, tensor<1x?x64xbf16>) {
  %h = ad.linear %x, %w1 bias %b1 : (tensor<1x?x64xbf16>, tensor<200x64xbf16>, tensor<200xbf16>) -> tensor<1x?x200xbf16>
  %g = ad.gelu %h approximate "tanh" : tensor<1x?x200xbf16> -> tensor<1x?x200xbf16>
  %o = ad.linear %g, %w2 bias %b2 : (tensor<1x?x200xbf16>, tensor<64x200xbf16>, tensor<64xbf16>) -> tensor<1x?x64xbf16>
  %e = ad.gelu %h : tensor<1x?x200xbf16> -> tensor<1x?x200xbf16>
  %o2 = ad.linear %e, %w2 : (tensor<1x?x200xbf16>, tensor<64x200xbf16>) -> tensor<1x?x64xbf16>
  %r = ad.relu %h : tensor<1x?x200xbf16> -> tensor<1x?x200xbf16>
  %o3 = ad.linear %r, %w2 : (tensor<1x?x200xbf16>, tensor<64x200xbf16>) -> tensor<1x?x64xbf16>
  %s = ad.silu %h : tensor<1x?x200xbf16> -> tensor<1x?x200xbf16>
  %o4 = ad.linear %s, %w2 : (tensor<1x?x200xbf16>, tensor<64x200xbf16>) -> tensor<1x?x64xbf16>
  func.return %o, %o2, %o3, %o4 : tensor<1x?x64xbf16>, tensor<1x?x64xbf16>, tensor<1x?x64xbf16>, tensor<1x?x64xbf16>
}

// -----

// Falcon's FalconLinear adds the bias after a matmul: the op takes it (either operand order).
// ReLU^2 as torch.square exports it (r * r) and as pow(r, 2).
// CHECK-LABEL: func.func @bias_after_matmul
// CHECK-NEXT:    %m = ad.matmul %x, %wt
// CHECK-NEXT:    %[[A:.*]] = ad.activation "gelu" %m bias %b : (tensor<1x?x200xf32>, tensor<200xf32>) -> tensor<1x?x200xf32>
// CHECK-NEXT:    %o = ad.matmul %[[A]], %w2t
// CHECK-NEXT:    %[[B:.*]] = ad.activation "relu2" %m bias %b : (tensor<1x?x200xf32>, tensor<200xf32>) -> tensor<1x?x200xf32>
// CHECK-NEXT:    %o2 = ad.matmul %[[B]], %w2t
// CHECK-NEXT:    %[[C:.*]] = ad.activation "relu2" %m : (tensor<1x?x200xf32>) -> tensor<1x?x200xf32>
// CHECK-NEXT:    %o3 = ad.matmul %[[C]], %w2t
// CHECK-NEXT:    func.return
// CHECK-NOT:     ad.add
// CHECK-NOT:     ad.constant
func.func @bias_after_matmul(%x: tensor<1x?x64xf32>, %wt: tensor<64x200xf32>, %b: tensor<200xf32>, %w2t: tensor<200x64xf32>) -> (tensor<1x?x64xf32>, tensor<1x?x64xf32>, tensor<1x?x64xf32>) {
  %m = ad.matmul %x, %wt : (tensor<1x?x64xf32>, tensor<64x200xf32>) -> tensor<1x?x200xf32>
  %a = ad.add %m, %b : tensor<1x?x200xf32>, tensor<200xf32> -> tensor<1x?x200xf32>
  %g = ad.gelu %a : tensor<1x?x200xf32> -> tensor<1x?x200xf32>
  %o = ad.matmul %g, %w2t : (tensor<1x?x200xf32>, tensor<200x64xf32>) -> tensor<1x?x64xf32>
  %a2 = ad.add %b, %m : tensor<200xf32>, tensor<1x?x200xf32> -> tensor<1x?x200xf32>
  %r = ad.relu %a2 : tensor<1x?x200xf32> -> tensor<1x?x200xf32>
  %sq = ad.mul %r, %r : tensor<1x?x200xf32>, tensor<1x?x200xf32> -> tensor<1x?x200xf32>
  %o2 = ad.matmul %sq, %w2t : (tensor<1x?x200xf32>, tensor<200x64xf32>) -> tensor<1x?x64xf32>
  %r2 = ad.relu %m : tensor<1x?x200xf32> -> tensor<1x?x200xf32>
  %two = ad.constant 2 : i64
  %p = ad.pow %r2, %two : tensor<1x?x200xf32>, i64 -> tensor<1x?x200xf32>
  %o3 = ad.matmul %p, %w2t : (tensor<1x?x200xf32>, tensor<200x64xf32>) -> tensor<1x?x64xf32>
  func.return %o, %o2, %o3 : tensor<1x?x64xf32>, tensor<1x?x64xf32>, tensor<1x?x64xf32>
}

// -----

// GPT-2: Conv1D as addmm on a 2-D view (bias inside), NewGELUActivation spelled out in f32,
// a view back, and the down projection's addmm reading it as mat1.
// CHECK-LABEL: func.func @gpt2
// CHECK-NEXT:    %h = ad.addmm %b1, %x, %w1
// CHECK-NEXT:    %v = ad.reshape %h [1, 5, 200]
// CHECK-NEXT:    %[[A:.*]] = ad.activation "gelu_tanh" %v : (tensor<1x5x200xf32>) -> tensor<1x5x200xf32>
// CHECK-NEXT:    %v2 = ad.reshape %[[A]] [-1, 200]
// CHECK-NEXT:    %o = ad.addmm %b2, %v2, %w2
// CHECK-NEXT:    func.return %o
func.func @gpt2(%x: tensor<5x64xf32>, %w1: tensor<64x200xf32>, %b1: tensor<200xf32>, %w2: tensor<200x64xf32>, %b2: tensor<64xf32>) -> tensor<5x64xf32> {
  %h = ad.addmm %b1, %x, %w1 : (tensor<200xf32>, tensor<5x64xf32>, tensor<64x200xf32>) -> tensor<5x200xf32>
  %v = ad.reshape %h [1, 5, 200] : tensor<5x200xf32> -> tensor<1x5x200xf32>
  %0 = ad.constant 5.000000e-01 : f64
  %mul = ad.mul %v, %0 : tensor<1x5x200xf32>, f64 -> tensor<1x5x200xf32>
  %1 = ad.constant 3.000000e+00 : f64
  %pow = ad.pow %v, %1 : tensor<1x5x200xf32>, f64 -> tensor<1x5x200xf32>
  %2 = ad.constant 4.471500e-02 : f64
  %mul_1 = ad.mul %pow, %2 : tensor<1x5x200xf32>, f64 -> tensor<1x5x200xf32>
  %add = ad.add %v, %mul_1 : tensor<1x5x200xf32>, tensor<1x5x200xf32> -> tensor<1x5x200xf32>
  %3 = ad.constant 0.79788456080286541 : f64
  %mul_2 = ad.mul %add, %3 : tensor<1x5x200xf32>, f64 -> tensor<1x5x200xf32>
  %tanh = ad.tanh %mul_2 : tensor<1x5x200xf32> -> tensor<1x5x200xf32>
  %4 = ad.constant 1.000000e+00 : f64
  %add_1 = ad.add %tanh, %4 : tensor<1x5x200xf32>, f64 -> tensor<1x5x200xf32>
  %mul_3 = ad.mul %mul, %add_1 : tensor<1x5x200xf32>, tensor<1x5x200xf32> -> tensor<1x5x200xf32>
  %v2 = ad.reshape %mul_3 [-1, 200] : tensor<1x5x200xf32> -> tensor<5x200xf32>
  %o = ad.addmm %b2, %v2, %w2 : (tensor<64xf32>, tensor<5x200xf32>, tensor<200x64xf32>) -> tensor<5x64xf32>
  func.return %o : tensor<5x64xf32>
}

// -----

// Near misses of GPT-2's tanh GELU stay as they are: x^4 where the formula has x^3, and
// 1 + tanh added with alpha 2 (that is 2 + tanh).
// CHECK-LABEL: func.func @fourth_power
// CHECK-NOT:     ad.activation
// CHECK:         %pow = ad.pow %v, %1
// CHECK-NOT:     ad.activation
// CHECK:         func.return
func.func @fourth_power(%x: tensor<5x64xf32>, %w1: tensor<64x200xf32>, %b1: tensor<200xf32>, %w2: tensor<200x64xf32>, %b2: tensor<64xf32>) -> tensor<5x64xf32> {
  %h = ad.addmm %b1, %x, %w1 : (tensor<200xf32>, tensor<5x64xf32>, tensor<64x200xf32>) -> tensor<5x200xf32>
  %v = ad.reshape %h [1, 5, 200] : tensor<5x200xf32> -> tensor<1x5x200xf32>
  %0 = ad.constant 5.000000e-01 : f64
  %mul = ad.mul %v, %0 : tensor<1x5x200xf32>, f64 -> tensor<1x5x200xf32>
  %1 = ad.constant 4.000000e+00 : f64
  %pow = ad.pow %v, %1 : tensor<1x5x200xf32>, f64 -> tensor<1x5x200xf32>
  %2 = ad.constant 4.471500e-02 : f64
  %mul_1 = ad.mul %pow, %2 : tensor<1x5x200xf32>, f64 -> tensor<1x5x200xf32>
  %add = ad.add %v, %mul_1 : tensor<1x5x200xf32>, tensor<1x5x200xf32> -> tensor<1x5x200xf32>
  %3 = ad.constant 0.79788456080286541 : f64
  %mul_2 = ad.mul %add, %3 : tensor<1x5x200xf32>, f64 -> tensor<1x5x200xf32>
  %tanh = ad.tanh %mul_2 : tensor<1x5x200xf32> -> tensor<1x5x200xf32>
  %4 = ad.constant 1.000000e+00 : f64
  %add_1 = ad.add %tanh, %4 : tensor<1x5x200xf32>, f64 -> tensor<1x5x200xf32>
  %mul_3 = ad.mul %mul, %add_1 : tensor<1x5x200xf32>, tensor<1x5x200xf32> -> tensor<1x5x200xf32>
  %v2 = ad.reshape %mul_3 [-1, 200] : tensor<1x5x200xf32> -> tensor<5x200xf32>
  %o = ad.addmm %b2, %v2, %w2 : (tensor<64xf32>, tensor<5x200xf32>, tensor<200x64xf32>) -> tensor<5x64xf32>
  func.return %o : tensor<5x64xf32>
}

// CHECK-LABEL: func.func @one_plus_tanh_with_alpha
// CHECK-NOT:     ad.activation
// CHECK:         %add_1 = ad.add %tanh, %4 alpha 2
// CHECK-NOT:     ad.activation
// CHECK:         func.return
func.func @one_plus_tanh_with_alpha(%x: tensor<5x64xf32>, %w1: tensor<64x200xf32>, %b1: tensor<200xf32>, %w2: tensor<200x64xf32>, %b2: tensor<64xf32>) -> tensor<5x64xf32> {
  %h = ad.addmm %b1, %x, %w1 : (tensor<200xf32>, tensor<5x64xf32>, tensor<64x200xf32>) -> tensor<5x200xf32>
  %v = ad.reshape %h [1, 5, 200] : tensor<5x200xf32> -> tensor<1x5x200xf32>
  %0 = ad.constant 5.000000e-01 : f64
  %mul = ad.mul %v, %0 : tensor<1x5x200xf32>, f64 -> tensor<1x5x200xf32>
  %1 = ad.constant 3.000000e+00 : f64
  %pow = ad.pow %v, %1 : tensor<1x5x200xf32>, f64 -> tensor<1x5x200xf32>
  %2 = ad.constant 4.471500e-02 : f64
  %mul_1 = ad.mul %pow, %2 : tensor<1x5x200xf32>, f64 -> tensor<1x5x200xf32>
  %add = ad.add %v, %mul_1 : tensor<1x5x200xf32>, tensor<1x5x200xf32> -> tensor<1x5x200xf32>
  %3 = ad.constant 0.79788456080286541 : f64
  %mul_2 = ad.mul %add, %3 : tensor<1x5x200xf32>, f64 -> tensor<1x5x200xf32>
  %tanh = ad.tanh %mul_2 : tensor<1x5x200xf32> -> tensor<1x5x200xf32>
  %4 = ad.constant 1.000000e+00 : f64
  %add_1 = ad.add %tanh, %4 alpha 2 : i64 : tensor<1x5x200xf32>, f64 -> tensor<1x5x200xf32>
  %mul_3 = ad.mul %mul, %add_1 : tensor<1x5x200xf32>, tensor<1x5x200xf32> -> tensor<1x5x200xf32>
  %v2 = ad.reshape %mul_3 [-1, 200] : tensor<1x5x200xf32> -> tensor<5x200xf32>
  %o = ad.addmm %b2, %v2, %w2 : (tensor<64xf32>, tensor<5x200xf32>, tensor<200x64xf32>) -> tensor<5x64xf32>
  func.return %o : tensor<5x64xf32>
}

// -----

// BLOOM: bloom_gelu_forward, x * 0.5 * (1 + tanh(0.79788456 * x * (1 + 0.044715 * x * x))) in
// f32, on a linear with its bias: one gelu_tanh activation, the formula's ops gone.
// CHECK-LABEL: func.func @bloom
// CHECK-NEXT:    %h = ad.linear %x, %w1 bias %b1
// CHECK-NEXT:    %[[A:.*]] = ad.activation "gelu_tanh" %h : (tensor<1x?x200xf32>) -> tensor<1x?x200xf32>
// CHECK-NEXT:    %o = ad.linear %[[A]], %w2
// CHECK-NOT:     ad.tanh
func.func @bloom(%x: tensor<1x?x64xf32>, %w1: tensor<200x64xf32>, %b1: tensor<200xf32>, %w2: tensor<64x200xf32>) -> tensor<1x?x64xf32> {
  %h = ad.linear %x, %w1 bias %b1 : (tensor<1x?x64xf32>, tensor<200x64xf32>, tensor<200xf32>) -> tensor<1x?x200xf32>
  %half = ad.constant 5.000000e-01 : f64
  %mul_1 = ad.mul %h, %half : tensor<1x?x200xf32>, f64 -> tensor<1x?x200xf32>
  %c = ad.constant 0.79788455999999996 : f64
  %mul_2 = ad.mul %h, %c : tensor<1x?x200xf32>, f64 -> tensor<1x?x200xf32>
  %k = ad.constant 4.471500e-02 : f64
  %mul_3 = ad.mul %h, %k : tensor<1x?x200xf32>, f64 -> tensor<1x?x200xf32>
  %mul_4 = ad.mul %mul_3, %h : tensor<1x?x200xf32>, tensor<1x?x200xf32> -> tensor<1x?x200xf32>
  %one = ad.constant 1 : i64
  %add_2 = ad.add %mul_4, %one : tensor<1x?x200xf32>, i64 -> tensor<1x?x200xf32>
  %mul_5 = ad.mul %mul_2, %add_2 : tensor<1x?x200xf32>, tensor<1x?x200xf32> -> tensor<1x?x200xf32>
  %tanh = ad.tanh %mul_5 : tensor<1x?x200xf32> -> tensor<1x?x200xf32>
  %onef = ad.constant 1.000000e+00 : f64
  %add_3 = ad.add %tanh, %onef : tensor<1x?x200xf32>, f64 -> tensor<1x?x200xf32>
  %mul_6 = ad.mul %mul_1, %add_3 : tensor<1x?x200xf32>, tensor<1x?x200xf32> -> tensor<1x?x200xf32>
  %o = ad.linear %mul_6, %w2 : (tensor<1x?x200xf32>, tensor<64x200xf32>) -> tensor<1x?x64xf32>
  func.return %o : tensor<1x?x64xf32>
}

// -----

// Read by the down projection's FP8 input quantization (quantize-linear-fp8's), which
// fuse-rmsnorm-quant then fuses into the activation's kernel.
// CHECK-LABEL: func.func @fp8_down_projection
// CHECK-NEXT:    %h = ad.linear %x, %w1
// CHECK-NEXT:    %[[A:.*]] = ad.activation "relu2" %h : (tensor<4x200xbf16>) -> tensor<4x200xbf16>
// CHECK-NEXT:    %q, %qs = ad.quantize_fp8_dynamic %[[A]] per_token
func.func @fp8_down_projection(%x: tensor<4x64xbf16>, %w1: tensor<200x64xbf16>, %w2: tensor<64x200xf8E4M3FN>, %ws: tensor<f32>) -> tensor<4x64xbf16> {
  %h = ad.linear %x, %w1 : (tensor<4x64xbf16>, tensor<200x64xbf16>) -> tensor<4x200xbf16>
  %r = ad.relu %h : tensor<4x200xbf16> -> tensor<4x200xbf16>
  %sq = ad.mul %r, %r : tensor<4x200xbf16>, tensor<4x200xbf16> -> tensor<4x200xbf16>
  %q, %qs = ad.quantize_fp8_dynamic %sq per_token : tensor<4x200xbf16> -> (tensor<4x200xf8E4M3FN>, tensor<4x1xf32>)
  %o = ad.linear_fp8 %q, %w2, %qs, %ws : (tensor<4x200xf8E4M3FN>, tensor<64x200xf8E4M3FN>, tensor<4x1xf32>, tensor<f32>) -> tensor<4x64xbf16>
  func.return %o : tensor<4x64xbf16>
}

// -----

// Left as they are (fuse-elementwise takes them with their neighbours): an activation read
// by an elementwise op too, one of a value no GEMM made, a bias of another dtype (the add
// promotes), and the tanh GELU spelled out in bf16.
// CHECK-LABEL: func.func @not_fused
// CHECK-NOT:     ad.activation
// CHECK:         %g = ad.gelu %h
// CHECK-NEXT:    %o = ad.linear %g, %w2
// CHECK-NEXT:    %s = ad.add %g, %h
// CHECK-NEXT:    %r = ad.relu %x
// CHECK-NEXT:    %o2 = ad.linear %r, %w2
// CHECK-NEXT:    %a = ad.add %h, %bf
// CHECK-NEXT:    %g2 = ad.gelu %a
// CHECK:         %tanh = ad.tanh
// CHECK:         %o4 = ad.linear %mul_3, %w2
func.func @not_fused(%x: tensor<4x200xbf16>, %w1: tensor<200x200xbf16>, %w2: tensor<64x200xbf16>, %bf: tensor<200xf32>, %w2f: tensor<64x200xf32>) -> (tensor<4x64xbf16>, tensor<4x200xbf16>, tensor<4x64xbf16>, tensor<4x64xf32>, tensor<4x64xbf16>) {
  %h = ad.linear %x, %w1 : (tensor<4x200xbf16>, tensor<200x200xbf16>) -> tensor<4x200xbf16>
  %g = ad.gelu %h : tensor<4x200xbf16> -> tensor<4x200xbf16>
  %o = ad.linear %g, %w2 : (tensor<4x200xbf16>, tensor<64x200xbf16>) -> tensor<4x64xbf16>
  %s = ad.add %g, %h : tensor<4x200xbf16>, tensor<4x200xbf16> -> tensor<4x200xbf16>
  %r = ad.relu %x : tensor<4x200xbf16> -> tensor<4x200xbf16>
  %o2 = ad.linear %r, %w2 : (tensor<4x200xbf16>, tensor<64x200xbf16>) -> tensor<4x64xbf16>
  %a = ad.add %h, %bf : tensor<4x200xbf16>, tensor<200xf32> -> tensor<4x200xf32>
  %g2 = ad.gelu %a : tensor<4x200xf32> -> tensor<4x200xf32>
  %o3 = ad.linear %g2, %w2f : (tensor<4x200xf32>, tensor<64x200xf32>) -> tensor<4x64xf32>
  %0 = ad.constant 5.000000e-01 : f64
  %mul = ad.mul %h, %0 : tensor<4x200xbf16>, f64 -> tensor<4x200xbf16>
  %1 = ad.constant 3.000000e+00 : f64
  %pow = ad.pow %h, %1 : tensor<4x200xbf16>, f64 -> tensor<4x200xbf16>
  %2 = ad.constant 4.471500e-02 : f64
  %mul_1 = ad.mul %pow, %2 : tensor<4x200xbf16>, f64 -> tensor<4x200xbf16>
  %add = ad.add %h, %mul_1 : tensor<4x200xbf16>, tensor<4x200xbf16> -> tensor<4x200xbf16>
  %3 = ad.constant 0.79788456080286541 : f64
  %mul_2 = ad.mul %add, %3 : tensor<4x200xbf16>, f64 -> tensor<4x200xbf16>
  %tanh = ad.tanh %mul_2 : tensor<4x200xbf16> -> tensor<4x200xbf16>
  %4 = ad.constant 1.000000e+00 : f64
  %add_1 = ad.add %tanh, %4 : tensor<4x200xbf16>, f64 -> tensor<4x200xbf16>
  %mul_3 = ad.mul %mul, %add_1 : tensor<4x200xbf16>, tensor<4x200xbf16> -> tensor<4x200xbf16>
  %o4 = ad.linear %mul_3, %w2 : (tensor<4x200xbf16>, tensor<64x200xbf16>) -> tensor<4x64xbf16>
  func.return %o, %s, %o2, %o3, %o4 : tensor<4x64xbf16>, tensor<4x200xbf16>, tensor<4x64xbf16>, tensor<4x64xf32>, tensor<4x64xbf16>
}

// -----

// torch.mm's activation is its first operand, as linear's and matmul's are.
// CHECK-LABEL: func.func @mm
// CHECK-NEXT:    %h = ad.mm %x, %w1
// CHECK-NEXT:    %[[R:.*]] = ad.activation "relu" %h : (tensor<5x200xf32>) -> tensor<5x200xf32>
// CHECK-NEXT:    %o = ad.mm %[[R]], %w2
func.func @mm(%x: tensor<5x64xf32>, %w1: tensor<64x200xf32>, %w2: tensor<200x64xf32>) -> tensor<5x64xf32> {
  %h = ad.mm %x, %w1 : (tensor<5x64xf32>, tensor<64x200xf32>) -> tensor<5x200xf32>
  %r = ad.relu %h : tensor<5x200xf32> -> tensor<5x200xf32>
  %o = ad.mm %r, %w2 : (tensor<5x200xf32>, tensor<200x64xf32>) -> tensor<5x64xf32>
  func.return %o : tensor<5x64xf32>
}
