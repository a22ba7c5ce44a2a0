// quantize-linear-fp8: selected linears become FP8 linears; the weight is quantized per tensor
// (on a weight alone: computed once at compile time), the activation once per input value.
// RUN: ad-opt %s --split-input-file -p quantize-linear-fp8 | filecheck %s
// RUN: ad-opt %s --split-input-file -p 'quantize-linear-fp8{scheme=static activation-scale=0.05}' | filecheck %s --check-prefix=STATIC
// RUN: ad-opt %s --split-input-file -p 'quantize-linear-fp8{targets=k_proj}' | filecheck %s --check-prefix=ONLYK

// CHECK-LABEL: func.func @two_linears
// CHECK-NEXT:    %[[WQ:.*]], %[[WS:.*]] = ad.quantize_fp8_dynamic %wq : tensor<64x64xbf16> -> (tensor<64x64xf8E4M3FN>, tensor<f32>)
// CHECK-NEXT:    %[[X:.*]], %[[XS:.*]] = ad.quantize_fp8_dynamic %x per_token : tensor<1x?x64xbf16> -> (tensor<1x?x64xf8E4M3FN>, tensor<1x?x1xf32>)
// CHECK-NEXT:    %[[Q:.*]] = ad.linear_fp8 %[[X]], %[[WQ]], %[[XS]], %[[WS]] : {{.*}} -> tensor<1x?x64xbf16>
// CHECK-NEXT:    %[[WK:.*]], %[[WKS:.*]] = ad.quantize_fp8_dynamic %wk
// CHECK-NEXT:    %[[K:.*]] = ad.linear_fp8 %[[X]], %[[WK]], %[[XS]], %[[WKS]] bias %bk
// CHECK-NEXT:    %{{.*}} = ad.linear %[[Q]], %wlm
// CHECK-NOT:     ad.quantize
// STATIC-LABEL: func.func @two_linears
// STATIC-NEXT:    %[[C:.*]] = ad.constant 5.000000e-02 : f64
// STATIC-NEXT:    %[[S:.*]] = ad.full [], %[[C]] : f64 -> tensor<f32>
// STATIC-NEXT:    %[[WQ:.*]], %[[WS:.*]] = ad.quantize_fp8_dynamic %wq
// STATIC-NEXT:    %[[X:.*]] = ad.quantize_fp8 %x, %[[S]] : (tensor<1x?x64xbf16>, tensor<f32>) -> tensor<1x?x64xf8E4M3FN>
// STATIC-NEXT:    ad.linear_fp8 %[[X]], %[[WQ]], %[[S]], %[[WS]]
// ONLYK-LABEL: func.func @two_linears
// ONLYK-NEXT:    ad.linear %x, %wq
// ONLYK-NEXT:    ad.quantize_fp8_dynamic %wk
// ONLYK-NEXT:    ad.quantize_fp8_dynamic %x per_token
// ONLYK-NEXT:    ad.linear_fp8
func.func @two_linears(%wq: tensor<64x64xbf16> {ad.param = "q.weight"}, %wk: tensor<32x64xbf16> {ad.param = "k.weight"}, %bk: tensor<32xbf16> {ad.param = "k.bias"}, %wlm: tensor<8x64xbf16> {ad.param = "lm_head.weight"}, %x: tensor<1x?x64xbf16> {ad.input = "x"}) -> (tensor<1x?x8xbf16>, tensor<1x?x32xbf16>) {
  %q = ad.linear %x, %wq : (tensor<1x?x64xbf16>, tensor<64x64xbf16>) -> tensor<1x?x64xbf16> loc("model.layers.0.self_attn.q_proj")
  %k = ad.linear %x, %wk bias %bk : (tensor<1x?x64xbf16>, tensor<32x64xbf16>, tensor<32xbf16>) -> tensor<1x?x32xbf16> loc("model.layers.0.self_attn.k_proj")
  %lm = ad.linear %q, %wlm : (tensor<1x?x64xbf16>, tensor<8x64xbf16>) -> tensor<1x?x8xbf16> loc("lm_head")
  func.return %lm, %k : tensor<1x?x8xbf16>, tensor<1x?x32xbf16>
}
