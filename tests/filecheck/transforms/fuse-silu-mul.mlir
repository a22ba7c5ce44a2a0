// fuse-silu-mul: HF's gated MLP activation silu(gate) * up becomes ad.silu_and_mul.
// RUN: ad-opt %s --split-input-file -p fuse-silu-mul | filecheck %s

// Either operand order; gate and up may be last-dim slices of one fused gate/up GEMM output
// (the kernel reads them through their strides). The CHECK-NEXT chain pins every line of the
// function, so no ad.silu or ad.mul is left.
// CHECK-LABEL: func.func @gated
// CHECK-NEXT:    %[[A:.*]] = ad.silu_and_mul %g, %u : (tensor<2x?x128xbf16>, tensor<2x?x128xbf16>) -> tensor<2x?x128xbf16>
// CHECK-NEXT:    %[[G:.*]] = ad.slice %gu dim 2 [0, 128, 1]
// CHECK-NEXT:    %[[U:.*]] = ad.slice %gu dim 2 [128, 256, 1]
// CHECK-NEXT:    %[[B:.*]] = ad.silu_and_mul %[[G]], %[[U]]
// CHECK-NEXT:    func.return %[[A]], %[[B]]
func.func @gated(%g: tensor<2x?x128xbf16>, %u: tensor<2x?x128xbf16>, %gu: tensor<2x?x256xbf16>) -> (tensor<2x?x128xbf16>, tensor<2x?x128xbf16>) {
  %s = ad.silu %g : tensor<2x?x128xbf16> -> tensor<2x?x128xbf16>
  %y = ad.mul %s, %u : tensor<2x?x128xbf16>, tensor<2x?x128xbf16> -> tensor<2x?x128xbf16>
  %gate = ad.slice %gu dim 2 [0, 128, 1] : tensor<2x?x256xbf16> -> tensor<2x?x128xbf16>
  %up = ad.slice %gu dim 2 [128, 256, 1] : tensor<2x?x256xbf16> -> tensor<2x?x128xbf16>
  %s2 = ad.silu %gate : tensor<2x?x128xbf16> -> tensor<2x?x128xbf16>
  %y2 = ad.mul %up, %s2 : tensor<2x?x128xbf16>, tensor<2x?x128xbf16> -> tensor<2x?x128xbf16>
  func.return %y, %y2 : tensor<2x?x128xbf16>, tensor<2x?x128xbf16>
}

// -----

// The silu is used elsewhere too, or the product promotes (bf16 gate, f32 up): both stay.
// CHECK-LABEL: func.func @not_fused
// CHECK-NEXT:    %[[S:.*]] = ad.silu %g
// CHECK-NEXT:    %[[Y:.*]] = ad.mul %[[S]], %u
// CHECK-NEXT:    %[[S2:.*]] = ad.silu %h
// CHECK-NEXT:    %[[Y2:.*]] = ad.mul %[[S2]], %u
// CHECK-NEXT:    func.return %[[Y]], %[[S]], %[[Y2]]
func.func @not_fused(%g: tensor<4x8xf32>, %u: tensor<4x8xf32>, %h: tensor<4x8xbf16>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) {
  %s = ad.silu %g : tensor<4x8xf32> -> tensor<4x8xf32>
  %y = ad.mul %s, %u : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  %s2 = ad.silu %h : tensor<4x8xbf16> -> tensor<4x8xbf16>
  %y2 = ad.mul %s2, %u : tensor<4x8xbf16>, tensor<4x8xf32> -> tensor<4x8xf32>
  func.return %y, %s, %y2 : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>
}

// -----

// The core-ATen spelling of a bf16 silu: cast to f32, x * sigmoid(x), cast back.
// CHECK-LABEL: func.func @core_aten_silu
// CHECK-NEXT:    %[[A:.*]] = ad.silu_and_mul %g, %u : (tensor<4x8xbf16>, tensor<4x8xbf16>) -> tensor<4x8xbf16>
// CHECK-NEXT:    func.return %[[A]]
func.func @core_aten_silu(%g: tensor<4x8xbf16>, %u: tensor<4x8xbf16>) -> tensor<4x8xbf16> {
  %gf = ad.cast %g : tensor<4x8xbf16> -> tensor<4x8xf32>
  %s = ad.sigmoid %gf : tensor<4x8xf32> -> tensor<4x8xf32>
  %m = ad.mul %gf, %s : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  %mb = ad.cast %m : tensor<4x8xf32> -> tensor<4x8xbf16>
  %y = ad.mul %mb, %u : tensor<4x8xbf16>, tensor<4x8xbf16> -> tensor<4x8xbf16>
  func.return %y : tensor<4x8xbf16>
}
