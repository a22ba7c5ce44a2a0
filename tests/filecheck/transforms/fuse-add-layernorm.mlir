// fuse-add-layernorm: a residual add feeding a LayerNorm becomes one op with both results; the
// sum's other users read the second result.
// RUN: ad-opt %s --split-input-file -p fuse-add-layernorm | filecheck %s

// GPT-2's second norm: the sum is also the next residual (used before the norm, and returned);
// the weight and bias carry over, and the new op takes the add's place.
// CHECK-LABEL: func.func @residual
// CHECK-NEXT:    %[[N:.*]], %[[H:.*]] = ad.add_layer_norm %x, %res weight %w bias %b eps 1.000000e-05 : (tensor<2x?x64xbf16>, tensor<2x?x64xbf16> weight tensor<64xbf16> bias tensor<64xbf16>) -> (tensor<2x?x64xbf16>, tensor<2x?x64xbf16>)
// CHECK-NEXT:    %[[E:.*]] = ad.exp %[[H]]
// CHECK-NEXT:    func.return %[[N]], %[[H]], %[[E]]
// CHECK-NOT:     ad.layer_norm
func.func @residual(%x: tensor<2x?x64xbf16>, %res: tensor<2x?x64xbf16>, %w: tensor<64xbf16>, %b: tensor<64xbf16>) -> (tensor<2x?x64xbf16>, tensor<2x?x64xbf16>, tensor<2x?x64xbf16>) {
  %h = ad.add %x, %res : tensor<2x?x64xbf16>, tensor<2x?x64xbf16> -> tensor<2x?x64xbf16>
  %e = ad.exp %h : tensor<2x?x64xbf16> -> tensor<2x?x64xbf16>
  %n = ad.layer_norm %h weight %w bias %b eps 1.0e-05 : (tensor<2x?x64xbf16> weight tensor<64xbf16> bias tensor<64xbf16>) -> tensor<2x?x64xbf16>
  func.return %n, %h, %e : tensor<2x?x64xbf16>, tensor<2x?x64xbf16>, tensor<2x?x64xbf16>
}

// -----

// GPT-NeoX's parallel residual: one sum feeds both norms of the next layer. The first norm
// takes the add; the second reads the fused op's sum.
// CHECK-LABEL: func.func @parallel_norms
// CHECK-NEXT:    %[[N1:.*]], %[[H:.*]] = ad.add_layer_norm %x, %res weight %w1 bias %b eps 1.000000e-05
// CHECK-NEXT:    %[[N2:.*]] = ad.layer_norm %[[H]] weight %w2 bias %b eps 1.000000e-05
// CHECK-NEXT:    func.return %[[N1]], %[[N2]], %[[H]]
// CHECK-NOT:     ad.add
func.func @parallel_norms(%x: tensor<3x64xf32>, %res: tensor<3x64xf32>, %w1: tensor<64xf32>, %w2: tensor<64xf32>, %b: tensor<64xf32>) -> (tensor<3x64xf32>, tensor<3x64xf32>, tensor<3x64xf32>) {
  %h = ad.add %x, %res : tensor<3x64xf32>, tensor<3x64xf32> -> tensor<3x64xf32>
  %n1 = ad.layer_norm %h weight %w1 bias %b eps 1.0e-05 : (tensor<3x64xf32> weight tensor<64xf32> bias tensor<64xf32>) -> tensor<3x64xf32>
  %n2 = ad.layer_norm %h weight %w2 bias %b eps 1.0e-05 : (tensor<3x64xf32> weight tensor<64xf32> bias tensor<64xf32>) -> tensor<3x64xf32>
  func.return %n1, %n2, %h : tensor<3x64xf32>, tensor<3x64xf32>, tensor<3x64xf32>
}

// -----

// Nemotron's LayerNorm1P: the weight `w + 1` is computed after the add. No other user of the
// sum comes before the norm, so the new op takes the norm's place.
// CHECK-LABEL: func.func @weight_after_add
// CHECK-NEXT:    %{{.*}} = ad.constant 1.000000e+00 : f64
// CHECK-NEXT:    %[[W:.*]] = ad.add %w, %{{.*}} : tensor<64xf32>, f64 -> tensor<64xf32>
// CHECK-NEXT:    %[[N:.*]], %[[H:.*]] = ad.add_layer_norm %x, %res weight %[[W]] eps 1.000000e-05
// CHECK-NEXT:    func.return %[[N]], %[[H]]
func.func @weight_after_add(%x: tensor<3x64xf32>, %res: tensor<3x64xf32>, %w: tensor<64xf32>) -> (tensor<3x64xf32>, tensor<3x64xf32>) {
  %h = ad.add %x, %res : tensor<3x64xf32>, tensor<3x64xf32> -> tensor<3x64xf32>
  %one = ad.constant 1.0 : f64
  %w1 = ad.add %w, %one : tensor<64xf32>, f64 -> tensor<64xf32>
  %n = ad.layer_norm %h weight %w1 eps 1.0e-05 : (tensor<3x64xf32> weight tensor<64xf32>) -> tensor<3x64xf32>
  func.return %n, %h : tensor<3x64xf32>, tensor<3x64xf32>
}

// -----

// Not fused: a bias add (broadcast) and an add with alpha; and a weight computed after the add
// while the sum is read before the norm (neither place serves both).
// CHECK-LABEL: func.func @not_residual
// CHECK-NOT:     ad.add_layer_norm
// CHECK:         ad.add %x, %b
// CHECK-NEXT:    ad.layer_norm
// CHECK-NEXT:    ad.add %x, %x alpha 2
// CHECK-NEXT:    ad.layer_norm
// CHECK-NEXT:    %[[H:.*]] = ad.add %x, %x :
// CHECK-NEXT:    ad.exp %[[H]]
// CHECK-NEXT:    ad.constant
// CHECK-NEXT:    ad.add %b,
// CHECK-NEXT:    ad.layer_norm %[[H]]
func.func @not_residual(%x: tensor<3x64xf32>, %b: tensor<64xf32>) -> (tensor<3x64xf32>, tensor<3x64xf32>, tensor<3x64xf32>, tensor<3x64xf32>) {
  %h = ad.add %x, %b : tensor<3x64xf32>, tensor<64xf32> -> tensor<3x64xf32>
  %n = ad.layer_norm %h eps 1.0e-05 : (tensor<3x64xf32>) -> tensor<3x64xf32>
  %h2 = ad.add %x, %x alpha 2 : i64 : tensor<3x64xf32>, tensor<3x64xf32> -> tensor<3x64xf32>
  %n2 = ad.layer_norm %h2 eps 1.0e-05 : (tensor<3x64xf32>) -> tensor<3x64xf32>
  %h3 = ad.add %x, %x : tensor<3x64xf32>, tensor<3x64xf32> -> tensor<3x64xf32>
  %e = ad.exp %h3 : tensor<3x64xf32> -> tensor<3x64xf32>
  %one = ad.constant 1.0 : f64
  %w1 = ad.add %b, %one : tensor<64xf32>, f64 -> tensor<64xf32>
  %n3 = ad.layer_norm %h3 weight %w1 eps 1.0e-05 : (tensor<3x64xf32> weight tensor<64xf32>) -> tensor<3x64xf32>
  func.return %n, %n2, %n3, %e : tensor<3x64xf32>, tensor<3x64xf32>, tensor<3x64xf32>, tensor<3x64xf32>
}

// -----

// OPT: the sum is viewed as [tokens, hidden] before the norm (and read as the next residual in
// that view). The norm of the rows' view is the view of their norm: the fused op takes the add,
// and the view moves to its normalized result.
// CHECK-LABEL: func.func @rows_view
// CHECK-NEXT:    %[[N:.*]], %[[H:.*]] = ad.add_layer_norm %x, %res weight %w eps 1.000000e-05 : (tensor<1x?x64xf32>, tensor<1x?x64xf32> weight tensor<64xf32>) -> (tensor<1x?x64xf32>, tensor<1x?x64xf32>)
// CHECK-NEXT:    %[[V:.*]] = ad.reshape %[[H]] [-1, 64] : tensor<1x?x64xf32> -> tensor<?x64xf32>
// CHECK-NEXT:    %[[NV:.*]] = ad.reshape %[[N]] [-1, 64] : tensor<1x?x64xf32> -> tensor<?x64xf32>
// CHECK-NEXT:    func.return %[[NV]], %[[V]]
func.func @rows_view(%x: tensor<1x?x64xf32>, %res: tensor<1x?x64xf32>, %w: tensor<64xf32>) -> (tensor<?x64xf32>, tensor<?x64xf32>) {
  %h = ad.add %x, %res : tensor<1x?x64xf32>, tensor<1x?x64xf32> -> tensor<1x?x64xf32>
  %v = ad.reshape %h [-1, 64] : tensor<1x?x64xf32> -> tensor<?x64xf32>
  %n = ad.layer_norm %v weight %w eps 1.0e-05 : (tensor<?x64xf32> weight tensor<64xf32>) -> tensor<?x64xf32>
  func.return %n, %v : tensor<?x64xf32>, tensor<?x64xf32>
}

// -----

// A view that splits the normalized dim is not a view of rows: the pair stays.
// CHECK-LABEL: func.func @columns_view
// CHECK-NEXT:    ad.add %x, %res
// CHECK-NEXT:    ad.reshape
// CHECK-NEXT:    ad.layer_norm
func.func @columns_view(%x: tensor<2x64xf32>, %res: tensor<2x64xf32>) -> tensor<4x32xf32> {
  %h = ad.add %x, %res : tensor<2x64xf32>, tensor<2x64xf32> -> tensor<2x64xf32>
  %v = ad.reshape %h [4, 32] : tensor<2x64xf32> -> tensor<4x32xf32>
  %n = ad.layer_norm %v eps 1.0e-05 : (tensor<4x32xf32>) -> tensor<4x32xf32>
  func.return %n : tensor<4x32xf32>
}
