// optimize-rope: a query's and a key's RoPE (sharing cos/sin) that feed no SDPA become one
// ad.rope, one kernel for both.
// RUN: ad-opt %s -p optimize-rope | filecheck %s
// RUN: ad-opt %s -p optimize-rope -t triton | filecheck %s --check-prefix=KERNEL

// CHECK-LABEL: func.func @q_and_k
// CHECK-NEXT:    %[[Q:.*]], %[[K:.*]] = ad.rope %q, %k rope %cos, %sin : (tensor<1x4x?x32xbf16>, tensor<1x2x?x32xbf16>, tensor<1x?x32xbf16>, tensor<1x?x32xbf16>) -> (tensor<1x4x?x32xbf16>, tensor<1x2x?x32xbf16>)
// CHECK-NEXT:    func.return %[[Q]], %[[K]]
// KERNEL-LABEL: kernel 1 of 1: rope_
// KERNEL:       partner = tl.where(dims < 16, dims + 16, dims - 16)
// KERNEL:       tl.store(q_out
// KERNEL:       tl.store(k_out
func.func @q_and_k(%q: tensor<1x4x?x32xbf16>, %k: tensor<1x2x?x32xbf16>, %cos: tensor<1x?x32xbf16>, %sin: tensor<1x?x32xbf16>) -> (tensor<1x4x?x32xbf16>, tensor<1x2x?x32xbf16>) {
  %cu = ad.unsqueeze %cos dim 1 : tensor<1x?x32xbf16> -> tensor<1x1x?x32xbf16>
  %su = ad.unsqueeze %sin dim 1 : tensor<1x?x32xbf16> -> tensor<1x1x?x32xbf16>
  %qc = ad.mul %q, %cu : tensor<1x4x?x32xbf16>, tensor<1x1x?x32xbf16> -> tensor<1x4x?x32xbf16>
  %q1 = ad.slice %q dim 3 [0, 16, 1] : tensor<1x4x?x32xbf16> -> tensor<1x4x?x16xbf16>
  %q2 = ad.slice %q dim 3 [16, 9223372036854775807, 1] : tensor<1x4x?x32xbf16> -> tensor<1x4x?x16xbf16>
  %qn = ad.neg %q2 : tensor<1x4x?x16xbf16> -> tensor<1x4x?x16xbf16>
  %qr = ad.cat %qn, %q1 dim -1 : (tensor<1x4x?x16xbf16>, tensor<1x4x?x16xbf16>) -> tensor<1x4x?x32xbf16>
  %qs = ad.mul %qr, %su : tensor<1x4x?x32xbf16>, tensor<1x1x?x32xbf16> -> tensor<1x4x?x32xbf16>
  %qe = ad.add %qc, %qs : tensor<1x4x?x32xbf16>, tensor<1x4x?x32xbf16> -> tensor<1x4x?x32xbf16>
  %kc = ad.mul %k, %cu : tensor<1x2x?x32xbf16>, tensor<1x1x?x32xbf16> -> tensor<1x2x?x32xbf16>
  %k1 = ad.slice %k dim 3 [0, 16, 1] : tensor<1x2x?x32xbf16> -> tensor<1x2x?x16xbf16>
  %k2 = ad.slice %k dim 3 [16, 9223372036854775807, 1] : tensor<1x2x?x32xbf16> -> tensor<1x2x?x16xbf16>
  %kn = ad.neg %k2 : tensor<1x2x?x16xbf16> -> tensor<1x2x?x16xbf16>
  %kr = ad.cat %kn, %k1 dim -1 : (tensor<1x2x?x16xbf16>, tensor<1x2x?x16xbf16>) -> tensor<1x2x?x32xbf16>
  %ks = ad.mul %kr, %su : tensor<1x2x?x32xbf16>, tensor<1x1x?x32xbf16> -> tensor<1x2x?x32xbf16>
  %ke = ad.add %kc, %ks : tensor<1x2x?x32xbf16>, tensor<1x2x?x32xbf16> -> tensor<1x2x?x32xbf16>
  func.return %qe, %ke : tensor<1x4x?x32xbf16>, tensor<1x2x?x32xbf16>
}
