// fuse-rmsnorm-quant: an FP8 quantization joins the norm / SiLU-mul kernel that produces its
// input, as one ad.fused region.
// RUN: ad-opt %s --split-input-file -p fuse-rmsnorm-quant | filecheck %s
// RUN: ad-opt %s --split-input-file -p fuse-rmsnorm-quant -t triton | filecheck %s --check-prefix=KERNEL

// add + RMSNorm + per-token quantization: the region writes the residual sum (the next
// residual reads it), the fp8 values and the scales; the bf16 normed value is not written.
// CHECK-LABEL: func.func @add_norm_dynamic
// CHECK-NEXT:    %[[H:.*]], %[[Q:.*]], %[[S:.*]] = ad.fused(%x, %r, %w) : (tensor<4x64xbf16>, tensor<4x64xbf16>, tensor<64xbf16>) -> (tensor<4x64xbf16>, tensor<4x64xf8E4M3FN>, tensor<4x1xf32>) {
// CHECK-NEXT:    ^{{.*}}(%[[X:.*]]: tensor<4x64xbf16>, %[[R:.*]]: tensor<4x64xbf16>, %[[W:.*]]: tensor<64xbf16>):
// CHECK-NEXT:      %[[N:.*]], %[[SUM:.*]] = ad.add_rms_norm %[[X]], %[[R]] weight %[[W]] eps 1.000000e-06
// CHECK-NEXT:      %[[FQ:.*]], %[[FS:.*]] = ad.quantize_fp8_dynamic %[[N]] per_token
// CHECK-NEXT:      ad.yield %[[SUM]], %[[FQ]], %[[FS]]
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[Q]], %[[S]], %[[H]]
// KERNEL-LABEL: kernel 1 of 1: add_rms_norm_quantize_fp8_dynamic_
// KERNEL:       tl.store(out1 + {{.*}}.to(tl.float8e4nv), mask=mask)
// KERNEL:       tl.store(out2 + {{.*}}, mask=row_mask)
func.func @add_norm_dynamic(%x: tensor<4x64xbf16>, %r: tensor<4x64xbf16>, %w: tensor<64xbf16>) -> (tensor<4x64xf8E4M3FN>, tensor<4x1xf32>, tensor<4x64xbf16>) {
  %n, %h = ad.add_rms_norm %x, %r weight %w eps 1.0e-06 : (tensor<4x64xbf16>, tensor<4x64xbf16>, tensor<64xbf16>) -> (tensor<4x64xbf16>, tensor<4x64xbf16>)
  %q, %s = ad.quantize_fp8_dynamic %n per_token : tensor<4x64xbf16> -> (tensor<4x64xf8E4M3FN>, tensor<4x1xf32>)
  func.return %q, %s, %h : tensor<4x64xf8E4M3FN>, tensor<4x1xf32>, tensor<4x64xbf16>
}

// -----

// SiLU-mul + static quantization (the scale is a kernel input); the bf16 product is also
// returned, so the region writes it too.
// CHECK-LABEL: func.func @silu_static
// CHECK-NEXT:    %[[M:.*]], %[[Q:.*]] = ad.fused(%g, %u, %s) : (tensor<4x128xbf16>, tensor<4x128xbf16>, tensor<f32>) -> (tensor<4x128xbf16>, tensor<4x128xf8E4M3FN>) {
// CHECK:           ad.silu_and_mul
// CHECK-NEXT:      ad.quantize_fp8
// CHECK:         func.return %[[Q]], %[[M]]
func.func @silu_static(%g: tensor<4x128xbf16>, %u: tensor<4x128xbf16>, %s: tensor<f32>) -> (tensor<4x128xf8E4M3FN>, tensor<4x128xbf16>) {
  %m = ad.silu_and_mul %g, %u : (tensor<4x128xbf16>, tensor<4x128xbf16>) -> tensor<4x128xbf16>
  %q = ad.quantize_fp8 %m, %s : (tensor<4x128xbf16>, tensor<f32>) -> tensor<4x128xf8E4M3FN>
  func.return %q, %m : tensor<4x128xf8E4M3FN>, tensor<4x128xbf16>
}

// -----

// The MLP activation ops: GELU-mul + per-token quantization, and a plain MLP's bias + GELU +
// static quantization (the down projection's FP8 input), each one kernel.
// CHECK-LABEL: func.func @mlp_activations
// CHECK-NEXT:    %[[Q:.*]], %[[S:.*]] = ad.fused(%g, %u) : (tensor<4x128xbf16>, tensor<4x128xbf16>) -> (tensor<4x128xf8E4M3FN>, tensor<4x1xf32>) {
// CHECK:           ad.gelu_and_mul {{.*}} approximate "tanh"
// CHECK-NEXT:      ad.quantize_fp8_dynamic {{.*}} per_token
// CHECK:         %[[Q2:.*]] = ad.fused(%h, %b, %s) : (tensor<4x128xbf16>, tensor<128xbf16>, tensor<f32>) -> tensor<4x128xf8E4M3FN> {
// CHECK:           ad.activation "gelu"
// CHECK-NEXT:      ad.quantize_fp8
// CHECK:         func.return %[[Q]], %[[S]], %[[Q2]]
func.func @mlp_activations(%g: tensor<4x128xbf16>, %u: tensor<4x128xbf16>, %h: tensor<4x128xbf16>, %b: tensor<128xbf16>, %s: tensor<f32>) -> (tensor<4x128xf8E4M3FN>, tensor<4x1xf32>, tensor<4x128xf8E4M3FN>) {
  %m = ad.gelu_and_mul %g, %u approximate "tanh" : (tensor<4x128xbf16>, tensor<4x128xbf16>) -> tensor<4x128xbf16>
  %q, %qs = ad.quantize_fp8_dynamic %m per_token : tensor<4x128xbf16> -> (tensor<4x128xf8E4M3FN>, tensor<4x1xf32>)
  %a = ad.activation "gelu" %h bias %b : (tensor<4x128xbf16>, tensor<128xbf16>) -> tensor<4x128xbf16>
  %q2 = ad.quantize_fp8 %a, %s : (tensor<4x128xbf16>, tensor<f32>) -> tensor<4x128xf8E4M3FN>
  func.return %q, %qs, %q2 : tensor<4x128xf8E4M3FN>, tensor<4x1xf32>, tensor<4x128xf8E4M3FN>
}

// -----

// Not fused: a per-tensor dynamic quantization (its amax spans every row), and a quantization
// of an add_rms_norm's sum rather than its normed value.
// CHECK-LABEL: func.func @not_fused
// CHECK-NOT:     ad.fused
func.func @not_fused(%x: tensor<4x64xbf16>, %r: tensor<4x64xbf16>) -> (tensor<4x64xf8E4M3FN>, tensor<f32>, tensor<4x64xf8E4M3FN>, tensor<4x1xf32>) {
  %n = ad.rms_norm %x eps 1.0e-06 : (tensor<4x64xbf16>) -> tensor<4x64xbf16>
  %q, %s = ad.quantize_fp8_dynamic %n : tensor<4x64xbf16> -> (tensor<4x64xf8E4M3FN>, tensor<f32>)
  %n2, %h = ad.add_rms_norm %x, %r eps 1.0e-06 : (tensor<4x64xbf16>, tensor<4x64xbf16>) -> (tensor<4x64xbf16>, tensor<4x64xbf16>)
  %q2, %s2 = ad.quantize_fp8_dynamic %h per_token : tensor<4x64xbf16> -> (tensor<4x64xf8E4M3FN>, tensor<4x1xf32>)
  func.return %q, %s, %q2, %s2 : tensor<4x64xf8E4M3FN>, tensor<f32>, tensor<4x64xf8E4M3FN>, tensor<4x1xf32>
}

// -----

// add + LayerNorm + per-token quantization: as for RMSNorm, the region writes the residual sum,
// the fp8 values and the scales.
// CHECK-LABEL: func.func @add_layer_norm_dynamic
// CHECK-NEXT:    %[[H:.*]], %[[Q:.*]], %[[S:.*]] = ad.fused(%x, %r, %w, %b) : (tensor<4x96xbf16>, tensor<4x96xbf16>, tensor<96xbf16>, tensor<96xbf16>) -> (tensor<4x96xbf16>, tensor<4x96xf8E4M3FN>, tensor<4x1xf32>) {
// CHECK-NEXT:    ^{{.*}}(%[[X:.*]]: tensor<4x96xbf16>, %[[R:.*]]: tensor<4x96xbf16>, %[[W:.*]]: tensor<96xbf16>, %[[B:.*]]: tensor<96xbf16>):
// CHECK-NEXT:      %[[N:.*]], %[[SUM:.*]] = ad.add_layer_norm %[[X]], %[[R]] weight %[[W]] bias %[[B]] eps 1.000000e-05
// CHECK-NEXT:      %[[FQ:.*]], %[[FS:.*]] = ad.quantize_fp8_dynamic %[[N]] per_token
// CHECK-NEXT:      ad.yield %[[SUM]], %[[FQ]], %[[FS]]
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[Q]], %[[S]], %[[H]]
// KERNEL-LABEL: kernel 1 of 1: add_layer_norm_quantize_fp8_dynamic_
// KERNEL:       tl.store(out1 + {{.*}}.to(tl.float8e4nv), mask=mask)
func.func @add_layer_norm_dynamic(%x: tensor<4x96xbf16>, %r: tensor<4x96xbf16>, %w: tensor<96xbf16>, %b: tensor<96xbf16>) -> (tensor<4x96xf8E4M3FN>, tensor<4x1xf32>, tensor<4x96xbf16>) {
  %n, %h = ad.add_layer_norm %x, %r weight %w bias %b eps 1.0e-05 : (tensor<4x96xbf16>, tensor<4x96xbf16> weight tensor<96xbf16> bias tensor<96xbf16>) -> (tensor<4x96xbf16>, tensor<4x96xbf16>)
  %q, %s = ad.quantize_fp8_dynamic %n per_token : tensor<4x96xbf16> -> (tensor<4x96xf8E4M3FN>, tensor<4x1xf32>)
  func.return %q, %s, %h : tensor<4x96xf8E4M3FN>, tensor<4x1xf32>, tensor<4x96xbf16>
}

// -----

// A parallel block's norm: the quantized attention projections and an unquantized MLP read it.
// The region writes the fp8 values and the bf16 normed value the MLP reads.
// CHECK-LABEL: func.func @layer_norm_static_two_users
// CHECK-NEXT:    %[[N:.*]], %[[Q:.*]] = ad.fused(%x, %w, %s) : (tensor<4x96xbf16>, tensor<96xbf16>, tensor<f32>) -> (tensor<4x96xbf16>, tensor<4x96xf8E4M3FN>) {
// CHECK:           ad.layer_norm
// CHECK-NEXT:      ad.quantize_fp8
// CHECK:         %[[E:.*]] = ad.exp %[[N]]
// CHECK-NEXT:    func.return %[[Q]], %[[E]]
// CHECK-NOT:     ad.layer_norm
func.func @layer_norm_static_two_users(%x: tensor<4x96xbf16>, %w: tensor<96xbf16>, %s: tensor<f32>) -> (tensor<4x96xf8E4M3FN>, tensor<4x96xbf16>) {
  %n = ad.layer_norm %x weight %w eps 1.0e-05 : (tensor<4x96xbf16> weight tensor<96xbf16>) -> tensor<4x96xbf16>
  %q = ad.quantize_fp8 %n, %s : (tensor<4x96xbf16>, tensor<f32>) -> tensor<4x96xf8E4M3FN>
  %e = ad.exp %n : tensor<4x96xbf16> -> tensor<4x96xbf16>
  func.return %q, %e : tensor<4x96xf8E4M3FN>, tensor<4x96xbf16>
}

// -----

// OPT: the norm's output is viewed as [tokens, hidden] before it is quantized. The per-token
// quantization moves before the view (it commutes with regrouping rows) and joins the norm's
// kernel; the fp8 values and the scales are viewed instead.
// CHECK-LABEL: func.func @quantized_rows_view
// CHECK-NEXT:    %[[Q:.*]], %[[S:.*]] = ad.fused(%x, %w) : (tensor<1x?x96xbf16>, tensor<96xbf16>) -> (tensor<1x?x96xf8E4M3FN>, tensor<1x?x1xf32>) {
// CHECK:           ad.layer_norm
// CHECK-NEXT:      ad.quantize_fp8_dynamic
// CHECK:         %[[QV:.*]] = ad.reshape %[[Q]] [-1, 96] : tensor<1x?x96xf8E4M3FN> -> tensor<?x96xf8E4M3FN>
// CHECK-NEXT:    %[[SV:.*]] = ad.reshape %[[S]] [-1, 1] : tensor<1x?x1xf32> -> tensor<?x1xf32>
// CHECK-NEXT:    func.return %[[QV]], %[[SV]]
func.func @quantized_rows_view(%x: tensor<1x?x96xbf16>, %w: tensor<96xbf16>) -> (tensor<?x96xf8E4M3FN>, tensor<?x1xf32>) {
  %n = ad.layer_norm %x weight %w eps 1.0e-05 : (tensor<1x?x96xbf16> weight tensor<96xbf16>) -> tensor<1x?x96xbf16>
  %v = ad.reshape %n [-1, 96] : tensor<1x?x96xbf16> -> tensor<?x96xbf16>
  %q, %s = ad.quantize_fp8_dynamic %v per_token : tensor<?x96xbf16> -> (tensor<?x96xf8E4M3FN>, tensor<?x1xf32>)
  func.return %q, %s : tensor<?x96xf8E4M3FN>, tensor<?x1xf32>
}
