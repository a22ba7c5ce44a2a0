// fuse-rope-attention: HF's apply_rotary_pos_emb on Q and K, repeat_kv on K and V, and SDPA
// become one ad.rope_attention on the un-rotated, un-repeated tensors.
// RUN: ad-opt %s --split-input-file -p fuse-rope-attention | filecheck %s
// RUN: ad-opt %s --split-input-file -p fuse-rope-attention -t triton | filecheck %s --check-prefix=KERNEL

// CHECK-LABEL: func.func @hf_attention
// CHECK-NEXT:    %[[O:.*]] = ad.rope_attention %q, %k, %v rope %cos, %sin mask %m scale 1.250000e-01 : (tensor<1x4x?x64xbf16>, tensor<1x2x?x64xbf16>, tensor<1x2x?x64xbf16>, tensor<1x?x64xbf16>, tensor<1x?x64xbf16>, tensor<1x1x?x?xi1>) -> tensor<1x4x?x64xbf16>
// CHECK-NEXT:    func.return %[[O]]
// KERNEL-LABEL: kernel 1 of 1: rope_attention_
// KERNEL:       from ad_mlir.codegen.attention_kernel import attention_blocks
// KERNEL:       def _load_pieces(
// KERNEL:       def rope_attention_{{[0-9a-f]+}}(
// KERNEL:       def launch(kernel, tensors, scalars):
func.func @hf_attention(%q: tensor<1x4x?x64xbf16>, %k: tensor<1x2x?x64xbf16>, %v: tensor<1x2x?x64xbf16>, %cos: tensor<1x?x64xbf16>, %sin: tensor<1x?x64xbf16>, %m: tensor<1x1x?x?xi1>, %s: index) -> tensor<1x4x?x64xbf16> {
  %cu = ad.unsqueeze %cos dim 1 : tensor<1x?x64xbf16> -> tensor<1x1x?x64xbf16>
  %su = ad.unsqueeze %sin dim 1 : tensor<1x?x64xbf16> -> tensor<1x1x?x64xbf16>
  %qc = ad.mul %q, %cu : tensor<1x4x?x64xbf16>, tensor<1x1x?x64xbf16> -> tensor<1x4x?x64xbf16>
  %q1 = ad.slice %q dim 3 [0, 32, 1] : tensor<1x4x?x64xbf16> -> tensor<1x4x?x32xbf16>
  %q2 = ad.slice %q dim 3 [32, 9223372036854775807, 1] : tensor<1x4x?x64xbf16> -> tensor<1x4x?x32xbf16>
  %qn = ad.neg %q2 : tensor<1x4x?x32xbf16> -> tensor<1x4x?x32xbf16>
  %qr = ad.cat %qn, %q1 dim -1 : (tensor<1x4x?x32xbf16>, tensor<1x4x?x32xbf16>) -> tensor<1x4x?x64xbf16>
  %qs = ad.mul %qr, %su : tensor<1x4x?x64xbf16>, tensor<1x1x?x64xbf16> -> tensor<1x4x?x64xbf16>
  %qe = ad.add %qc, %qs : tensor<1x4x?x64xbf16>, tensor<1x4x?x64xbf16> -> tensor<1x4x?x64xbf16>
  %kc = ad.mul %k, %cu : tensor<1x2x?x64xbf16>, tensor<1x1x?x64xbf16> -> tensor<1x2x?x64xbf16>
  %k1 = ad.slice %k dim 3 [0, 32, 1] : tensor<1x2x?x64xbf16> -> tensor<1x2x?x32xbf16>
  %k2 = ad.slice %k dim 3 [32, 9223372036854775807, 1] : tensor<1x2x?x64xbf16> -> tensor<1x2x?x32xbf16>
  %kn = ad.neg %k2 : tensor<1x2x?x32xbf16> -> tensor<1x2x?x32xbf16>
  %kr = ad.cat %kn, %k1 dim -1 : (tensor<1x2x?x32xbf16>, tensor<1x2x?x32xbf16>) -> tensor<1x2x?x64xbf16>
  %ks = ad.mul %kr, %su : tensor<1x2x?x64xbf16>, tensor<1x1x?x64xbf16> -> tensor<1x2x?x64xbf16>
  %ke = ad.add %kc, %ks : tensor<1x2x?x64xbf16>, tensor<1x2x?x64xbf16> -> tensor<1x2x?x64xbf16>
  %k5 = ad.unsqueeze %ke dim 2 : tensor<1x2x?x64xbf16> -> tensor<1x2x1x?x64xbf16>
  %kx = ad.expand %k5 [1, 2, 2, %s, 64] : tensor<1x2x1x?x64xbf16> -> tensor<1x2x2x?x64xbf16>
  %kk = ad.reshape %kx [1, 4, %s, 64] : tensor<1x2x2x?x64xbf16> -> tensor<1x4x?x64xbf16>
  %v5 = ad.unsqueeze %v dim 2 : tensor<1x2x?x64xbf16> -> tensor<1x2x1x?x64xbf16>
  %vx = ad.expand %v5 [1, 2, 2, %s, 64] : tensor<1x2x1x?x64xbf16> -> tensor<1x2x2x?x64xbf16>
  %vv = ad.reshape %vx [1, 4, %s, 64] : tensor<1x2x2x?x64xbf16> -> tensor<1x4x?x64xbf16>
  %o = ad.attention %qe, %kk, %vv mask %m scale 0.125 : f64 : (tensor<1x4x?x64xbf16>, tensor<1x4x?x64xbf16>, tensor<1x4x?x64xbf16>, tensor<1x1x?x?xi1>) -> tensor<1x4x?x64xbf16>
  func.return %o : tensor<1x4x?x64xbf16>
}

// -----

// Not fused: head_dim 16 is below what the attention template takes (its RoPE halves feed
// tl.dot, of depth >= 16), so the spelling stays.
// CHECK-LABEL: func.func @small_head_dim
// CHECK-NOT:     ad.rope_attention
// CHECK:         ad.attention
func.func @small_head_dim(%q: tensor<1x2x?x16xf32>, %cos: tensor<1x?x16xf32>, %sin: tensor<1x?x16xf32>) -> tensor<1x2x?x16xf32> {
  %cu = ad.unsqueeze %cos dim 1 : tensor<1x?x16xf32> -> tensor<1x1x?x16xf32>
  %su = ad.unsqueeze %sin dim 1 : tensor<1x?x16xf32> -> tensor<1x1x?x16xf32>
  %qc = ad.mul %q, %cu : tensor<1x2x?x16xf32>, tensor<1x1x?x16xf32> -> tensor<1x2x?x16xf32>
  %q1 = ad.slice %q dim 3 [0, 8, 1] : tensor<1x2x?x16xf32> -> tensor<1x2x?x8xf32>
  %q2 = ad.slice %q dim 3 [8, 16, 1] : tensor<1x2x?x16xf32> -> tensor<1x2x?x8xf32>
  %qn = ad.neg %q2 : tensor<1x2x?x8xf32> -> tensor<1x2x?x8xf32>
  %qr = ad.cat %qn, %q1 dim -1 : (tensor<1x2x?x8xf32>, tensor<1x2x?x8xf32>) -> tensor<1x2x?x16xf32>
  %qs = ad.mul %qr, %su : tensor<1x2x?x16xf32>, tensor<1x1x?x16xf32> -> tensor<1x2x?x16xf32>
  %qe = ad.add %qc, %qs : tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32> -> tensor<1x2x?x16xf32>
  %o = ad.attention %qe, %qe, %qe causal : (tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>) -> tensor<1x2x?x16xf32>
  func.return %o : tensor<1x2x?x16xf32>
}
