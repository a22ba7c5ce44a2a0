// fuse-rope-attention: HF's apply_rotary_pos_emb on Q and K, repeat_kv on K and V, and SDPA
// become one ad.rope_attention on the un-rotated, un-repeated tensors; in every spelling of HF's
// decoders (full or partial rotary, rotate_half or interleaved pairs, before or after the
// heads/seq transpose), and for head dims that are not powers of two.
// RUN: ad-opt %s --split-input-file -p fuse-rope-attention | filecheck %s
// RUN: ad-opt %s --split-input-file -p fuse-rope-attention -t triton | filecheck %s --check-prefix=KERNEL

// CHECK-LABEL: func.func @hf_attention
// CHECK-NEXT:    %[[O:.*]] = ad.rope_attention %q, %k, %v rope %cos, %sin mask %m scale 1.250000e-01 : (tensor<1x4x?x64xbf16>, tensor<1x2x?x64xbf16>, tensor<1x2x?x64xbf16>, tensor<1x?x64xbf16>, tensor<1x?x64xbf16>, tensor<1x1x?x?xi1>) -> tensor<1x4x?x64xbf16>
// CHECK-NEXT:    func.return %[[O]]
// KERNEL-LABEL: kernel 1 of 1: rope_attention_
// KERNEL:       from ad_mlir.codegen.templates.attention_kernel import attention_blocks
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

// head_dim 16: each rotated half (8 dims) is padded to a dot's depth of 16 in the kernel.
// CHECK-LABEL: func.func @small_head_dim
// CHECK-NEXT:    %[[O:.*]] = ad.rope_attention %q, %q, %q rope %cos, %sin causal scale 2.500000e-01 : (tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>, tensor<1x?x16xf32>, tensor<1x?x16xf32>) -> tensor<1x2x?x16xf32>
// CHECK-NEXT:    func.return %[[O]]
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
  %o = ad.attention %qe, %qe, %q causal : (tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>) -> tensor<1x2x?x16xf32>
  func.return %o : tensor<1x2x?x16xf32>
}

// -----

// GPT-NeoX / Phi partial rotary: the first 16 of 32 dims rotate (cat(rope(q[..., :16]), q[..., 16:])),
// rotary_dim is the tables' width.
// CHECK-LABEL: func.func @gpt_neox_partial
// CHECK-NEXT:    %[[O:.*]] = ad.rope_attention %q, %k, %v rope %cos, %sin causal scale 0.17677669529663689 : (tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>, tensor<1x?x16xf32>, tensor<1x?x16xf32>) -> tensor<1x4x?x32xf32>
// CHECK-NEXT:    func.return %[[O]]
func.func @gpt_neox_partial(%q: tensor<1x4x?x32xf32>, %k: tensor<1x4x?x32xf32>, %v: tensor<1x4x?x32xf32>, %cos: tensor<1x?x16xf32>, %sin: tensor<1x?x16xf32>) -> tensor<1x4x?x32xf32> {
  %cu = ad.unsqueeze %cos dim 1 : tensor<1x?x16xf32> -> tensor<1x1x?x16xf32>
  %su = ad.unsqueeze %sin dim 1 : tensor<1x?x16xf32> -> tensor<1x1x?x16xf32>
  %qr = ad.slice %q dim 3 [0, 16, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x16xf32>
  %qp = ad.slice %q dim 3 [16, 9223372036854775807, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x16xf32>
  %qc = ad.mul %qr, %cu : tensor<1x4x?x16xf32>, tensor<1x1x?x16xf32> -> tensor<1x4x?x16xf32>
  %q1 = ad.slice %qr dim 3 [0, 8, 1] : tensor<1x4x?x16xf32> -> tensor<1x4x?x8xf32>
  %q2 = ad.slice %qr dim 3 [8, 9223372036854775807, 1] : tensor<1x4x?x16xf32> -> tensor<1x4x?x8xf32>
  %qn = ad.neg %q2 : tensor<1x4x?x8xf32> -> tensor<1x4x?x8xf32>
  %qrot = ad.cat %qn, %q1 dim -1 : (tensor<1x4x?x8xf32>, tensor<1x4x?x8xf32>) -> tensor<1x4x?x16xf32>
  %qs = ad.mul %qrot, %su : tensor<1x4x?x16xf32>, tensor<1x1x?x16xf32> -> tensor<1x4x?x16xf32>
  %qa = ad.add %qc, %qs : tensor<1x4x?x16xf32>, tensor<1x4x?x16xf32> -> tensor<1x4x?x16xf32>
  %qcat = ad.cat %qa, %qp dim -1 : (tensor<1x4x?x16xf32>, tensor<1x4x?x16xf32>) -> tensor<1x4x?x32xf32>
  %kr = ad.slice %k dim 3 [0, 16, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x16xf32>
  %kp = ad.slice %k dim 3 [16, 9223372036854775807, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x16xf32>
  %kc = ad.mul %kr, %cu : tensor<1x4x?x16xf32>, tensor<1x1x?x16xf32> -> tensor<1x4x?x16xf32>
  %k1 = ad.slice %kr dim 3 [0, 8, 1] : tensor<1x4x?x16xf32> -> tensor<1x4x?x8xf32>
  %k2 = ad.slice %kr dim 3 [8, 9223372036854775807, 1] : tensor<1x4x?x16xf32> -> tensor<1x4x?x8xf32>
  %kn = ad.neg %k2 : tensor<1x4x?x8xf32> -> tensor<1x4x?x8xf32>
  %krot = ad.cat %kn, %k1 dim -1 : (tensor<1x4x?x8xf32>, tensor<1x4x?x8xf32>) -> tensor<1x4x?x16xf32>
  %ks = ad.mul %krot, %su : tensor<1x4x?x16xf32>, tensor<1x1x?x16xf32> -> tensor<1x4x?x16xf32>
  %ka = ad.add %kc, %ks : tensor<1x4x?x16xf32>, tensor<1x4x?x16xf32> -> tensor<1x4x?x16xf32>
  %kcat = ad.cat %ka, %kp dim -1 : (tensor<1x4x?x16xf32>, tensor<1x4x?x16xf32>) -> tensor<1x4x?x32xf32>
  %o = ad.attention %qcat, %kcat, %v causal : (tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>) -> tensor<1x4x?x32xf32>
  func.return %o : tensor<1x4x?x32xf32>
}

// -----

// Phi-3's partial form with rotary_dim = head_dim: canonicalize dropped q[..., :32], q[..., 32:] is empty.
// CHECK-LABEL: func.func @phi3_empty_pass
// CHECK-NEXT:    %[[O:.*]] = ad.rope_attention %q, %k, %v rope %cos, %sin causal scale 0.17677669529663689 : (tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>, tensor<1x?x32xf32>, tensor<1x?x32xf32>) -> tensor<1x4x?x32xf32>
// CHECK-NEXT:    func.return %[[O]]
func.func @phi3_empty_pass(%q: tensor<1x4x?x32xf32>, %k: tensor<1x4x?x32xf32>, %v: tensor<1x4x?x32xf32>, %cos: tensor<1x?x32xf32>, %sin: tensor<1x?x32xf32>) -> tensor<1x4x?x32xf32> {
  %cu = ad.unsqueeze %cos dim 1 : tensor<1x?x32xf32> -> tensor<1x1x?x32xf32>
  %su = ad.unsqueeze %sin dim 1 : tensor<1x?x32xf32> -> tensor<1x1x?x32xf32>
  %qp = ad.slice %q dim 3 [32, 9223372036854775807, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x0xf32>
  %qc = ad.mul %q, %cu : tensor<1x4x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x4x?x32xf32>
  %q1 = ad.slice %q dim 3 [0, 16, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x16xf32>
  %q2 = ad.slice %q dim 3 [16, 9223372036854775807, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x16xf32>
  %qn = ad.neg %q2 : tensor<1x4x?x16xf32> -> tensor<1x4x?x16xf32>
  %qrot = ad.cat %qn, %q1 dim -1 : (tensor<1x4x?x16xf32>, tensor<1x4x?x16xf32>) -> tensor<1x4x?x32xf32>
  %qs = ad.mul %qrot, %su : tensor<1x4x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x4x?x32xf32>
  %qa = ad.add %qc, %qs : tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32> -> tensor<1x4x?x32xf32>
  %qcat = ad.cat %qa, %qp dim -1 : (tensor<1x4x?x32xf32>, tensor<1x4x?x0xf32>) -> tensor<1x4x?x32xf32>
  %kp = ad.slice %k dim 3 [32, 9223372036854775807, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x0xf32>
  %kc = ad.mul %k, %cu : tensor<1x4x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x4x?x32xf32>
  %k1 = ad.slice %k dim 3 [0, 16, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x16xf32>
  %k2 = ad.slice %k dim 3 [16, 9223372036854775807, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x16xf32>
  %kn = ad.neg %k2 : tensor<1x4x?x16xf32> -> tensor<1x4x?x16xf32>
  %krot = ad.cat %kn, %k1 dim -1 : (tensor<1x4x?x16xf32>, tensor<1x4x?x16xf32>) -> tensor<1x4x?x32xf32>
  %ks = ad.mul %krot, %su : tensor<1x4x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x4x?x32xf32>
  %ka = ad.add %kc, %ks : tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32> -> tensor<1x4x?x32xf32>
  %kcat = ad.cat %ka, %kp dim -1 : (tensor<1x4x?x32xf32>, tensor<1x4x?x0xf32>) -> tensor<1x4x?x32xf32>
  %o = ad.attention %qcat, %kcat, %v causal : (tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>) -> tensor<1x4x?x32xf32>
  func.return %o : tensor<1x4x?x32xf32>
}

// -----

// StableLM-3B's head: 80 dims (not a power of two), 20 of them rotated (a rotary half of 10).
// CHECK-LABEL: func.func @head_dim_80_partial_20
// CHECK-NEXT:    %[[O:.*]] = ad.rope_attention %q, %k, %v rope %cos, %sin causal scale 0.11180339887498948 : (tensor<1x4x?x80xf32>, tensor<1x4x?x80xf32>, tensor<1x4x?x80xf32>, tensor<1x?x20xf32>, tensor<1x?x20xf32>) -> tensor<1x4x?x80xf32>
// CHECK-NEXT:    func.return %[[O]]
func.func @head_dim_80_partial_20(%q: tensor<1x4x?x80xf32>, %k: tensor<1x4x?x80xf32>, %v: tensor<1x4x?x80xf32>, %cos: tensor<1x?x20xf32>, %sin: tensor<1x?x20xf32>) -> tensor<1x4x?x80xf32> {
  %cu = ad.unsqueeze %cos dim 1 : tensor<1x?x20xf32> -> tensor<1x1x?x20xf32>
  %su = ad.unsqueeze %sin dim 1 : tensor<1x?x20xf32> -> tensor<1x1x?x20xf32>
  %qr = ad.slice %q dim 3 [0, 20, 1] : tensor<1x4x?x80xf32> -> tensor<1x4x?x20xf32>
  %qp = ad.slice %q dim 3 [20, 9223372036854775807, 1] : tensor<1x4x?x80xf32> -> tensor<1x4x?x60xf32>
  %qc = ad.mul %qr, %cu : tensor<1x4x?x20xf32>, tensor<1x1x?x20xf32> -> tensor<1x4x?x20xf32>
  %q1 = ad.slice %qr dim 3 [0, 10, 1] : tensor<1x4x?x20xf32> -> tensor<1x4x?x10xf32>
  %q2 = ad.slice %qr dim 3 [10, 9223372036854775807, 1] : tensor<1x4x?x20xf32> -> tensor<1x4x?x10xf32>
  %qn = ad.neg %q2 : tensor<1x4x?x10xf32> -> tensor<1x4x?x10xf32>
  %qrot = ad.cat %qn, %q1 dim -1 : (tensor<1x4x?x10xf32>, tensor<1x4x?x10xf32>) -> tensor<1x4x?x20xf32>
  %qs = ad.mul %qrot, %su : tensor<1x4x?x20xf32>, tensor<1x1x?x20xf32> -> tensor<1x4x?x20xf32>
  %qa = ad.add %qc, %qs : tensor<1x4x?x20xf32>, tensor<1x4x?x20xf32> -> tensor<1x4x?x20xf32>
  %qcat = ad.cat %qa, %qp dim -1 : (tensor<1x4x?x20xf32>, tensor<1x4x?x60xf32>) -> tensor<1x4x?x80xf32>
  %kr = ad.slice %k dim 3 [0, 20, 1] : tensor<1x4x?x80xf32> -> tensor<1x4x?x20xf32>
  %kp = ad.slice %k dim 3 [20, 9223372036854775807, 1] : tensor<1x4x?x80xf32> -> tensor<1x4x?x60xf32>
  %kc = ad.mul %kr, %cu : tensor<1x4x?x20xf32>, tensor<1x1x?x20xf32> -> tensor<1x4x?x20xf32>
  %k1 = ad.slice %kr dim 3 [0, 10, 1] : tensor<1x4x?x20xf32> -> tensor<1x4x?x10xf32>
  %k2 = ad.slice %kr dim 3 [10, 9223372036854775807, 1] : tensor<1x4x?x20xf32> -> tensor<1x4x?x10xf32>
  %kn = ad.neg %k2 : tensor<1x4x?x10xf32> -> tensor<1x4x?x10xf32>
  %krot = ad.cat %kn, %k1 dim -1 : (tensor<1x4x?x10xf32>, tensor<1x4x?x10xf32>) -> tensor<1x4x?x20xf32>
  %ks = ad.mul %krot, %su : tensor<1x4x?x20xf32>, tensor<1x1x?x20xf32> -> tensor<1x4x?x20xf32>
  %ka = ad.add %kc, %ks : tensor<1x4x?x20xf32>, tensor<1x4x?x20xf32> -> tensor<1x4x?x20xf32>
  %kcat = ad.cat %ka, %kp dim -1 : (tensor<1x4x?x20xf32>, tensor<1x4x?x60xf32>) -> tensor<1x4x?x80xf32>
  %o = ad.attention %qcat, %kcat, %v causal : (tensor<1x4x?x80xf32>, tensor<1x4x?x80xf32>, tensor<1x4x?x80xf32>) -> tensor<1x4x?x80xf32>
  func.return %o : tensor<1x4x?x80xf32>
}

// -----

// GLM: half the head rotates, in interleaved pairs (stack(-x[..., 1::2], x[..., ::2]).flatten(-2)); the
// tables are the first half of HF's, repeat_interleaved (opaque torch ops, kept), squeezed to [b, s, R].
// CHECK-LABEL: func.func @glm_partial_pairs
// CHECK-NOT:     ad.mul
// CHECK-NOT:     aten.stack
// CHECK-NOT:     aten.flatten
// CHECK-NOT:     ad.cat
// CHECK:         %[[CI:.*]] = ad.torch_op "aten.repeat_interleave.self_int"(%ch)
// CHECK:         %[[SI:.*]] = ad.torch_op "aten.repeat_interleave.self_int"(%sh)
// CHECK-NEXT:    %[[C:.*]] = ad.squeeze %[[CI]] dim [1] : tensor<1x1x?x16xf32> -> tensor<1x?x16xf32>
// CHECK-NEXT:    %[[S:.*]] = ad.squeeze %[[SI]] dim [1] : tensor<1x1x?x16xf32> -> tensor<1x?x16xf32>
// CHECK-NEXT:    %[[O:.*]] = ad.rope_attention %q, %k, %v rope %[[C]], %[[S]] interleaved causal scale 0.17677669529663689 : (tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>, tensor<1x?x16xf32>, tensor<1x?x16xf32>) -> tensor<1x4x?x32xf32>
// CHECK-NEXT:    func.return %[[O]]
func.func @glm_partial_pairs(%q: tensor<1x4x?x32xf32>, %k: tensor<1x4x?x32xf32>, %v: tensor<1x4x?x32xf32>, %cos: tensor<1x?x16xf32>, %sin: tensor<1x?x16xf32>) -> tensor<1x4x?x32xf32> {
  %cu = ad.unsqueeze %cos dim 1 : tensor<1x?x16xf32> -> tensor<1x1x?x16xf32>
  %su = ad.unsqueeze %sin dim 1 : tensor<1x?x16xf32> -> tensor<1x1x?x16xf32>
  %ch = ad.slice %cu dim 3 [0, 8, 1] : tensor<1x1x?x16xf32> -> tensor<1x1x?x8xf32>
  %ci = ad.torch_op "aten.repeat_interleave.self_int"(%ch) [#ad.ref<0>, 2 : i64, -1 : i64] {} : (tensor<1x1x?x8xf32>) -> tensor<1x1x?x16xf32>
  %sh = ad.slice %su dim 3 [0, 8, 1] : tensor<1x1x?x16xf32> -> tensor<1x1x?x8xf32>
  %si = ad.torch_op "aten.repeat_interleave.self_int"(%sh) [#ad.ref<0>, 2 : i64, -1 : i64] {} : (tensor<1x1x?x8xf32>) -> tensor<1x1x?x16xf32>
  %qr = ad.slice %q dim 3 [0, 16, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x16xf32>
  %qp = ad.slice %q dim 3 [16, 9223372036854775807, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x16xf32>
  %qc = ad.mul %qr, %ci : tensor<1x4x?x16xf32>, tensor<1x1x?x16xf32> -> tensor<1x4x?x16xf32>
  %qe = ad.slice %qr dim 3 [0, 9223372036854775807, 2] : tensor<1x4x?x16xf32> -> tensor<1x4x?x8xf32>
  %qo = ad.slice %qr dim 3 [1, 9223372036854775807, 2] : tensor<1x4x?x16xf32> -> tensor<1x4x?x8xf32>
  %qn = ad.neg %qo : tensor<1x4x?x8xf32> -> tensor<1x4x?x8xf32>
  %qst = ad.torch_op "aten.stack.default"(%qn, %qe) [[#ad.ref<0>, #ad.ref<1>], -1 : i64] {} : (tensor<1x4x?x8xf32>, tensor<1x4x?x8xf32>) -> tensor<1x4x?x8x2xf32>
  %qrot = ad.torch_op "aten.flatten.using_ints"(%qst) [#ad.ref<0>, -2 : i64] {} : (tensor<1x4x?x8x2xf32>) -> tensor<1x4x?x16xf32>
  %qs = ad.mul %qrot, %si : tensor<1x4x?x16xf32>, tensor<1x1x?x16xf32> -> tensor<1x4x?x16xf32>
  %qa = ad.add %qc, %qs : tensor<1x4x?x16xf32>, tensor<1x4x?x16xf32> -> tensor<1x4x?x16xf32>
  %qcat = ad.cat %qa, %qp dim -1 : (tensor<1x4x?x16xf32>, tensor<1x4x?x16xf32>) -> tensor<1x4x?x32xf32>
  %kr = ad.slice %k dim 3 [0, 16, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x16xf32>
  %kp = ad.slice %k dim 3 [16, 9223372036854775807, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x16xf32>
  %kc = ad.mul %kr, %ci : tensor<1x4x?x16xf32>, tensor<1x1x?x16xf32> -> tensor<1x4x?x16xf32>
  %ke = ad.slice %kr dim 3 [0, 9223372036854775807, 2] : tensor<1x4x?x16xf32> -> tensor<1x4x?x8xf32>
  %ko = ad.slice %kr dim 3 [1, 9223372036854775807, 2] : tensor<1x4x?x16xf32> -> tensor<1x4x?x8xf32>
  %kn = ad.neg %ko : tensor<1x4x?x8xf32> -> tensor<1x4x?x8xf32>
  %kst = ad.torch_op "aten.stack.default"(%kn, %ke) [[#ad.ref<0>, #ad.ref<1>], -1 : i64] {} : (tensor<1x4x?x8xf32>, tensor<1x4x?x8xf32>) -> tensor<1x4x?x8x2xf32>
  %krot = ad.torch_op "aten.flatten.using_ints"(%kst) [#ad.ref<0>, -2 : i64] {} : (tensor<1x4x?x8x2xf32>) -> tensor<1x4x?x16xf32>
  %ks = ad.mul %krot, %si : tensor<1x4x?x16xf32>, tensor<1x1x?x16xf32> -> tensor<1x4x?x16xf32>
  %ka = ad.add %kc, %ks : tensor<1x4x?x16xf32>, tensor<1x4x?x16xf32> -> tensor<1x4x?x16xf32>
  %kcat = ad.cat %ka, %kp dim -1 : (tensor<1x4x?x16xf32>, tensor<1x4x?x16xf32>) -> tensor<1x4x?x32xf32>
  %o = ad.attention %qcat, %kcat, %v causal : (tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>) -> tensor<1x4x?x32xf32>
  func.return %o : tensor<1x4x?x32xf32>
}

// -----

// GPT-J: RoPE on [b, s, h, d] before the transpose (the tables unsqueezed at dim 2), interleaved pairs on
// the first 16 of 32 dims; each rope repeat_interleaves its own copy of the tables (the key's is erased).
// CHECK-LABEL: func.func @gptj_before_transpose
// CHECK-NOT:     ad.mul
// CHECK-NOT:     %kctab
// CHECK:         %[[CI:.*]] = ad.torch_op "aten.repeat_interleave.self_int"(%qctu) [#ad.ref<0>, 2 : i64, 3 : i64]
// CHECK:         %[[SI:.*]] = ad.torch_op "aten.repeat_interleave.self_int"(%qstu) [#ad.ref<0>, 2 : i64, 3 : i64]
// CHECK-NEXT:    %[[Q:.*]] = ad.transpose %q 1, 2 : tensor<1x?x4x32xf32> -> tensor<1x4x?x32xf32>
// CHECK-NEXT:    %[[K:.*]] = ad.transpose %k 1, 2 : tensor<1x?x4x32xf32> -> tensor<1x4x?x32xf32>
// CHECK-NEXT:    %[[C:.*]] = ad.squeeze %[[CI]] dim [2] : tensor<1x?x1x16xf32> -> tensor<1x?x16xf32>
// CHECK-NEXT:    %[[S:.*]] = ad.squeeze %[[SI]] dim [2] : tensor<1x?x1x16xf32> -> tensor<1x?x16xf32>
// CHECK-NEXT:    %[[O:.*]] = ad.rope_attention %[[Q]], %[[K]], %v rope %[[C]], %[[S]] interleaved mask %m scale 0.17677669529663687 : (tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>, tensor<1x?x16xf32>, tensor<1x?x16xf32>, tensor<1x1x?x?xi1>) -> tensor<1x4x?x32xf32>
// CHECK-NEXT:    func.return %[[O]]
func.func @gptj_before_transpose(%q: tensor<1x?x4x32xf32>, %k: tensor<1x?x4x32xf32>, %v: tensor<1x4x?x32xf32>, %cos: tensor<1x?x8xf32>, %sin: tensor<1x?x8xf32>, %m: tensor<1x1x?x?xi1>) -> tensor<1x4x?x32xf32> {
  %qctu = ad.unsqueeze %cos dim 2 : tensor<1x?x8xf32> -> tensor<1x?x1x8xf32>
  %qctab = ad.torch_op "aten.repeat_interleave.self_int"(%qctu) [#ad.ref<0>, 2 : i64, 3 : i64] {} : (tensor<1x?x1x8xf32>) -> tensor<1x?x1x16xf32>
  %qstu = ad.unsqueeze %sin dim 2 : tensor<1x?x8xf32> -> tensor<1x?x1x8xf32>
  %qstab = ad.torch_op "aten.repeat_interleave.self_int"(%qstu) [#ad.ref<0>, 2 : i64, 3 : i64] {} : (tensor<1x?x1x8xf32>) -> tensor<1x?x1x16xf32>
  %qr = ad.slice %q dim 3 [0, 16, 1] : tensor<1x?x4x32xf32> -> tensor<1x?x4x16xf32>
  %qp = ad.slice %q dim 3 [16, 9223372036854775807, 1] : tensor<1x?x4x32xf32> -> tensor<1x?x4x16xf32>
  %qc = ad.mul %qr, %qctab : tensor<1x?x4x16xf32>, tensor<1x?x1x16xf32> -> tensor<1x?x4x16xf32>
  %qe = ad.slice %qr dim 3 [0, 9223372036854775807, 2] : tensor<1x?x4x16xf32> -> tensor<1x?x4x8xf32>
  %qo = ad.slice %qr dim 3 [1, 9223372036854775807, 2] : tensor<1x?x4x16xf32> -> tensor<1x?x4x8xf32>
  %qn = ad.neg %qo : tensor<1x?x4x8xf32> -> tensor<1x?x4x8xf32>
  %qst = ad.torch_op "aten.stack.default"(%qn, %qe) [[#ad.ref<0>, #ad.ref<1>], -1 : i64] {} : (tensor<1x?x4x8xf32>, tensor<1x?x4x8xf32>) -> tensor<1x?x4x8x2xf32>
  %qrot = ad.torch_op "aten.flatten.using_ints"(%qst) [#ad.ref<0>, -2 : i64] {} : (tensor<1x?x4x8x2xf32>) -> tensor<1x?x4x16xf32>
  %qs = ad.mul %qrot, %qstab : tensor<1x?x4x16xf32>, tensor<1x?x1x16xf32> -> tensor<1x?x4x16xf32>
  %qa = ad.add %qc, %qs : tensor<1x?x4x16xf32>, tensor<1x?x4x16xf32> -> tensor<1x?x4x16xf32>
  %qcat = ad.cat %qa, %qp dim -1 : (tensor<1x?x4x16xf32>, tensor<1x?x4x16xf32>) -> tensor<1x?x4x32xf32>
  %qh = ad.transpose %qcat 1, 2 : tensor<1x?x4x32xf32> -> tensor<1x4x?x32xf32>
  %kctu = ad.unsqueeze %cos dim 2 : tensor<1x?x8xf32> -> tensor<1x?x1x8xf32>
  %kctab = ad.torch_op "aten.repeat_interleave.self_int"(%kctu) [#ad.ref<0>, 2 : i64, 3 : i64] {} : (tensor<1x?x1x8xf32>) -> tensor<1x?x1x16xf32>
  %kstu = ad.unsqueeze %sin dim 2 : tensor<1x?x8xf32> -> tensor<1x?x1x8xf32>
  %kstab = ad.torch_op "aten.repeat_interleave.self_int"(%kstu) [#ad.ref<0>, 2 : i64, 3 : i64] {} : (tensor<1x?x1x8xf32>) -> tensor<1x?x1x16xf32>
  %kr = ad.slice %k dim 3 [0, 16, 1] : tensor<1x?x4x32xf32> -> tensor<1x?x4x16xf32>
  %kp = ad.slice %k dim 3 [16, 9223372036854775807, 1] : tensor<1x?x4x32xf32> -> tensor<1x?x4x16xf32>
  %kc = ad.mul %kr, %kctab : tensor<1x?x4x16xf32>, tensor<1x?x1x16xf32> -> tensor<1x?x4x16xf32>
  %ke = ad.slice %kr dim 3 [0, 9223372036854775807, 2] : tensor<1x?x4x16xf32> -> tensor<1x?x4x8xf32>
  %ko = ad.slice %kr dim 3 [1, 9223372036854775807, 2] : tensor<1x?x4x16xf32> -> tensor<1x?x4x8xf32>
  %kn = ad.neg %ko : tensor<1x?x4x8xf32> -> tensor<1x?x4x8xf32>
  %kst = ad.torch_op "aten.stack.default"(%kn, %ke) [[#ad.ref<0>, #ad.ref<1>], -1 : i64] {} : (tensor<1x?x4x8xf32>, tensor<1x?x4x8xf32>) -> tensor<1x?x4x8x2xf32>
  %krot = ad.torch_op "aten.flatten.using_ints"(%kst) [#ad.ref<0>, -2 : i64] {} : (tensor<1x?x4x8x2xf32>) -> tensor<1x?x4x16xf32>
  %ks = ad.mul %krot, %kstab : tensor<1x?x4x16xf32>, tensor<1x?x1x16xf32> -> tensor<1x?x4x16xf32>
  %ka = ad.add %kc, %ks : tensor<1x?x4x16xf32>, tensor<1x?x4x16xf32> -> tensor<1x?x4x16xf32>
  %kcat = ad.cat %ka, %kp dim -1 : (tensor<1x?x4x16xf32>, tensor<1x?x4x16xf32>) -> tensor<1x?x4x32xf32>
  %kh = ad.transpose %kcat 1, 2 : tensor<1x?x4x32xf32> -> tensor<1x4x?x32xf32>
  %o = ad.attention %qh, %kh, %v mask %m scale 0.17677669529663687 : f64 : (tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>, tensor<1x1x?x?xi1>) -> tensor<1x4x?x32xf32>
  func.return %o : tensor<1x4x?x32xf32>
}

// -----

// Not a partial RoPE: the query's passed dims come from the key. Unchanged.
// CHECK-LABEL: func.func @pass_from_another_tensor
// CHECK-NOT:     ad.rope_attention
// CHECK:         %qcat = ad.cat %qa, %kp dim -1
// CHECK:         %o = ad.attention %qcat, %kcat, %v causal
func.func @pass_from_another_tensor(%q: tensor<1x4x?x32xf32>, %k: tensor<1x4x?x32xf32>, %v: tensor<1x4x?x32xf32>, %cos: tensor<1x?x16xf32>, %sin: tensor<1x?x16xf32>) -> tensor<1x4x?x32xf32> {
  %cu = ad.unsqueeze %cos dim 1 : tensor<1x?x16xf32> -> tensor<1x1x?x16xf32>
  %su = ad.unsqueeze %sin dim 1 : tensor<1x?x16xf32> -> tensor<1x1x?x16xf32>
  %qr = ad.slice %q dim 3 [0, 16, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x16xf32>
  %qp = ad.slice %q dim 3 [16, 9223372036854775807, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x16xf32>
  %qc = ad.mul %qr, %cu : tensor<1x4x?x16xf32>, tensor<1x1x?x16xf32> -> tensor<1x4x?x16xf32>
  %q1 = ad.slice %qr dim 3 [0, 8, 1] : tensor<1x4x?x16xf32> -> tensor<1x4x?x8xf32>
  %q2 = ad.slice %qr dim 3 [8, 9223372036854775807, 1] : tensor<1x4x?x16xf32> -> tensor<1x4x?x8xf32>
  %qn = ad.neg %q2 : tensor<1x4x?x8xf32> -> tensor<1x4x?x8xf32>
  %qrot = ad.cat %qn, %q1 dim -1 : (tensor<1x4x?x8xf32>, tensor<1x4x?x8xf32>) -> tensor<1x4x?x16xf32>
  %qs = ad.mul %qrot, %su : tensor<1x4x?x16xf32>, tensor<1x1x?x16xf32> -> tensor<1x4x?x16xf32>
  %qa = ad.add %qc, %qs : tensor<1x4x?x16xf32>, tensor<1x4x?x16xf32> -> tensor<1x4x?x16xf32>
  %qcat = ad.cat %qa, %kp dim -1 : (tensor<1x4x?x16xf32>, tensor<1x4x?x16xf32>) -> tensor<1x4x?x32xf32>
  %kr = ad.slice %k dim 3 [0, 16, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x16xf32>
  %kp = ad.slice %k dim 3 [16, 9223372036854775807, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x16xf32>
  %kc = ad.mul %kr, %cu : tensor<1x4x?x16xf32>, tensor<1x1x?x16xf32> -> tensor<1x4x?x16xf32>
  %k1 = ad.slice %kr dim 3 [0, 8, 1] : tensor<1x4x?x16xf32> -> tensor<1x4x?x8xf32>
  %k2 = ad.slice %kr dim 3 [8, 9223372036854775807, 1] : tensor<1x4x?x16xf32> -> tensor<1x4x?x8xf32>
  %kn = ad.neg %k2 : tensor<1x4x?x8xf32> -> tensor<1x4x?x8xf32>
  %krot = ad.cat %kn, %k1 dim -1 : (tensor<1x4x?x8xf32>, tensor<1x4x?x8xf32>) -> tensor<1x4x?x16xf32>
  %ks = ad.mul %krot, %su : tensor<1x4x?x16xf32>, tensor<1x1x?x16xf32> -> tensor<1x4x?x16xf32>
  %ka = ad.add %kc, %ks : tensor<1x4x?x16xf32>, tensor<1x4x?x16xf32> -> tensor<1x4x?x16xf32>
  %kcat = ad.cat %ka, %kp dim -1 : (tensor<1x4x?x16xf32>, tensor<1x4x?x16xf32>) -> tensor<1x4x?x32xf32>
  %o = ad.attention %qcat, %kcat, %v causal : (tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>) -> tensor<1x4x?x32xf32>
  func.return %o : tensor<1x4x?x32xf32>
}

// -----

// stack(-x[..., ::2], x[..., 1::2]): minus the interleaved rotation, not RoPE. Unchanged.
// CHECK-LABEL: func.func @pairs_of_the_wrong_parity
// CHECK-NOT:     ad.rope_attention
// CHECK:         %qst = ad.torch_op "aten.stack.default"(%qn, %qe)
// CHECK:         %o = ad.attention %qcat, %kcat, %v causal
func.func @pairs_of_the_wrong_parity(%q: tensor<1x4x?x32xf32>, %k: tensor<1x4x?x32xf32>, %v: tensor<1x4x?x32xf32>, %cos: tensor<1x?x16xf32>, %sin: tensor<1x?x16xf32>) -> tensor<1x4x?x32xf32> {
  %cu = ad.unsqueeze %cos dim 1 : tensor<1x?x16xf32> -> tensor<1x1x?x16xf32>
  %su = ad.unsqueeze %sin dim 1 : tensor<1x?x16xf32> -> tensor<1x1x?x16xf32>
  %ch = ad.slice %cu dim 3 [0, 8, 1] : tensor<1x1x?x16xf32> -> tensor<1x1x?x8xf32>
  %ci = ad.torch_op "aten.repeat_interleave.self_int"(%ch) [#ad.ref<0>, 2 : i64, -1 : i64] {} : (tensor<1x1x?x8xf32>) -> tensor<1x1x?x16xf32>
  %sh = ad.slice %su dim 3 [0, 8, 1] : tensor<1x1x?x16xf32> -> tensor<1x1x?x8xf32>
  %si = ad.torch_op "aten.repeat_interleave.self_int"(%sh) [#ad.ref<0>, 2 : i64, -1 : i64] {} : (tensor<1x1x?x8xf32>) -> tensor<1x1x?x16xf32>
  %qr = ad.slice %q dim 3 [0, 16, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x16xf32>
  %qp = ad.slice %q dim 3 [16, 9223372036854775807, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x16xf32>
  %qc = ad.mul %qr, %ci : tensor<1x4x?x16xf32>, tensor<1x1x?x16xf32> -> tensor<1x4x?x16xf32>
  %qe = ad.slice %qr dim 3 [1, 9223372036854775807, 2] : tensor<1x4x?x16xf32> -> tensor<1x4x?x8xf32>
  %qo = ad.slice %qr dim 3 [0, 9223372036854775807, 2] : tensor<1x4x?x16xf32> -> tensor<1x4x?x8xf32>
  %qn = ad.neg %qo : tensor<1x4x?x8xf32> -> tensor<1x4x?x8xf32>
  %qst = ad.torch_op "aten.stack.default"(%qn, %qe) [[#ad.ref<0>, #ad.ref<1>], -1 : i64] {} : (tensor<1x4x?x8xf32>, tensor<1x4x?x8xf32>) -> tensor<1x4x?x8x2xf32>
  %qrot = ad.torch_op "aten.flatten.using_ints"(%qst) [#ad.ref<0>, -2 : i64] {} : (tensor<1x4x?x8x2xf32>) -> tensor<1x4x?x16xf32>
  %qs = ad.mul %qrot, %si : tensor<1x4x?x16xf32>, tensor<1x1x?x16xf32> -> tensor<1x4x?x16xf32>
  %qa = ad.add %qc, %qs : tensor<1x4x?x16xf32>, tensor<1x4x?x16xf32> -> tensor<1x4x?x16xf32>
  %qcat = ad.cat %qa, %qp dim -1 : (tensor<1x4x?x16xf32>, tensor<1x4x?x16xf32>) -> tensor<1x4x?x32xf32>
  %kr = ad.slice %k dim 3 [0, 16, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x16xf32>
  %kp = ad.slice %k dim 3 [16, 9223372036854775807, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x16xf32>
  %kc = ad.mul %kr, %ci : tensor<1x4x?x16xf32>, tensor<1x1x?x16xf32> -> tensor<1x4x?x16xf32>
  %ke = ad.slice %kr dim 3 [1, 9223372036854775807, 2] : tensor<1x4x?x16xf32> -> tensor<1x4x?x8xf32>
  %ko = ad.slice %kr dim 3 [0, 9223372036854775807, 2] : tensor<1x4x?x16xf32> -> tensor<1x4x?x8xf32>
  %kn = ad.neg %ko : tensor<1x4x?x8xf32> -> tensor<1x4x?x8xf32>
  %kst = ad.torch_op "aten.stack.default"(%kn, %ke) [[#ad.ref<0>, #ad.ref<1>], -1 : i64] {} : (tensor<1x4x?x8xf32>, tensor<1x4x?x8xf32>) -> tensor<1x4x?x8x2xf32>
  %krot = ad.torch_op "aten.flatten.using_ints"(%kst) [#ad.ref<0>, -2 : i64] {} : (tensor<1x4x?x8x2xf32>) -> tensor<1x4x?x16xf32>
  %ks = ad.mul %krot, %si : tensor<1x4x?x16xf32>, tensor<1x1x?x16xf32> -> tensor<1x4x?x16xf32>
  %ka = ad.add %kc, %ks : tensor<1x4x?x16xf32>, tensor<1x4x?x16xf32> -> tensor<1x4x?x16xf32>
  %kcat = ad.cat %ka, %kp dim -1 : (tensor<1x4x?x16xf32>, tensor<1x4x?x16xf32>) -> tensor<1x4x?x32xf32>
  %o = ad.attention %qcat, %kcat, %v causal : (tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>) -> tensor<1x4x?x32xf32>
  func.return %o : tensor<1x4x?x32xf32>
}

// -----

// The key rotated with cos and sin swapped: the op takes one pair of tables. Unchanged.
// CHECK-LABEL: func.func @key_with_other_tables
// CHECK-NOT:     ad.rope_attention
// CHECK:         %ks = ad.mul %krot, %cu
// CHECK:         %o = ad.attention %qcat, %kcat, %v causal
func.func @key_with_other_tables(%q: tensor<1x4x?x32xf32>, %k: tensor<1x4x?x32xf32>, %v: tensor<1x4x?x32xf32>, %cos: tensor<1x?x16xf32>, %sin: tensor<1x?x16xf32>) -> tensor<1x4x?x32xf32> {
  %cu = ad.unsqueeze %cos dim 1 : tensor<1x?x16xf32> -> tensor<1x1x?x16xf32>
  %su = ad.unsqueeze %sin dim 1 : tensor<1x?x16xf32> -> tensor<1x1x?x16xf32>
  %qr = ad.slice %q dim 3 [0, 16, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x16xf32>
  %qp = ad.slice %q dim 3 [16, 9223372036854775807, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x16xf32>
  %qc = ad.mul %qr, %cu : tensor<1x4x?x16xf32>, tensor<1x1x?x16xf32> -> tensor<1x4x?x16xf32>
  %q1 = ad.slice %qr dim 3 [0, 8, 1] : tensor<1x4x?x16xf32> -> tensor<1x4x?x8xf32>
  %q2 = ad.slice %qr dim 3 [8, 9223372036854775807, 1] : tensor<1x4x?x16xf32> -> tensor<1x4x?x8xf32>
  %qn = ad.neg %q2 : tensor<1x4x?x8xf32> -> tensor<1x4x?x8xf32>
  %qrot = ad.cat %qn, %q1 dim -1 : (tensor<1x4x?x8xf32>, tensor<1x4x?x8xf32>) -> tensor<1x4x?x16xf32>
  %qs = ad.mul %qrot, %su : tensor<1x4x?x16xf32>, tensor<1x1x?x16xf32> -> tensor<1x4x?x16xf32>
  %qa = ad.add %qc, %qs : tensor<1x4x?x16xf32>, tensor<1x4x?x16xf32> -> tensor<1x4x?x16xf32>
  %qcat = ad.cat %qa, %qp dim -1 : (tensor<1x4x?x16xf32>, tensor<1x4x?x16xf32>) -> tensor<1x4x?x32xf32>
  %kr = ad.slice %k dim 3 [0, 16, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x16xf32>
  %kp = ad.slice %k dim 3 [16, 9223372036854775807, 1] : tensor<1x4x?x32xf32> -> tensor<1x4x?x16xf32>
  %kc = ad.mul %kr, %su : tensor<1x4x?x16xf32>, tensor<1x1x?x16xf32> -> tensor<1x4x?x16xf32>
  %k1 = ad.slice %kr dim 3 [0, 8, 1] : tensor<1x4x?x16xf32> -> tensor<1x4x?x8xf32>
  %k2 = ad.slice %kr dim 3 [8, 9223372036854775807, 1] : tensor<1x4x?x16xf32> -> tensor<1x4x?x8xf32>
  %kn = ad.neg %k2 : tensor<1x4x?x8xf32> -> tensor<1x4x?x8xf32>
  %krot = ad.cat %kn, %k1 dim -1 : (tensor<1x4x?x8xf32>, tensor<1x4x?x8xf32>) -> tensor<1x4x?x16xf32>
  %ks = ad.mul %krot, %cu : tensor<1x4x?x16xf32>, tensor<1x1x?x16xf32> -> tensor<1x4x?x16xf32>
  %ka = ad.add %kc, %ks : tensor<1x4x?x16xf32>, tensor<1x4x?x16xf32> -> tensor<1x4x?x16xf32>
  %kcat = ad.cat %ka, %kp dim -1 : (tensor<1x4x?x16xf32>, tensor<1x4x?x16xf32>) -> tensor<1x4x?x32xf32>
  %o = ad.attention %qcat, %kcat, %v causal : (tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>) -> tensor<1x4x?x32xf32>
  func.return %o : tensor<1x4x?x32xf32>
}

// -----

// 34 of 256 dims rotated: the pieces pad to 512 (over the kernel's 256). Unchanged (the log says why).
// CHECK-LABEL: func.func @head_too_wide
// CHECK-NOT:     ad.rope_attention
// CHECK:         %o = ad.attention %qcat, %kcat, %v causal
func.func @head_too_wide(%q: tensor<1x4x?x256xf32>, %k: tensor<1x4x?x256xf32>, %v: tensor<1x4x?x256xf32>, %cos: tensor<1x?x34xf32>, %sin: tensor<1x?x34xf32>) -> tensor<1x4x?x256xf32> {
  %cu = ad.unsqueeze %cos dim 1 : tensor<1x?x34xf32> -> tensor<1x1x?x34xf32>
  %su = ad.unsqueeze %sin dim 1 : tensor<1x?x34xf32> -> tensor<1x1x?x34xf32>
  %qr = ad.slice %q dim 3 [0, 34, 1] : tensor<1x4x?x256xf32> -> tensor<1x4x?x34xf32>
  %qp = ad.slice %q dim 3 [34, 9223372036854775807, 1] : tensor<1x4x?x256xf32> -> tensor<1x4x?x222xf32>
  %qc = ad.mul %qr, %cu : tensor<1x4x?x34xf32>, tensor<1x1x?x34xf32> -> tensor<1x4x?x34xf32>
  %q1 = ad.slice %qr dim 3 [0, 17, 1] : tensor<1x4x?x34xf32> -> tensor<1x4x?x17xf32>
  %q2 = ad.slice %qr dim 3 [17, 9223372036854775807, 1] : tensor<1x4x?x34xf32> -> tensor<1x4x?x17xf32>
  %qn = ad.neg %q2 : tensor<1x4x?x17xf32> -> tensor<1x4x?x17xf32>
  %qrot = ad.cat %qn, %q1 dim -1 : (tensor<1x4x?x17xf32>, tensor<1x4x?x17xf32>) -> tensor<1x4x?x34xf32>
  %qs = ad.mul %qrot, %su : tensor<1x4x?x34xf32>, tensor<1x1x?x34xf32> -> tensor<1x4x?x34xf32>
  %qa = ad.add %qc, %qs : tensor<1x4x?x34xf32>, tensor<1x4x?x34xf32> -> tensor<1x4x?x34xf32>
  %qcat = ad.cat %qa, %qp dim -1 : (tensor<1x4x?x34xf32>, tensor<1x4x?x222xf32>) -> tensor<1x4x?x256xf32>
  %kr = ad.slice %k dim 3 [0, 34, 1] : tensor<1x4x?x256xf32> -> tensor<1x4x?x34xf32>
  %kp = ad.slice %k dim 3 [34, 9223372036854775807, 1] : tensor<1x4x?x256xf32> -> tensor<1x4x?x222xf32>
  %kc = ad.mul %kr, %cu : tensor<1x4x?x34xf32>, tensor<1x1x?x34xf32> -> tensor<1x4x?x34xf32>
  %k1 = ad.slice %kr dim 3 [0, 17, 1] : tensor<1x4x?x34xf32> -> tensor<1x4x?x17xf32>
  %k2 = ad.slice %kr dim 3 [17, 9223372036854775807, 1] : tensor<1x4x?x34xf32> -> tensor<1x4x?x17xf32>
  %kn = ad.neg %k2 : tensor<1x4x?x17xf32> -> tensor<1x4x?x17xf32>
  %krot = ad.cat %kn, %k1 dim -1 : (tensor<1x4x?x17xf32>, tensor<1x4x?x17xf32>) -> tensor<1x4x?x34xf32>
  %ks = ad.mul %krot, %su : tensor<1x4x?x34xf32>, tensor<1x1x?x34xf32> -> tensor<1x4x?x34xf32>
  %ka = ad.add %kc, %ks : tensor<1x4x?x34xf32>, tensor<1x4x?x34xf32> -> tensor<1x4x?x34xf32>
  %kcat = ad.cat %ka, %kp dim -1 : (tensor<1x4x?x34xf32>, tensor<1x4x?x222xf32>) -> tensor<1x4x?x256xf32>
  %o = ad.attention %qcat, %kcat, %v causal : (tensor<1x4x?x256xf32>, tensor<1x4x?x256xf32>, tensor<1x4x?x256xf32>) -> tensor<1x4x?x256xf32>
  func.return %o : tensor<1x4x?x256xf32>
}

// -----

// HF's causal mask, computed from the positions 0 .. seq-1 of the input ids: the op masks
// causally instead, and the mask's computation is gone.
// CHECK-LABEL: func.func @causal
// CHECK-NEXT:    %[[O:.*]] = ad.rope_attention %q, %k, %v rope %cos, %sin causal scale 1.250000e-01 : (tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x?x32xf32>, tensor<1x?x32xf32>) -> tensor<1x2x?x32xf32>
// CHECK-NEXT:    func.return %[[O]]
func.func @causal(%q: tensor<1x2x?x32xf32>, %k: tensor<1x2x?x32xf32>, %v: tensor<1x2x?x32xf32>, %cos: tensor<1x?x32xf32>, %sin: tensor<1x?x32xf32>, %input_ids: tensor<1x?xi64> {ad.input = "input_ids"}) -> tensor<1x2x?x32xf32> {
  %n = ad.sym_size %input_ids dim 1 : tensor<1x?xi64>
  %c0 = ad.constant 0 : i64
  %c1 = ad.constant 1 : i64
  %pos = ad.arange %c0, %n, %c1 : i64, index, i64 -> tensor<?xi64>
  %rows = ad.unsqueeze %pos dim 1 : tensor<?xi64> -> tensor<?x1xi64>
  %cols = ad.unsqueeze %pos dim 0 : tensor<?xi64> -> tensor<1x?xi64>
  %allowed = ad.le %cols, %rows : tensor<1x?xi64>, tensor<?x1xi64> -> tensor<?x?xi1>
  %m3 = ad.unsqueeze %allowed dim 0 : tensor<?x?xi1> -> tensor<1x?x?xi1>
  %mask = ad.unsqueeze %m3 dim 0 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %cu = ad.unsqueeze %cos dim 1 : tensor<1x?x32xf32> -> tensor<1x1x?x32xf32>
  %su = ad.unsqueeze %sin dim 1 : tensor<1x?x32xf32> -> tensor<1x1x?x32xf32>
  %qc = ad.mul %q, %cu : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %q1 = ad.slice %q dim 3 [0, 16, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %q2 = ad.slice %q dim 3 [16, 32, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %qn = ad.neg %q2 : tensor<1x2x?x16xf32> -> tensor<1x2x?x16xf32>
  %qr = ad.cat %qn, %q1 dim -1 : (tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>) -> tensor<1x2x?x32xf32>
  %qs = ad.mul %qr, %su : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %qe = ad.add %qc, %qs : tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32> -> tensor<1x2x?x32xf32>
  %kc = ad.mul %k, %cu : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %k1 = ad.slice %k dim 3 [0, 16, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %k2 = ad.slice %k dim 3 [16, 32, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %kn = ad.neg %k2 : tensor<1x2x?x16xf32> -> tensor<1x2x?x16xf32>
  %kr = ad.cat %kn, %k1 dim -1 : (tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>) -> tensor<1x2x?x32xf32>
  %ks = ad.mul %kr, %su : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %ke = ad.add %kc, %ks : tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32> -> tensor<1x2x?x32xf32>
  %o = ad.attention %qe, %ke, %v mask %mask scale 0.125 : f64 : (tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x1x?x?xi1>) -> tensor<1x2x?x32xf32>
  func.return %o : tensor<1x2x?x32xf32>
}

// -----

// A sliding window of 4 keys (Mistral's mask): causal with window 4, the mask gone.
// CHECK-LABEL: func.func @window
// CHECK-NEXT:    %[[O:.*]] = ad.rope_attention %q, %k, %v rope %cos, %sin causal window 4 scale 1.250000e-01 : (tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x?x32xf32>, tensor<1x?x32xf32>) -> tensor<1x2x?x32xf32>
// CHECK-NEXT:    func.return %[[O]]
func.func @window(%q: tensor<1x2x?x32xf32>, %k: tensor<1x2x?x32xf32>, %v: tensor<1x2x?x32xf32>, %cos: tensor<1x?x32xf32>, %sin: tensor<1x?x32xf32>, %input_ids: tensor<1x?xi64> {ad.input = "input_ids"}) -> tensor<1x2x?x32xf32> {
  %n = ad.sym_size %input_ids dim 1 : tensor<1x?xi64>
  %c0 = ad.constant 0 : i64
  %c1 = ad.constant 1 : i64
  %pos = ad.arange %c0, %n, %c1 : i64, index, i64 -> tensor<?xi64>
  %rows = ad.unsqueeze %pos dim 1 : tensor<?xi64> -> tensor<?x1xi64>
  %cols = ad.unsqueeze %pos dim 0 : tensor<?xi64> -> tensor<1x?xi64>
  %w = ad.constant 4 : i64
  %lo = ad.sub %rows, %w : tensor<?x1xi64>, i64 -> tensor<?x1xi64>
  %near = ad.gt %cols, %lo : tensor<1x?xi64>, tensor<?x1xi64> -> tensor<?x?xi1>
  %causal = ad.le %cols, %rows : tensor<1x?xi64>, tensor<?x1xi64> -> tensor<?x?xi1>
  %allowed = ad.logical_and %causal, %near : tensor<?x?xi1>, tensor<?x?xi1> -> tensor<?x?xi1>
  %m3 = ad.unsqueeze %allowed dim 0 : tensor<?x?xi1> -> tensor<1x?x?xi1>
  %mask = ad.unsqueeze %m3 dim 0 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %cu = ad.unsqueeze %cos dim 1 : tensor<1x?x32xf32> -> tensor<1x1x?x32xf32>
  %su = ad.unsqueeze %sin dim 1 : tensor<1x?x32xf32> -> tensor<1x1x?x32xf32>
  %qc = ad.mul %q, %cu : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %q1 = ad.slice %q dim 3 [0, 16, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %q2 = ad.slice %q dim 3 [16, 32, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %qn = ad.neg %q2 : tensor<1x2x?x16xf32> -> tensor<1x2x?x16xf32>
  %qr = ad.cat %qn, %q1 dim -1 : (tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>) -> tensor<1x2x?x32xf32>
  %qs = ad.mul %qr, %su : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %qe = ad.add %qc, %qs : tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32> -> tensor<1x2x?x32xf32>
  %kc = ad.mul %k, %cu : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %k1 = ad.slice %k dim 3 [0, 16, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %k2 = ad.slice %k dim 3 [16, 32, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %kn = ad.neg %k2 : tensor<1x2x?x16xf32> -> tensor<1x2x?x16xf32>
  %kr = ad.cat %kn, %k1 dim -1 : (tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>) -> tensor<1x2x?x32xf32>
  %ks = ad.mul %kr, %su : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %ke = ad.add %kc, %ks : tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32> -> tensor<1x2x?x32xf32>
  %o = ad.attention %qe, %ke, %v mask %mask scale 0.125 : f64 : (tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x1x?x?xi1>) -> tensor<1x2x?x32xf32>
  func.return %o : tensor<1x2x?x32xf32>
}

// -----

// The same window as an additive float mask (0 / -inf, as eager attention adds it): the
// template takes no float mask, but it needs none.
// CHECK-LABEL: func.func @additive_window
// CHECK-NEXT:    %[[O:.*]] = ad.rope_attention %q, %k, %v rope %cos, %sin causal window 4 scale 1.250000e-01 :
// CHECK-NEXT:    func.return %[[O]]
func.func @additive_window(%q: tensor<1x2x?x32xf32>, %k: tensor<1x2x?x32xf32>, %v: tensor<1x2x?x32xf32>, %cos: tensor<1x?x32xf32>, %sin: tensor<1x?x32xf32>, %input_ids: tensor<1x?xi64> {ad.input = "input_ids"}) -> tensor<1x2x?x32xf32> {
  %n = ad.sym_size %input_ids dim 1 : tensor<1x?xi64>
  %c0 = ad.constant 0 : i64
  %c1 = ad.constant 1 : i64
  %pos = ad.arange %c0, %n, %c1 : i64, index, i64 -> tensor<?xi64>
  %rows = ad.unsqueeze %pos dim 1 : tensor<?xi64> -> tensor<?x1xi64>
  %cols = ad.unsqueeze %pos dim 0 : tensor<?xi64> -> tensor<1x?xi64>
  %w = ad.constant 4 : i64
  %lo = ad.sub %rows, %w : tensor<?x1xi64>, i64 -> tensor<?x1xi64>
  %near = ad.gt %cols, %lo : tensor<1x?xi64>, tensor<?x1xi64> -> tensor<?x?xi1>
  %causal = ad.le %cols, %rows : tensor<1x?xi64>, tensor<?x1xi64> -> tensor<?x?xi1>
  %allowed = ad.logical_and %causal, %near : tensor<?x?xi1>, tensor<?x?xi1> -> tensor<?x?xi1>
  %m3 = ad.unsqueeze %allowed dim 0 : tensor<?x?xi1> -> tensor<1x?x?xi1>
  %mb = ad.unsqueeze %m3 dim 0 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %zero = ad.constant 0.000000e+00 : f64
  %ninf = ad.constant 0xFFF0000000000000 : f64
  %mask = ad.where %mb, %zero, %ninf : tensor<1x1x?x?xi1>, f64, f64 -> tensor<1x1x?x?xf32>
  %cu = ad.unsqueeze %cos dim 1 : tensor<1x?x32xf32> -> tensor<1x1x?x32xf32>
  %su = ad.unsqueeze %sin dim 1 : tensor<1x?x32xf32> -> tensor<1x1x?x32xf32>
  %qc = ad.mul %q, %cu : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %q1 = ad.slice %q dim 3 [0, 16, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %q2 = ad.slice %q dim 3 [16, 32, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %qn = ad.neg %q2 : tensor<1x2x?x16xf32> -> tensor<1x2x?x16xf32>
  %qr = ad.cat %qn, %q1 dim -1 : (tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>) -> tensor<1x2x?x32xf32>
  %qs = ad.mul %qr, %su : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %qe = ad.add %qc, %qs : tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32> -> tensor<1x2x?x32xf32>
  %kc = ad.mul %k, %cu : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %k1 = ad.slice %k dim 3 [0, 16, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %k2 = ad.slice %k dim 3 [16, 32, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %kn = ad.neg %k2 : tensor<1x2x?x16xf32> -> tensor<1x2x?x16xf32>
  %kr = ad.cat %kn, %k1 dim -1 : (tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>) -> tensor<1x2x?x32xf32>
  %ks = ad.mul %kr, %su : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %ke = ad.add %kc, %ks : tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32> -> tensor<1x2x?x32xf32>
  %o = ad.attention %qe, %ke, %v mask %mask scale 0.125 : f64 : (tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x1x?x?xf32>) -> tensor<1x2x?x32xf32>
  func.return %o : tensor<1x2x?x32xf32>
}

// -----

// A causal mask computed from a position_ids input stays an operand: the graph may be given
// positions that are not 0 .. seq-1 (packed sequences), where HF's mask is not causal.
// CHECK-LABEL: func.func @from_position_ids
// CHECK:         %allowed = ad.le %cols, %rows
// CHECK:         ad.rope_attention %q, %k, %v rope %cos, %sin mask %mask scale 1.250000e-01 :
func.func @from_position_ids(%q: tensor<1x2x?x32xf32>, %k: tensor<1x2x?x32xf32>, %v: tensor<1x2x?x32xf32>, %cos: tensor<1x?x32xf32>, %sin: tensor<1x?x32xf32>, %position_ids: tensor<1x?xi64> {ad.input = "position_ids"}) -> tensor<1x2x?x32xf32> {
  %pos = ad.squeeze %position_ids dim [0] : tensor<1x?xi64> -> tensor<?xi64>
  %rows = ad.unsqueeze %pos dim 1 : tensor<?xi64> -> tensor<?x1xi64>
  %cols = ad.unsqueeze %pos dim 0 : tensor<?xi64> -> tensor<1x?xi64>
  %allowed = ad.le %cols, %rows : tensor<1x?xi64>, tensor<?x1xi64> -> tensor<?x?xi1>
  %m3 = ad.unsqueeze %allowed dim 0 : tensor<?x?xi1> -> tensor<1x?x?xi1>
  %mask = ad.unsqueeze %m3 dim 0 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %cu = ad.unsqueeze %cos dim 1 : tensor<1x?x32xf32> -> tensor<1x1x?x32xf32>
  %su = ad.unsqueeze %sin dim 1 : tensor<1x?x32xf32> -> tensor<1x1x?x32xf32>
  %qc = ad.mul %q, %cu : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %q1 = ad.slice %q dim 3 [0, 16, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %q2 = ad.slice %q dim 3 [16, 32, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %qn = ad.neg %q2 : tensor<1x2x?x16xf32> -> tensor<1x2x?x16xf32>
  %qr = ad.cat %qn, %q1 dim -1 : (tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>) -> tensor<1x2x?x32xf32>
  %qs = ad.mul %qr, %su : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %qe = ad.add %qc, %qs : tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32> -> tensor<1x2x?x32xf32>
  %kc = ad.mul %k, %cu : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %k1 = ad.slice %k dim 3 [0, 16, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %k2 = ad.slice %k dim 3 [16, 32, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %kn = ad.neg %k2 : tensor<1x2x?x16xf32> -> tensor<1x2x?x16xf32>
  %kr = ad.cat %kn, %k1 dim -1 : (tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>) -> tensor<1x2x?x32xf32>
  %ks = ad.mul %kr, %su : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %ke = ad.add %kc, %ks : tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32> -> tensor<1x2x?x32xf32>
  %o = ad.attention %qe, %ke, %v mask %mask scale 0.125 : f64 : (tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x1x?x?xi1>) -> tensor<1x2x?x32xf32>
  func.return %o : tensor<1x2x?x32xf32>
}

// -----

// Neither causal nor a window (keys more than 4 back only): the mask stays an operand.
// CHECK-LABEL: func.func @not_causal
// CHECK:         %allowed = ad.logical_not %near
// CHECK:         ad.rope_attention %q, %k, %v rope %cos, %sin mask %mask scale 1.250000e-01 :
func.func @not_causal(%q: tensor<1x2x?x32xf32>, %k: tensor<1x2x?x32xf32>, %v: tensor<1x2x?x32xf32>, %cos: tensor<1x?x32xf32>, %sin: tensor<1x?x32xf32>, %input_ids: tensor<1x?xi64> {ad.input = "input_ids"}) -> tensor<1x2x?x32xf32> {
  %n = ad.sym_size %input_ids dim 1 : tensor<1x?xi64>
  %c0 = ad.constant 0 : i64
  %c1 = ad.constant 1 : i64
  %pos = ad.arange %c0, %n, %c1 : i64, index, i64 -> tensor<?xi64>
  %rows = ad.unsqueeze %pos dim 1 : tensor<?xi64> -> tensor<?x1xi64>
  %cols = ad.unsqueeze %pos dim 0 : tensor<?xi64> -> tensor<1x?xi64>
  %w = ad.constant 4 : i64
  %lo = ad.sub %rows, %w : tensor<?x1xi64>, i64 -> tensor<?x1xi64>
  %near = ad.gt %cols, %lo : tensor<1x?xi64>, tensor<?x1xi64> -> tensor<?x?xi1>
  %allowed = ad.logical_not %near : tensor<?x?xi1> -> tensor<?x?xi1>
  %m3 = ad.unsqueeze %allowed dim 0 : tensor<?x?xi1> -> tensor<1x?x?xi1>
  %mask = ad.unsqueeze %m3 dim 0 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %cu = ad.unsqueeze %cos dim 1 : tensor<1x?x32xf32> -> tensor<1x1x?x32xf32>
  %su = ad.unsqueeze %sin dim 1 : tensor<1x?x32xf32> -> tensor<1x1x?x32xf32>
  %qc = ad.mul %q, %cu : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %q1 = ad.slice %q dim 3 [0, 16, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %q2 = ad.slice %q dim 3 [16, 32, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %qn = ad.neg %q2 : tensor<1x2x?x16xf32> -> tensor<1x2x?x16xf32>
  %qr = ad.cat %qn, %q1 dim -1 : (tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>) -> tensor<1x2x?x32xf32>
  %qs = ad.mul %qr, %su : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %qe = ad.add %qc, %qs : tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32> -> tensor<1x2x?x32xf32>
  %kc = ad.mul %k, %cu : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %k1 = ad.slice %k dim 3 [0, 16, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %k2 = ad.slice %k dim 3 [16, 32, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %kn = ad.neg %k2 : tensor<1x2x?x16xf32> -> tensor<1x2x?x16xf32>
  %kr = ad.cat %kn, %k1 dim -1 : (tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>) -> tensor<1x2x?x32xf32>
  %ks = ad.mul %kr, %su : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %ke = ad.add %kc, %ks : tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32> -> tensor<1x2x?x32xf32>
  %o = ad.attention %qe, %ke, %v mask %mask scale 0.125 : f64 : (tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x1x?x?xi1>) -> tensor<1x2x?x32xf32>
  func.return %o : tensor<1x2x?x32xf32>
}

// -----

// A window of 100000 keys would show only in a mask of 100064 x 100064 values: the mask is not
// evaluated and stays an operand (a window that long can matter only past 100000 tokens, where
// causal masking alone would be wrong).
// CHECK-LABEL: func.func @window_too_long_to_evaluate
// CHECK:         %w = ad.constant 100000 : i64
// CHECK:         ad.rope_attention %q, %k, %v rope %cos, %sin mask %mask scale 1.250000e-01 :
func.func @window_too_long_to_evaluate(%q: tensor<1x2x?x32xf32>, %k: tensor<1x2x?x32xf32>, %v: tensor<1x2x?x32xf32>, %cos: tensor<1x?x32xf32>, %sin: tensor<1x?x32xf32>, %input_ids: tensor<1x?xi64> {ad.input = "input_ids"}) -> tensor<1x2x?x32xf32> {
  %n = ad.sym_size %input_ids dim 1 : tensor<1x?xi64>
  %c0 = ad.constant 0 : i64
  %c1 = ad.constant 1 : i64
  %pos = ad.arange %c0, %n, %c1 : i64, index, i64 -> tensor<?xi64>
  %rows = ad.unsqueeze %pos dim 1 : tensor<?xi64> -> tensor<?x1xi64>
  %cols = ad.unsqueeze %pos dim 0 : tensor<?xi64> -> tensor<1x?xi64>
  %w = ad.constant 100000 : i64
  %lo = ad.sub %rows, %w : tensor<?x1xi64>, i64 -> tensor<?x1xi64>
  %near = ad.gt %cols, %lo : tensor<1x?xi64>, tensor<?x1xi64> -> tensor<?x?xi1>
  %causal = ad.le %cols, %rows : tensor<1x?xi64>, tensor<?x1xi64> -> tensor<?x?xi1>
  %allowed = ad.logical_and %causal, %near : tensor<?x?xi1>, tensor<?x?xi1> -> tensor<?x?xi1>
  %m3 = ad.unsqueeze %allowed dim 0 : tensor<?x?xi1> -> tensor<1x?x?xi1>
  %mask = ad.unsqueeze %m3 dim 0 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %cu = ad.unsqueeze %cos dim 1 : tensor<1x?x32xf32> -> tensor<1x1x?x32xf32>
  %su = ad.unsqueeze %sin dim 1 : tensor<1x?x32xf32> -> tensor<1x1x?x32xf32>
  %qc = ad.mul %q, %cu : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %q1 = ad.slice %q dim 3 [0, 16, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %q2 = ad.slice %q dim 3 [16, 32, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %qn = ad.neg %q2 : tensor<1x2x?x16xf32> -> tensor<1x2x?x16xf32>
  %qr = ad.cat %qn, %q1 dim -1 : (tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>) -> tensor<1x2x?x32xf32>
  %qs = ad.mul %qr, %su : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %qe = ad.add %qc, %qs : tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32> -> tensor<1x2x?x32xf32>
  %kc = ad.mul %k, %cu : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %k1 = ad.slice %k dim 3 [0, 16, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %k2 = ad.slice %k dim 3 [16, 32, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %kn = ad.neg %k2 : tensor<1x2x?x16xf32> -> tensor<1x2x?x16xf32>
  %kr = ad.cat %kn, %k1 dim -1 : (tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>) -> tensor<1x2x?x32xf32>
  %ks = ad.mul %kr, %su : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %ke = ad.add %kc, %ks : tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32> -> tensor<1x2x?x32xf32>
  %o = ad.attention %qe, %ke, %v mask %mask scale 0.125 : f64 : (tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x1x?x?xi1>) -> tensor<1x2x?x32xf32>
  func.return %o : tensor<1x2x?x32xf32>
}

// -----

// HF's eager soft-capped attention (Gemma2, bf16): RoPE on q and k, repeat_kv of k and v, the
// scores scaled, soft-capped (x / 50, tanh, * 50), plus an additive sliding-window mask (0 / the
// dtype's lowest) computed from the input ids' positions, softmax in f32 cast back, times v:
// one rope_attention with `softcap` and `window`; the chain and the mask are gone.
// CHECK-LABEL: func.func @gemma2_eager
// CHECK-NEXT:    %[[O:.*]] = ad.rope_attention %q, %k, %v rope %cos, %sin causal window 4 softcap 5.000000e+01 scale 6.250000e-02 : (tensor<1x2x?x32xbf16>, tensor<1x1x?x32xbf16>, tensor<1x1x?x32xbf16>, tensor<1x?x32xbf16>, tensor<1x?x32xbf16>) -> tensor<1x2x?x32xbf16>
// CHECK-NEXT:    func.return %[[O]]
func.func @gemma2_eager(%q: tensor<1x2x?x32xbf16>, %k: tensor<1x1x?x32xbf16>, %v: tensor<1x1x?x32xbf16>, %cos: tensor<1x?x32xbf16>, %sin: tensor<1x?x32xbf16>, %input_ids: tensor<1x?xi64> {ad.input = "input_ids"}) -> tensor<1x2x?x32xbf16> {
  %n = ad.sym_size %input_ids dim 1 : tensor<1x?xi64>
  %c0 = ad.constant 0 : i64
  %c1 = ad.constant 1 : i64
  %pos = ad.arange %c0, %n, %c1 : i64, index, i64 -> tensor<?xi64>
  %rows = ad.unsqueeze %pos dim 1 : tensor<?xi64> -> tensor<?x1xi64>
  %cols = ad.unsqueeze %pos dim 0 : tensor<?xi64> -> tensor<1x?xi64>
  %w = ad.constant 4 : i64
  %lo = ad.sub %rows, %w : tensor<?x1xi64>, i64 -> tensor<?x1xi64>
  %near = ad.gt %cols, %lo : tensor<1x?xi64>, tensor<?x1xi64> -> tensor<?x?xi1>
  %causal = ad.le %cols, %rows : tensor<1x?xi64>, tensor<?x1xi64> -> tensor<?x?xi1>
  %allowed = ad.logical_and %causal, %near : tensor<?x?xi1>, tensor<?x?xi1> -> tensor<?x?xi1>
  %m3 = ad.unsqueeze %allowed dim 0 : tensor<?x?xi1> -> tensor<1x?x?xi1>
  %mb = ad.unsqueeze %m3 dim 0 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %zero = ad.constant 0.000000e+00 : f64
  %lowest = ad.constant -3.3895313892515355e+38 : f64
  %mask = ad.where %mb, %zero, %lowest : tensor<1x1x?x?xi1>, f64, f64 -> tensor<1x1x?x?xbf16>
  %cu = ad.unsqueeze %cos dim 1 : tensor<1x?x32xbf16> -> tensor<1x1x?x32xbf16>
  %su = ad.unsqueeze %sin dim 1 : tensor<1x?x32xbf16> -> tensor<1x1x?x32xbf16>
  %qc = ad.mul %q, %cu : tensor<1x2x?x32xbf16>, tensor<1x1x?x32xbf16> -> tensor<1x2x?x32xbf16>
  %q1 = ad.slice %q dim 3 [0, 16, 1] : tensor<1x2x?x32xbf16> -> tensor<1x2x?x16xbf16>
  %q2 = ad.slice %q dim 3 [16, 32, 1] : tensor<1x2x?x32xbf16> -> tensor<1x2x?x16xbf16>
  %qn = ad.neg %q2 : tensor<1x2x?x16xbf16> -> tensor<1x2x?x16xbf16>
  %qr = ad.cat %qn, %q1 dim -1 : (tensor<1x2x?x16xbf16>, tensor<1x2x?x16xbf16>) -> tensor<1x2x?x32xbf16>
  %qs = ad.mul %qr, %su : tensor<1x2x?x32xbf16>, tensor<1x1x?x32xbf16> -> tensor<1x2x?x32xbf16>
  %qe = ad.add %qc, %qs : tensor<1x2x?x32xbf16>, tensor<1x2x?x32xbf16> -> tensor<1x2x?x32xbf16>
  %kc = ad.mul %k, %cu : tensor<1x1x?x32xbf16>, tensor<1x1x?x32xbf16> -> tensor<1x1x?x32xbf16>
  %k1 = ad.slice %k dim 3 [0, 16, 1] : tensor<1x1x?x32xbf16> -> tensor<1x1x?x16xbf16>
  %k2 = ad.slice %k dim 3 [16, 32, 1] : tensor<1x1x?x32xbf16> -> tensor<1x1x?x16xbf16>
  %kn = ad.neg %k2 : tensor<1x1x?x16xbf16> -> tensor<1x1x?x16xbf16>
  %kr = ad.cat %kn, %k1 dim -1 : (tensor<1x1x?x16xbf16>, tensor<1x1x?x16xbf16>) -> tensor<1x1x?x32xbf16>
  %ks = ad.mul %kr, %su : tensor<1x1x?x32xbf16>, tensor<1x1x?x32xbf16> -> tensor<1x1x?x32xbf16>
  %ke = ad.add %kc, %ks : tensor<1x1x?x32xbf16>, tensor<1x1x?x32xbf16> -> tensor<1x1x?x32xbf16>
  %ku = ad.unsqueeze %ke dim 2 : tensor<1x1x?x32xbf16> -> tensor<1x1x1x?x32xbf16>
  %kx = ad.expand %ku [1, 1, 2, %n, 32] : tensor<1x1x1x?x32xbf16> -> tensor<1x1x2x?x32xbf16>
  %krep = ad.reshape %kx [1, 2, %n, 32] : tensor<1x1x2x?x32xbf16> -> tensor<1x2x?x32xbf16>
  %vu = ad.unsqueeze %v dim 2 : tensor<1x1x?x32xbf16> -> tensor<1x1x1x?x32xbf16>
  %vx = ad.expand %vu [1, 1, 2, %n, 32] : tensor<1x1x1x?x32xbf16> -> tensor<1x1x2x?x32xbf16>
  %vrep = ad.reshape %vx [1, 2, %n, 32] : tensor<1x1x2x?x32xbf16> -> tensor<1x2x?x32xbf16>
  %kt = ad.transpose %krep 2, 3 : tensor<1x2x?x32xbf16> -> tensor<1x2x32x?xbf16>
  %s = ad.matmul %qe, %kt : (tensor<1x2x?x32xbf16>, tensor<1x2x32x?xbf16>) -> tensor<1x2x?x?xbf16>
  %scaling = ad.constant 6.250000e-02 : f64
  %scaled = ad.mul %s, %scaling : tensor<1x2x?x?xbf16>, f64 -> tensor<1x2x?x?xbf16>
  %cap = ad.constant 5.000000e+01 : f64
  %d = ad.div %scaled, %cap : tensor<1x2x?x?xbf16>, f64 -> tensor<1x2x?x?xbf16>
  %t = ad.tanh %d : tensor<1x2x?x?xbf16> -> tensor<1x2x?x?xbf16>
  %capped = ad.mul %t, %cap : tensor<1x2x?x?xbf16>, f64 -> tensor<1x2x?x?xbf16>
  %masked = ad.add %capped, %mask : tensor<1x2x?x?xbf16>, tensor<1x1x?x?xbf16> -> tensor<1x2x?x?xbf16>
  %p = ad.softmax %masked dim -1 dtype f32 : tensor<1x2x?x?xbf16> -> tensor<1x2x?x?xf32>
  %pc = ad.cast %p : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xbf16>
  %o = ad.matmul %pc, %vrep : (tensor<1x2x?x?xbf16>, tensor<1x2x?x32xbf16>) -> tensor<1x2x?x32xbf16>
  func.return %o : tensor<1x2x?x32xbf16>
}

// -----

// The same after optimize-rope (q and k rotated by one ad.rope): the op applies that RoPE.
// CHECK-LABEL: func.func @gemma2_eager_after_optimize_rope
// CHECK-NEXT:    %[[O:.*]] = ad.rope_attention %q, %k, %v rope %cos, %sin causal window 4 softcap 5.000000e+01 scale 6.250000e-02 :
// CHECK-NEXT:    func.return %[[O]]
func.func @gemma2_eager_after_optimize_rope(%q: tensor<1x2x?x32xbf16>, %k: tensor<1x1x?x32xbf16>, %v: tensor<1x1x?x32xbf16>, %cos: tensor<1x?x32xbf16>, %sin: tensor<1x?x32xbf16>, %input_ids: tensor<1x?xi64> {ad.input = "input_ids"}) -> tensor<1x2x?x32xbf16> {
  %n = ad.sym_size %input_ids dim 1 : tensor<1x?xi64>
  %c0 = ad.constant 0 : i64
  %c1 = ad.constant 1 : i64
  %pos = ad.arange %c0, %n, %c1 : i64, index, i64 -> tensor<?xi64>
  %rows = ad.unsqueeze %pos dim 1 : tensor<?xi64> -> tensor<?x1xi64>
  %cols = ad.unsqueeze %pos dim 0 : tensor<?xi64> -> tensor<1x?xi64>
  %w = ad.constant 4 : i64
  %lo = ad.sub %rows, %w : tensor<?x1xi64>, i64 -> tensor<?x1xi64>
  %near = ad.gt %cols, %lo : tensor<1x?xi64>, tensor<?x1xi64> -> tensor<?x?xi1>
  %causal = ad.le %cols, %rows : tensor<1x?xi64>, tensor<?x1xi64> -> tensor<?x?xi1>
  %allowed = ad.logical_and %causal, %near : tensor<?x?xi1>, tensor<?x?xi1> -> tensor<?x?xi1>
  %m3 = ad.unsqueeze %allowed dim 0 : tensor<?x?xi1> -> tensor<1x?x?xi1>
  %mb = ad.unsqueeze %m3 dim 0 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %zero = ad.constant 0.000000e+00 : f64
  %lowest = ad.constant -3.3895313892515355e+38 : f64
  %mask = ad.where %mb, %zero, %lowest : tensor<1x1x?x?xi1>, f64, f64 -> tensor<1x1x?x?xbf16>
  %qe, %ke = ad.rope %q, %k rope %cos, %sin : (tensor<1x2x?x32xbf16>, tensor<1x1x?x32xbf16>, tensor<1x?x32xbf16>, tensor<1x?x32xbf16>) -> (tensor<1x2x?x32xbf16>, tensor<1x1x?x32xbf16>)
  %ku = ad.unsqueeze %ke dim 2 : tensor<1x1x?x32xbf16> -> tensor<1x1x1x?x32xbf16>
  %kx = ad.expand %ku [1, 1, 2, %n, 32] : tensor<1x1x1x?x32xbf16> -> tensor<1x1x2x?x32xbf16>
  %krep = ad.reshape %kx [1, 2, %n, 32] : tensor<1x1x2x?x32xbf16> -> tensor<1x2x?x32xbf16>
  %vu = ad.unsqueeze %v dim 2 : tensor<1x1x?x32xbf16> -> tensor<1x1x1x?x32xbf16>
  %vx = ad.expand %vu [1, 1, 2, %n, 32] : tensor<1x1x1x?x32xbf16> -> tensor<1x1x2x?x32xbf16>
  %vrep = ad.reshape %vx [1, 2, %n, 32] : tensor<1x1x2x?x32xbf16> -> tensor<1x2x?x32xbf16>
  %kt = ad.transpose %krep 2, 3 : tensor<1x2x?x32xbf16> -> tensor<1x2x32x?xbf16>
  %s = ad.matmul %qe, %kt : (tensor<1x2x?x32xbf16>, tensor<1x2x32x?xbf16>) -> tensor<1x2x?x?xbf16>
  %scaling = ad.constant 6.250000e-02 : f64
  %scaled = ad.mul %s, %scaling : tensor<1x2x?x?xbf16>, f64 -> tensor<1x2x?x?xbf16>
  %cap = ad.constant 5.000000e+01 : f64
  %d = ad.div %scaled, %cap : tensor<1x2x?x?xbf16>, f64 -> tensor<1x2x?x?xbf16>
  %t = ad.tanh %d : tensor<1x2x?x?xbf16> -> tensor<1x2x?x?xbf16>
  %capped = ad.mul %t, %cap : tensor<1x2x?x?xbf16>, f64 -> tensor<1x2x?x?xbf16>
  %masked = ad.add %capped, %mask : tensor<1x2x?x?xbf16>, tensor<1x1x?x?xbf16> -> tensor<1x2x?x?xbf16>
  %p = ad.softmax %masked dim -1 dtype f32 : tensor<1x2x?x?xbf16> -> tensor<1x2x?x?xf32>
  %pc = ad.cast %p : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xbf16>
  %o = ad.matmul %pc, %vrep : (tensor<1x2x?x?xbf16>, tensor<1x2x?x32xbf16>) -> tensor<1x2x?x32xbf16>
  func.return %o : tensor<1x2x?x32xbf16>
}

// -----

// The mask comes from a position_ids input: it cannot be dropped, and the template takes no
// additive mask, so the eager chain stays (insert-cached-attention takes it for generation).
// CHECK-LABEL: func.func @gemma2_eager_mask_from_position_ids
// CHECK-NOT:     ad.rope_attention
// CHECK:         %t = ad.tanh %d
// CHECK:         %p = ad.softmax %masked
// CHECK:         %o = ad.matmul %pc, %vrep
func.func @gemma2_eager_mask_from_position_ids(%q: tensor<1x2x?x32xbf16>, %k: tensor<1x1x?x32xbf16>, %v: tensor<1x1x?x32xbf16>, %cos: tensor<1x?x32xbf16>, %sin: tensor<1x?x32xbf16>, %position_ids: tensor<1x?xi64> {ad.input = "position_ids"}) -> tensor<1x2x?x32xbf16> {
  %pos = ad.squeeze %position_ids dim [0] : tensor<1x?xi64> -> tensor<?xi64>
  %n = ad.sym_size %position_ids dim 1 : tensor<1x?xi64>
  %rows = ad.unsqueeze %pos dim 1 : tensor<?xi64> -> tensor<?x1xi64>
  %cols = ad.unsqueeze %pos dim 0 : tensor<?xi64> -> tensor<1x?xi64>
  %w = ad.constant 4 : i64
  %lo = ad.sub %rows, %w : tensor<?x1xi64>, i64 -> tensor<?x1xi64>
  %near = ad.gt %cols, %lo : tensor<1x?xi64>, tensor<?x1xi64> -> tensor<?x?xi1>
  %causal = ad.le %cols, %rows : tensor<1x?xi64>, tensor<?x1xi64> -> tensor<?x?xi1>
  %allowed = ad.logical_and %causal, %near : tensor<?x?xi1>, tensor<?x?xi1> -> tensor<?x?xi1>
  %m3 = ad.unsqueeze %allowed dim 0 : tensor<?x?xi1> -> tensor<1x?x?xi1>
  %mb = ad.unsqueeze %m3 dim 0 : tensor<1x?x?xi1> -> tensor<1x1x?x?xi1>
  %zero = ad.constant 0.000000e+00 : f64
  %lowest = ad.constant -3.3895313892515355e+38 : f64
  %mask = ad.where %mb, %zero, %lowest : tensor<1x1x?x?xi1>, f64, f64 -> tensor<1x1x?x?xbf16>
  %cu = ad.unsqueeze %cos dim 1 : tensor<1x?x32xbf16> -> tensor<1x1x?x32xbf16>
  %su = ad.unsqueeze %sin dim 1 : tensor<1x?x32xbf16> -> tensor<1x1x?x32xbf16>
  %qc = ad.mul %q, %cu : tensor<1x2x?x32xbf16>, tensor<1x1x?x32xbf16> -> tensor<1x2x?x32xbf16>
  %q1 = ad.slice %q dim 3 [0, 16, 1] : tensor<1x2x?x32xbf16> -> tensor<1x2x?x16xbf16>
  %q2 = ad.slice %q dim 3 [16, 32, 1] : tensor<1x2x?x32xbf16> -> tensor<1x2x?x16xbf16>
  %qn = ad.neg %q2 : tensor<1x2x?x16xbf16> -> tensor<1x2x?x16xbf16>
  %qr = ad.cat %qn, %q1 dim -1 : (tensor<1x2x?x16xbf16>, tensor<1x2x?x16xbf16>) -> tensor<1x2x?x32xbf16>
  %qs = ad.mul %qr, %su : tensor<1x2x?x32xbf16>, tensor<1x1x?x32xbf16> -> tensor<1x2x?x32xbf16>
  %qe = ad.add %qc, %qs : tensor<1x2x?x32xbf16>, tensor<1x2x?x32xbf16> -> tensor<1x2x?x32xbf16>
  %kc = ad.mul %k, %cu : tensor<1x1x?x32xbf16>, tensor<1x1x?x32xbf16> -> tensor<1x1x?x32xbf16>
  %k1 = ad.slice %k dim 3 [0, 16, 1] : tensor<1x1x?x32xbf16> -> tensor<1x1x?x16xbf16>
  %k2 = ad.slice %k dim 3 [16, 32, 1] : tensor<1x1x?x32xbf16> -> tensor<1x1x?x16xbf16>
  %kn = ad.neg %k2 : tensor<1x1x?x16xbf16> -> tensor<1x1x?x16xbf16>
  %kr = ad.cat %kn, %k1 dim -1 : (tensor<1x1x?x16xbf16>, tensor<1x1x?x16xbf16>) -> tensor<1x1x?x32xbf16>
  %ks = ad.mul %kr, %su : tensor<1x1x?x32xbf16>, tensor<1x1x?x32xbf16> -> tensor<1x1x?x32xbf16>
  %ke = ad.add %kc, %ks : tensor<1x1x?x32xbf16>, tensor<1x1x?x32xbf16> -> tensor<1x1x?x32xbf16>
  %ku = ad.unsqueeze %ke dim 2 : tensor<1x1x?x32xbf16> -> tensor<1x1x1x?x32xbf16>
  %kx = ad.expand %ku [1, 1, 2, %n, 32] : tensor<1x1x1x?x32xbf16> -> tensor<1x1x2x?x32xbf16>
  %krep = ad.reshape %kx [1, 2, %n, 32] : tensor<1x1x2x?x32xbf16> -> tensor<1x2x?x32xbf16>
  %vu = ad.unsqueeze %v dim 2 : tensor<1x1x?x32xbf16> -> tensor<1x1x1x?x32xbf16>
  %vx = ad.expand %vu [1, 1, 2, %n, 32] : tensor<1x1x1x?x32xbf16> -> tensor<1x1x2x?x32xbf16>
  %vrep = ad.reshape %vx [1, 2, %n, 32] : tensor<1x1x2x?x32xbf16> -> tensor<1x2x?x32xbf16>
  %kt = ad.transpose %krep 2, 3 : tensor<1x2x?x32xbf16> -> tensor<1x2x32x?xbf16>
  %s = ad.matmul %qe, %kt : (tensor<1x2x?x32xbf16>, tensor<1x2x32x?xbf16>) -> tensor<1x2x?x?xbf16>
  %scaling = ad.constant 6.250000e-02 : f64
  %scaled = ad.mul %s, %scaling : tensor<1x2x?x?xbf16>, f64 -> tensor<1x2x?x?xbf16>
  %cap = ad.constant 5.000000e+01 : f64
  %d = ad.div %scaled, %cap : tensor<1x2x?x?xbf16>, f64 -> tensor<1x2x?x?xbf16>
  %t = ad.tanh %d : tensor<1x2x?x?xbf16> -> tensor<1x2x?x?xbf16>
  %capped = ad.mul %t, %cap : tensor<1x2x?x?xbf16>, f64 -> tensor<1x2x?x?xbf16>
  %masked = ad.add %capped, %mask : tensor<1x2x?x?xbf16>, tensor<1x1x?x?xbf16> -> tensor<1x2x?x?xbf16>
  %p = ad.softmax %masked dim -1 dtype f32 : tensor<1x2x?x?xbf16> -> tensor<1x2x?x?xf32>
  %pc = ad.cast %p : tensor<1x2x?x?xf32> -> tensor<1x2x?x?xbf16>
  %o = ad.matmul %pc, %vrep : (tensor<1x2x?x?xbf16>, tensor<1x2x?x32xbf16>) -> tensor<1x2x?x32xbf16>
  func.return %o : tensor<1x2x?x32xbf16>
}

// -----

// Qwen3's QK-norm: each head's RMSNorm of q and k before their transpose and RoPE. The op takes
// the un-normalized heads (transposed) and the norms' weights; the norms and RoPE chains are gone.
// CHECK-LABEL: func.func @qwen3_qk_norm
// CHECK-NEXT:    %[[Q:.*]] = ad.transpose %qp 1, 2 : tensor<1x?x2x32xf32> -> tensor<1x2x?x32xf32>
// CHECK-NEXT:    %[[K:.*]] = ad.transpose %kp 1, 2 : tensor<1x?x2x32xf32> -> tensor<1x2x?x32xf32>
// CHECK-NEXT:    %[[O:.*]] = ad.rope_attention %[[Q]], %[[K]], %v rope %cos, %sin qk_norm(%wq, %wk : tensor<32xf32>, tensor<32xf32>) eps 1.000000e-06 causal scale 1.250000e-01 : (tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x?x32xf32>, tensor<1x?x32xf32>) -> tensor<1x2x?x32xf32>
// CHECK-NEXT:    func.return %[[O]]
func.func @qwen3_qk_norm(%qp: tensor<1x?x2x32xf32>, %kp: tensor<1x?x2x32xf32>, %wq: tensor<32xf32>, %wk: tensor<32xf32>, %v: tensor<1x2x?x32xf32>, %cos: tensor<1x?x32xf32>, %sin: tensor<1x?x32xf32>) -> tensor<1x2x?x32xf32> {
  %qm = ad.rms_norm %qp weight %wq eps 1.000000e-06 : (tensor<1x?x2x32xf32>, tensor<32xf32>) -> tensor<1x?x2x32xf32>
  %qt = ad.transpose %qm 1, 2 : tensor<1x?x2x32xf32> -> tensor<1x2x?x32xf32>
  %km = ad.rms_norm %kp weight %wk eps 1.000000e-06 : (tensor<1x?x2x32xf32>, tensor<32xf32>) -> tensor<1x?x2x32xf32>
  %kt = ad.transpose %km 1, 2 : tensor<1x?x2x32xf32> -> tensor<1x2x?x32xf32>
  %cu = ad.unsqueeze %cos dim 1 : tensor<1x?x32xf32> -> tensor<1x1x?x32xf32>
  %su = ad.unsqueeze %sin dim 1 : tensor<1x?x32xf32> -> tensor<1x1x?x32xf32>
  %qc = ad.mul %qt, %cu : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %q1 = ad.slice %qt dim 3 [0, 16, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %q2 = ad.slice %qt dim 3 [16, 32, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %qn = ad.neg %q2 : tensor<1x2x?x16xf32> -> tensor<1x2x?x16xf32>
  %qr = ad.cat %qn, %q1 dim -1 : (tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>) -> tensor<1x2x?x32xf32>
  %qs = ad.mul %qr, %su : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %qe = ad.add %qc, %qs : tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32> -> tensor<1x2x?x32xf32>
  %kc = ad.mul %kt, %cu : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %k1 = ad.slice %kt dim 3 [0, 16, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %k2 = ad.slice %kt dim 3 [16, 32, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %kn = ad.neg %k2 : tensor<1x2x?x16xf32> -> tensor<1x2x?x16xf32>
  %kr = ad.cat %kn, %k1 dim -1 : (tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>) -> tensor<1x2x?x32xf32>
  %ks = ad.mul %kr, %su : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %ke = ad.add %kc, %ks : tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32> -> tensor<1x2x?x32xf32>
  %o = ad.attention %qe, %ke, %v causal scale 0.125 : f64 : (tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>) -> tensor<1x2x?x32xf32>
  func.return %o : tensor<1x2x?x32xf32>
}

// -----

// Gemma3's QK-norm: after the transpose, in the `1 + w` form (offset 1, weight in fp32).
// CHECK-LABEL: func.func @gemma3_qk_norm
// CHECK-NEXT:    %qh = ad.transpose %qp 1, 2
// CHECK-NEXT:    %kh = ad.transpose %kp 1, 2
// CHECK-NEXT:    %[[O:.*]] = ad.rope_attention %qh, %kh, %v rope %cos, %sin qk_norm(%wq, %wk : tensor<32xf32>, tensor<32xf32>) eps 1.000000e-06 offset 1.000000e+00 weight_in_fp32 causal scale 1.250000e-01 :
// CHECK-NEXT:    func.return %[[O]]
func.func @gemma3_qk_norm(%qp: tensor<1x?x2x32xf32>, %kp: tensor<1x?x2x32xf32>, %wq: tensor<32xf32>, %wk: tensor<32xf32>, %v: tensor<1x2x?x32xf32>, %cos: tensor<1x?x32xf32>, %sin: tensor<1x?x32xf32>) -> tensor<1x2x?x32xf32> {
  %qh = ad.transpose %qp 1, 2 : tensor<1x?x2x32xf32> -> tensor<1x2x?x32xf32>
  %qt = ad.rms_norm %qh weight %wq eps 1.000000e-06 offset 1.000000e+00 weight_in_fp32 : (tensor<1x2x?x32xf32>, tensor<32xf32>) -> tensor<1x2x?x32xf32>
  %kh = ad.transpose %kp 1, 2 : tensor<1x?x2x32xf32> -> tensor<1x2x?x32xf32>
  %kt = ad.rms_norm %kh weight %wk eps 1.000000e-06 offset 1.000000e+00 weight_in_fp32 : (tensor<1x2x?x32xf32>, tensor<32xf32>) -> tensor<1x2x?x32xf32>
  %cu = ad.unsqueeze %cos dim 1 : tensor<1x?x32xf32> -> tensor<1x1x?x32xf32>
  %su = ad.unsqueeze %sin dim 1 : tensor<1x?x32xf32> -> tensor<1x1x?x32xf32>
  %qc = ad.mul %qt, %cu : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %q1 = ad.slice %qt dim 3 [0, 16, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %q2 = ad.slice %qt dim 3 [16, 32, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %qn = ad.neg %q2 : tensor<1x2x?x16xf32> -> tensor<1x2x?x16xf32>
  %qr = ad.cat %qn, %q1 dim -1 : (tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>) -> tensor<1x2x?x32xf32>
  %qs = ad.mul %qr, %su : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %qe = ad.add %qc, %qs : tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32> -> tensor<1x2x?x32xf32>
  %kc = ad.mul %kt, %cu : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %k1 = ad.slice %kt dim 3 [0, 16, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %k2 = ad.slice %kt dim 3 [16, 32, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %kn = ad.neg %k2 : tensor<1x2x?x16xf32> -> tensor<1x2x?x16xf32>
  %kr = ad.cat %kn, %k1 dim -1 : (tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>) -> tensor<1x2x?x32xf32>
  %ks = ad.mul %kr, %su : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %ke = ad.add %kc, %ks : tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32> -> tensor<1x2x?x32xf32>
  %o = ad.attention %qe, %ke, %v causal scale 0.125 : f64 : (tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>) -> tensor<1x2x?x32xf32>
  func.return %o : tensor<1x2x?x32xf32>
}

// -----

// Only the query is normalized: the attention is fused, its norm stays a kernel of its own.
// CHECK-LABEL: func.func @only_the_query_normalized
// CHECK-NEXT:    %qm = ad.rms_norm %qp weight %wq
// CHECK-NEXT:    %qt = ad.transpose %qm 1, 2
// CHECK-NEXT:    %kt = ad.transpose %kp 1, 2
// CHECK-NEXT:    ad.rope_attention %qt, %kt, %v rope %cos, %sin causal scale 1.250000e-01 :
func.func @only_the_query_normalized(%qp: tensor<1x?x2x32xf32>, %kp: tensor<1x?x2x32xf32>, %wq: tensor<32xf32>, %wk: tensor<32xf32>, %v: tensor<1x2x?x32xf32>, %cos: tensor<1x?x32xf32>, %sin: tensor<1x?x32xf32>) -> tensor<1x2x?x32xf32> {
  %qm = ad.rms_norm %qp weight %wq eps 1.000000e-06 : (tensor<1x?x2x32xf32>, tensor<32xf32>) -> tensor<1x?x2x32xf32>
  %qt = ad.transpose %qm 1, 2 : tensor<1x?x2x32xf32> -> tensor<1x2x?x32xf32>
  %kt = ad.transpose %kp 1, 2 : tensor<1x?x2x32xf32> -> tensor<1x2x?x32xf32>
  %cu = ad.unsqueeze %cos dim 1 : tensor<1x?x32xf32> -> tensor<1x1x?x32xf32>
  %su = ad.unsqueeze %sin dim 1 : tensor<1x?x32xf32> -> tensor<1x1x?x32xf32>
  %qc = ad.mul %qt, %cu : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %q1 = ad.slice %qt dim 3 [0, 16, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %q2 = ad.slice %qt dim 3 [16, 32, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %qn = ad.neg %q2 : tensor<1x2x?x16xf32> -> tensor<1x2x?x16xf32>
  %qr = ad.cat %qn, %q1 dim -1 : (tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>) -> tensor<1x2x?x32xf32>
  %qs = ad.mul %qr, %su : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %qe = ad.add %qc, %qs : tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32> -> tensor<1x2x?x32xf32>
  %kc = ad.mul %kt, %cu : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %k1 = ad.slice %kt dim 3 [0, 16, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %k2 = ad.slice %kt dim 3 [16, 32, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %kn = ad.neg %k2 : tensor<1x2x?x16xf32> -> tensor<1x2x?x16xf32>
  %kr = ad.cat %kn, %k1 dim -1 : (tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>) -> tensor<1x2x?x32xf32>
  %ks = ad.mul %kr, %su : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %ke = ad.add %kc, %ks : tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32> -> tensor<1x2x?x32xf32>
  %o = ad.attention %qe, %ke, %v causal scale 0.125 : f64 : (tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>) -> tensor<1x2x?x32xf32>
  func.return %o : tensor<1x2x?x32xf32>
}

// -----

// OLMo2's QK-norm normalizes the whole q/k projection (64 values: both heads) before the head
// view: a per-head prologue cannot compute it, so the norms stay (the log says why).
// CHECK-LABEL: func.func @olmo2_projection_norm
// CHECK-NEXT:    %qm = ad.rms_norm %qflat weight %wq
// CHECK:         %km = ad.rms_norm %kflat weight %wk
// CHECK:         ad.rope_attention %qt, %kt, %v rope %cos, %sin causal scale 1.250000e-01 :
// CHECK-NOT:     qk_norm
func.func @olmo2_projection_norm(%qflat: tensor<1x?x64xf32>, %kflat: tensor<1x?x64xf32>, %n: index, %wq: tensor<64xf32>, %wk: tensor<64xf32>, %v: tensor<1x2x?x32xf32>, %cos: tensor<1x?x32xf32>, %sin: tensor<1x?x32xf32>) -> tensor<1x2x?x32xf32> {
  %qm = ad.rms_norm %qflat weight %wq eps 1.000000e-06 : (tensor<1x?x64xf32>, tensor<64xf32>) -> tensor<1x?x64xf32>
  %qp = ad.reshape %qm [1, %n, 2, 32] : tensor<1x?x64xf32> -> tensor<1x?x2x32xf32>
  %qt = ad.transpose %qp 1, 2 : tensor<1x?x2x32xf32> -> tensor<1x2x?x32xf32>
  %km = ad.rms_norm %kflat weight %wk eps 1.000000e-06 : (tensor<1x?x64xf32>, tensor<64xf32>) -> tensor<1x?x64xf32>
  %kp = ad.reshape %km [1, %n, 2, 32] : tensor<1x?x64xf32> -> tensor<1x?x2x32xf32>
  %kt = ad.transpose %kp 1, 2 : tensor<1x?x2x32xf32> -> tensor<1x2x?x32xf32>
  %cu = ad.unsqueeze %cos dim 1 : tensor<1x?x32xf32> -> tensor<1x1x?x32xf32>
  %su = ad.unsqueeze %sin dim 1 : tensor<1x?x32xf32> -> tensor<1x1x?x32xf32>
  %qc = ad.mul %qt, %cu : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %q1 = ad.slice %qt dim 3 [0, 16, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %q2 = ad.slice %qt dim 3 [16, 32, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %qn = ad.neg %q2 : tensor<1x2x?x16xf32> -> tensor<1x2x?x16xf32>
  %qr = ad.cat %qn, %q1 dim -1 : (tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>) -> tensor<1x2x?x32xf32>
  %qs = ad.mul %qr, %su : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %qe = ad.add %qc, %qs : tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32> -> tensor<1x2x?x32xf32>
  %kc = ad.mul %kt, %cu : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %k1 = ad.slice %kt dim 3 [0, 16, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %k2 = ad.slice %kt dim 3 [16, 32, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %kn = ad.neg %k2 : tensor<1x2x?x16xf32> -> tensor<1x2x?x16xf32>
  %kr = ad.cat %kn, %k1 dim -1 : (tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>) -> tensor<1x2x?x32xf32>
  %ks = ad.mul %kr, %su : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %ke = ad.add %kc, %ks : tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32> -> tensor<1x2x?x32xf32>
  %o = ad.attention %qe, %ke, %v causal scale 0.125 : f64 : (tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>) -> tensor<1x2x?x32xf32>
  func.return %o : tensor<1x2x?x32xf32>
}

// -----

// The query's and the key's norms differ in eps: the attention is fused, each norm stays a kernel
// of its own.
// CHECK-LABEL: func.func @qk_norms_of_other_eps
// CHECK-NEXT:    %qm = ad.rms_norm %qp weight %wq eps 1.000000e-06
// CHECK-NEXT:    %qt = ad.transpose %qm 1, 2
// CHECK-NEXT:    %km = ad.rms_norm %kp weight %wk eps 1.000000e-05
// CHECK-NEXT:    %kt = ad.transpose %km 1, 2
// CHECK-NEXT:    ad.rope_attention %qt, %kt, %v rope %cos, %sin causal scale 1.250000e-01 :
// CHECK-NEXT:    func.return
func.func @qk_norms_of_other_eps(%qp: tensor<1x?x2x32xf32>, %kp: tensor<1x?x2x32xf32>, %wq: tensor<32xf32>, %wk: tensor<32xf32>, %v: tensor<1x2x?x32xf32>, %cos: tensor<1x?x32xf32>, %sin: tensor<1x?x32xf32>) -> tensor<1x2x?x32xf32> {
  %qm = ad.rms_norm %qp weight %wq eps 1.000000e-06 : (tensor<1x?x2x32xf32>, tensor<32xf32>) -> tensor<1x?x2x32xf32>
  %qt = ad.transpose %qm 1, 2 : tensor<1x?x2x32xf32> -> tensor<1x2x?x32xf32>
  %km = ad.rms_norm %kp weight %wk eps 1.000000e-05 : (tensor<1x?x2x32xf32>, tensor<32xf32>) -> tensor<1x?x2x32xf32>
  %kt = ad.transpose %km 1, 2 : tensor<1x?x2x32xf32> -> tensor<1x2x?x32xf32>
  %cu = ad.unsqueeze %cos dim 1 : tensor<1x?x32xf32> -> tensor<1x1x?x32xf32>
  %su = ad.unsqueeze %sin dim 1 : tensor<1x?x32xf32> -> tensor<1x1x?x32xf32>
  %qc = ad.mul %qt, %cu : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %q1 = ad.slice %qt dim 3 [0, 16, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %q2 = ad.slice %qt dim 3 [16, 32, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %qn = ad.neg %q2 : tensor<1x2x?x16xf32> -> tensor<1x2x?x16xf32>
  %qr = ad.cat %qn, %q1 dim -1 : (tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>) -> tensor<1x2x?x32xf32>
  %qs = ad.mul %qr, %su : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %qe = ad.add %qc, %qs : tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32> -> tensor<1x2x?x32xf32>
  %kc = ad.mul %kt, %cu : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %k1 = ad.slice %kt dim 3 [0, 16, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %k2 = ad.slice %kt dim 3 [16, 32, 1] : tensor<1x2x?x32xf32> -> tensor<1x2x?x16xf32>
  %kn = ad.neg %k2 : tensor<1x2x?x16xf32> -> tensor<1x2x?x16xf32>
  %kr = ad.cat %kn, %k1 dim -1 : (tensor<1x2x?x16xf32>, tensor<1x2x?x16xf32>) -> tensor<1x2x?x32xf32>
  %ks = ad.mul %kr, %su : tensor<1x2x?x32xf32>, tensor<1x1x?x32xf32> -> tensor<1x2x?x32xf32>
  %ke = ad.add %kc, %ks : tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32> -> tensor<1x2x?x32xf32>
  %o = ad.attention %qe, %ke, %v causal scale 0.125 : f64 : (tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>, tensor<1x2x?x32xf32>) -> tensor<1x2x?x32xf32>
  func.return %o : tensor<1x2x?x32xf32>
}
