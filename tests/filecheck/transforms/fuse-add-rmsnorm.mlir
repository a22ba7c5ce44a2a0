// fuse-add-rmsnorm: a residual add feeding an RMSNorm becomes one op with both results; the
// sum's other users read the second result.
// RUN: ad-opt %s --split-input-file -p fuse-add-rmsnorm | filecheck %s

// The sum is also the next residual (returned here) and is used before the norm: the new op
// takes the add's place, so every user still follows its definition.
// CHECK-LABEL: func.func @residual
// CHECK-NEXT:    %[[N:.*]], %[[H:.*]] = ad.add_rms_norm %x, %res weight %w eps 1.000000e-06 : (tensor<2x?x64xbf16>, tensor<2x?x64xbf16>, tensor<64xbf16>) -> (tensor<2x?x64xbf16>, tensor<2x?x64xbf16>)
// CHECK-NEXT:    %[[E:.*]] = ad.exp %[[H]]
// CHECK-NEXT:    func.return %[[N]], %[[H]], %[[E]]
func.func @residual(%x: tensor<2x?x64xbf16>, %res: tensor<2x?x64xbf16>, %w: tensor<64xbf16>) -> (tensor<2x?x64xbf16>, tensor<2x?x64xbf16>, tensor<2x?x64xbf16>) {
  %h = ad.add %x, %res : tensor<2x?x64xbf16>, tensor<2x?x64xbf16> -> tensor<2x?x64xbf16>
  %e = ad.exp %h : tensor<2x?x64xbf16> -> tensor<2x?x64xbf16>
  %n = ad.rms_norm %h weight %w eps 1.0e-06 : (tensor<2x?x64xbf16>, tensor<64xbf16>) -> tensor<2x?x64xbf16>
  func.return %n, %h, %e : tensor<2x?x64xbf16>, tensor<2x?x64xbf16>, tensor<2x?x64xbf16>
}

// -----

// The norm's attributes carry over (Gemma's fp32 weight with offset).
// CHECK-LABEL: func.func @gemma_attributes
// CHECK-NEXT:    %[[N:.*]], %{{.*}} = ad.add_rms_norm %x, %res weight %w eps 1.000000e-06 offset 1.000000e+00 weight_in_fp32
// CHECK-NEXT:    func.return %[[N]]
func.func @gemma_attributes(%x: tensor<3x64xbf16>, %res: tensor<3x64xbf16>, %w: tensor<64xbf16>) -> tensor<3x64xbf16> {
  %h = ad.add %x, %res : tensor<3x64xbf16>, tensor<3x64xbf16> -> tensor<3x64xbf16>
  %n = ad.rms_norm %h weight %w eps 1.0e-06 offset 1.0 weight_in_fp32 : (tensor<3x64xbf16>, tensor<64xbf16>) -> tensor<3x64xbf16>
  func.return %n : tensor<3x64xbf16>
}

// -----

// Not a residual add: one operand broadcasts (a bias), or alpha scales it. Both stay.
// CHECK-LABEL: func.func @not_residual
// CHECK-NEXT:    %[[H:.*]] = ad.add %x, %b
// CHECK-NEXT:    %[[N:.*]] = ad.rms_norm %[[H]]
// CHECK-NEXT:    %[[H2:.*]] = ad.add %x, %x alpha 2
// CHECK-NEXT:    %[[N2:.*]] = ad.rms_norm %[[H2]]
// CHECK-NEXT:    func.return %[[N]], %[[N2]]
func.func @not_residual(%x: tensor<3x64xf32>, %b: tensor<64xf32>) -> (tensor<3x64xf32>, tensor<3x64xf32>) {
  %h = ad.add %x, %b : tensor<3x64xf32>, tensor<64xf32> -> tensor<3x64xf32>
  %n = ad.rms_norm %h eps 1.0e-06 : (tensor<3x64xf32>) -> tensor<3x64xf32>
  %h2 = ad.add %x, %x alpha 2 : i64 : tensor<3x64xf32>, tensor<3x64xf32> -> tensor<3x64xf32>
  %n2 = ad.rms_norm %h2 eps 1.0e-06 : (tensor<3x64xf32>) -> tensor<3x64xf32>
  func.return %n, %n2 : tensor<3x64xf32>, tensor<3x64xf32>
}
