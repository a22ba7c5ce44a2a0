// fuse-gelu-mul: HF's gated GELU MLP gelu(gate) * up becomes ad.gelu_and_mul, keeping the
// GELU's approximation.
// RUN: ad-opt %s --split-input-file -p fuse-gelu-mul | filecheck %s

// Gemma's shape: separate gate and up projections, gelu_pytorch_tanh; either operand order;
// the erf GELU keeps no approximation.
// CHECK-LABEL: func.func @separate_projections
// CHECK-NEXT:    %gate = ad.linear %x, %wg
// CHECK-NEXT:    %up = ad.linear %x, %wu
// CHECK-NEXT:    %[[T:.*]] = ad.gelu_and_mul %gate, %up approximate "tanh" : (tensor<1x?x200xbf16>, tensor<1x?x200xbf16>) -> tensor<1x?x200xbf16>
// CHECK-NEXT:    %[[E:.*]] = ad.gelu_and_mul %gate, %up : (tensor<1x?x200xbf16>, tensor<1x?x200xbf16>) -> tensor<1x?x200xbf16>
// CHECK-NEXT:    func.return %[[T]], %[[E]]
// CHECK-NOT:     ad.gelu %
// CHECK-NOT:     ad.mul
func.func @separate_projections(%x: tensor<1x?x64xbf16>, %wg: tensor<200x64xbf16>, %wu: tensor<200x64xbf16>) -> (tensor<1x?x200xbf16>, tensor<1x?x200xbf16>) {
  %gate = ad.linear %x, %wg : (tensor<1x?x64xbf16>, tensor<200x64xbf16>) -> tensor<1x?x200xbf16>
  %up = ad.linear %x, %wu : (tensor<1x?x64xbf16>, tensor<200x64xbf16>) -> tensor<1x?x200xbf16>
  %g = ad.gelu %gate approximate "tanh" : tensor<1x?x200xbf16> -> tensor<1x?x200xbf16>
  %y = ad.mul %g, %up : tensor<1x?x200xbf16>, tensor<1x?x200xbf16> -> tensor<1x?x200xbf16>
  %e = ad.gelu %gate : tensor<1x?x200xbf16> -> tensor<1x?x200xbf16>
  %y2 = ad.mul %up, %e : tensor<1x?x200xbf16>, tensor<1x?x200xbf16> -> tensor<1x?x200xbf16>
  func.return %y, %y2 : tensor<1x?x200xbf16>, tensor<1x?x200xbf16>
}

// -----

// One gate_up GEMM: the two last-dim slices fuse-gemms makes, and Phi-3's `gate_up_proj`
// chunked in two (kept as an opaque aten.chunk): the kernel reads both halves through their
// strides, so the slices and the chunk stay.
// CHECK-LABEL: func.func @fused_gate_up
// CHECK-NEXT:    %gate = ad.slice %gu dim 2 [0, 128, 1]
// CHECK-NEXT:    %up = ad.slice %gu dim 2 [128, 256, 1]
// CHECK-NEXT:    %[[A:.*]] = ad.gelu_and_mul %gate, %up approximate "tanh" : (tensor<2x?x128xbf16>, tensor<2x?x128xbf16>) -> tensor<2x?x128xbf16>
// CHECK-NEXT:    %chunk, %chunk_1 = ad.torch_op "aten.chunk.default"(%gu)
// CHECK-NEXT:    %[[B:.*]] = ad.gelu_and_mul %chunk, %chunk_1 approximate "tanh" : (tensor<2x?x128xbf16>, tensor<2x?x128xbf16>) -> tensor<2x?x128xbf16>
// CHECK-NEXT:    func.return %[[A]], %[[B]]
func.func @fused_gate_up(%gu: tensor<2x?x256xbf16>) -> (tensor<2x?x128xbf16>, tensor<2x?x128xbf16>) {
  %gate = ad.slice %gu dim 2 [0, 128, 1] : tensor<2x?x256xbf16> -> tensor<2x?x128xbf16>
  %up = ad.slice %gu dim 2 [128, 256, 1] : tensor<2x?x256xbf16> -> tensor<2x?x128xbf16>
  %g = ad.gelu %gate approximate "tanh" : tensor<2x?x128xbf16> -> tensor<2x?x128xbf16>
  %y = ad.mul %g, %up : tensor<2x?x128xbf16>, tensor<2x?x128xbf16> -> tensor<2x?x128xbf16>
  %chunk, %chunk_1 = ad.torch_op "aten.chunk.default"(%gu) [#ad.ref<0>, 2 : i64, -1 : i64] {} unpack : (tensor<2x?x256xbf16>) -> (tensor<2x?x128xbf16>, tensor<2x?x128xbf16>)
  %g2 = ad.gelu %chunk approximate "tanh" : tensor<2x?x128xbf16> -> tensor<2x?x128xbf16>
  %y2 = ad.mul %g2, %chunk_1 : tensor<2x?x128xbf16>, tensor<2x?x128xbf16> -> tensor<2x?x128xbf16>
  func.return %y, %y2 : tensor<2x?x128xbf16>, tensor<2x?x128xbf16>
}

// -----

// HF's NewGELUActivation (gelu_new) spelled out in f32: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x +
// 0.044715 * x^3))). The whole formula and its constants go.
// CHECK-LABEL: func.func @spelled_out_tanh
// CHECK-NEXT:    %[[A:.*]] = ad.gelu_and_mul %g, %u approximate "tanh" : (tensor<4x200xf32>, tensor<4x200xf32>) -> tensor<4x200xf32>
// CHECK-NEXT:    func.return %[[A]]
// CHECK-NOT:     ad.constant
// CHECK-NOT:     ad.tanh
func.func @spelled_out_tanh(%g: tensor<4x200xf32>, %u: tensor<4x200xf32>) -> tensor<4x200xf32> {
  %0 = ad.constant 5.000000e-01 : f64
  %mul = ad.mul %g, %0 : tensor<4x200xf32>, f64 -> tensor<4x200xf32>
  %1 = ad.constant 3.000000e+00 : f64
  %pow = ad.pow %g, %1 : tensor<4x200xf32>, f64 -> tensor<4x200xf32>
  %2 = ad.constant 4.471500e-02 : f64
  %mul_1 = ad.mul %pow, %2 : tensor<4x200xf32>, f64 -> tensor<4x200xf32>
  %add = ad.add %g, %mul_1 : tensor<4x200xf32>, tensor<4x200xf32> -> tensor<4x200xf32>
  %3 = ad.constant 0.79788456080286541 : f64
  %mul_2 = ad.mul %add, %3 : tensor<4x200xf32>, f64 -> tensor<4x200xf32>
  %tanh = ad.tanh %mul_2 : tensor<4x200xf32> -> tensor<4x200xf32>
  %4 = ad.constant 1.000000e+00 : f64
  %add_1 = ad.add %tanh, %4 : tensor<4x200xf32>, f64 -> tensor<4x200xf32>
  %mul_3 = ad.mul %mul, %add_1 : tensor<4x200xf32>, tensor<4x200xf32> -> tensor<4x200xf32>
  %y = ad.mul %mul_3, %u : tensor<4x200xf32>, tensor<4x200xf32> -> tensor<4x200xf32>
  func.return %y : tensor<4x200xf32>
}

// -----

// Left as they are: a GELU read elsewhere too, a product that promotes (bf16 gate, f32 up),
// the tanh formula spelled out in bf16 (eager rounds each step; fuse-elementwise's kernel
// rounds where eager does), and a formula with another constant (0.0447 for 0.044715; a
// constant written with fewer digits that rounds to the same f32 would match).
// CHECK-LABEL: func.func @not_fused
// CHECK-NOT:     ad.gelu_and_mul
// CHECK:         %g = ad.gelu %a approximate "tanh"
// CHECK-NEXT:    %y = ad.mul %g, %u
// CHECK-NEXT:    %h = ad.gelu %b
// CHECK-NEXT:    %y2 = ad.mul %h, %u
// CHECK:         %tanh = ad.tanh %mul_2 : tensor<4x8xbf16>
// CHECK:         %y3 = ad.mul %mul_3, %b
// CHECK:         %y4 = ad.mul %fmul_3, %u
// CHECK-NEXT:    func.return
func.func @not_fused(%a: tensor<4x8xf32>, %u: tensor<4x8xf32>, %b: tensor<4x8xbf16>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xbf16>, tensor<4x8xf32>) {
  %g = ad.gelu %a approximate "tanh" : tensor<4x8xf32> -> tensor<4x8xf32>
  %y = ad.mul %g, %u : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  %h = ad.gelu %b : tensor<4x8xbf16> -> tensor<4x8xbf16>
  %y2 = ad.mul %h, %u : tensor<4x8xbf16>, tensor<4x8xf32> -> tensor<4x8xf32>
  %0 = ad.constant 5.000000e-01 : f64
  %mul = ad.mul %b, %0 : tensor<4x8xbf16>, f64 -> tensor<4x8xbf16>
  %1 = ad.constant 3.000000e+00 : f64
  %pow = ad.pow %b, %1 : tensor<4x8xbf16>, f64 -> tensor<4x8xbf16>
  %2 = ad.constant 4.471500e-02 : f64
  %mul_1 = ad.mul %pow, %2 : tensor<4x8xbf16>, f64 -> tensor<4x8xbf16>
  %add = ad.add %b, %mul_1 : tensor<4x8xbf16>, tensor<4x8xbf16> -> tensor<4x8xbf16>
  %3 = ad.constant 0.79788456080286541 : f64
  %mul_2 = ad.mul %add, %3 : tensor<4x8xbf16>, f64 -> tensor<4x8xbf16>
  %tanh = ad.tanh %mul_2 : tensor<4x8xbf16> -> tensor<4x8xbf16>
  %4 = ad.constant 1.000000e+00 : f64
  %add_1 = ad.add %tanh, %4 : tensor<4x8xbf16>, f64 -> tensor<4x8xbf16>
  %mul_3 = ad.mul %mul, %add_1 : tensor<4x8xbf16>, tensor<4x8xbf16> -> tensor<4x8xbf16>
  %y3 = ad.mul %mul_3, %b : tensor<4x8xbf16>, tensor<4x8xbf16> -> tensor<4x8xbf16>
  %fmul = ad.mul %a, %0 : tensor<4x8xf32>, f64 -> tensor<4x8xf32>
  %fpow = ad.pow %a, %1 : tensor<4x8xf32>, f64 -> tensor<4x8xf32>
  %5 = ad.constant 4.470000e-02 : f64
  %fmul_1 = ad.mul %fpow, %5 : tensor<4x8xf32>, f64 -> tensor<4x8xf32>
  %fadd = ad.add %a, %fmul_1 : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  %fmul_2 = ad.mul %fadd, %3 : tensor<4x8xf32>, f64 -> tensor<4x8xf32>
  %ftanh = ad.tanh %fmul_2 : tensor<4x8xf32> -> tensor<4x8xf32>
  %fadd_1 = ad.add %ftanh, %4 : tensor<4x8xf32>, f64 -> tensor<4x8xf32>
  %fmul_3 = ad.mul %fmul, %fadd_1 : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  %y4 = ad.mul %fmul_3, %u : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  func.return %y, %g, %y2, %y3, %y4 : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xbf16>, tensor<4x8xf32>
}
