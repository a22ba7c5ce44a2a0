// optimize-rope: a query's and a key's RoPE (sharing cos/sin) that feed no SDPA become one
// ad.rope, one kernel for both.
// RUN: ad-opt %s --split-input-file -p optimize-rope | filecheck %s
// RUN: ad-opt %s --split-input-file -p optimize-rope -t triton | filecheck %s --check-prefix=KERNEL

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

// -----

// GPT-J's spelling (interleaved pairs on the first 16 of 32 dims of [b, s, h, d], then the transpose):
// one ad.rope on the transposed tensors, with the repeated tables squeezed to [b, s, 16].
// CHECK-LABEL: func.func @gptj_q_and_k
// CHECK-NOT:     ad.mul
// CHECK:         %[[CT:.*]] = ad.torch_op "aten.repeat_interleave.self_int"(%cu)
// CHECK:         %[[ST:.*]] = ad.torch_op "aten.repeat_interleave.self_int"(%su)
// CHECK-NEXT:    %[[Q:.*]] = ad.transpose %q 1, 2 : tensor<1x?x4x32xf32> -> tensor<1x4x?x32xf32>
// CHECK-NEXT:    %[[K:.*]] = ad.transpose %k 1, 2 : tensor<1x?x4x32xf32> -> tensor<1x4x?x32xf32>
// CHECK-NEXT:    %[[C:.*]] = ad.squeeze %[[CT]] dim [2] : tensor<1x?x1x16xf32> -> tensor<1x?x16xf32>
// CHECK-NEXT:    %[[S:.*]] = ad.squeeze %[[ST]] dim [2] : tensor<1x?x1x16xf32> -> tensor<1x?x16xf32>
// CHECK-NEXT:    %[[RQ:.*]], %[[RK:.*]] = ad.rope %[[Q]], %[[K]] rope %[[C]], %[[S]] interleaved : (tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>, tensor<1x?x16xf32>, tensor<1x?x16xf32>) -> (tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>)
// CHECK-NEXT:    func.return %[[RQ]], %[[RK]]
// KERNEL-LABEL: kernel 1 of 1: rope_
// KERNEL:       rotated = dims < 16
// KERNEL:       partner = dims ^ 1
func.func @gptj_q_and_k(%q: tensor<1x?x4x32xf32>, %k: tensor<1x?x4x32xf32>, %cos: tensor<1x?x8xf32>, %sin: tensor<1x?x8xf32>) -> (tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>) {
  %cu = ad.unsqueeze %cos dim 2 : tensor<1x?x8xf32> -> tensor<1x?x1x8xf32>
  %ctab = ad.torch_op "aten.repeat_interleave.self_int"(%cu) [#ad.ref<0>, 2 : i64, 3 : i64] {} : (tensor<1x?x1x8xf32>) -> tensor<1x?x1x16xf32>
  %su = ad.unsqueeze %sin dim 2 : tensor<1x?x8xf32> -> tensor<1x?x1x8xf32>
  %stab = ad.torch_op "aten.repeat_interleave.self_int"(%su) [#ad.ref<0>, 2 : i64, 3 : i64] {} : (tensor<1x?x1x8xf32>) -> tensor<1x?x1x16xf32>
  %qr = ad.slice %q dim 3 [0, 16, 1] : tensor<1x?x4x32xf32> -> tensor<1x?x4x16xf32>
  %qp = ad.slice %q dim 3 [16, 9223372036854775807, 1] : tensor<1x?x4x32xf32> -> tensor<1x?x4x16xf32>
  %qc = ad.mul %qr, %ctab : tensor<1x?x4x16xf32>, tensor<1x?x1x16xf32> -> tensor<1x?x4x16xf32>
  %qe = ad.slice %qr dim 3 [0, 9223372036854775807, 2] : tensor<1x?x4x16xf32> -> tensor<1x?x4x8xf32>
  %qo = ad.slice %qr dim 3 [1, 9223372036854775807, 2] : tensor<1x?x4x16xf32> -> tensor<1x?x4x8xf32>
  %qn = ad.neg %qo : tensor<1x?x4x8xf32> -> tensor<1x?x4x8xf32>
  %qst = ad.torch_op "aten.stack.default"(%qn, %qe) [[#ad.ref<0>, #ad.ref<1>], -1 : i64] {} : (tensor<1x?x4x8xf32>, tensor<1x?x4x8xf32>) -> tensor<1x?x4x8x2xf32>
  %qrot = ad.torch_op "aten.flatten.using_ints"(%qst) [#ad.ref<0>, -2 : i64] {} : (tensor<1x?x4x8x2xf32>) -> tensor<1x?x4x16xf32>
  %qs = ad.mul %qrot, %stab : tensor<1x?x4x16xf32>, tensor<1x?x1x16xf32> -> tensor<1x?x4x16xf32>
  %qa = ad.add %qc, %qs : tensor<1x?x4x16xf32>, tensor<1x?x4x16xf32> -> tensor<1x?x4x16xf32>
  %qcat = ad.cat %qa, %qp dim -1 : (tensor<1x?x4x16xf32>, tensor<1x?x4x16xf32>) -> tensor<1x?x4x32xf32>
  %qh = ad.transpose %qcat 1, 2 : tensor<1x?x4x32xf32> -> tensor<1x4x?x32xf32>
  %kr = ad.slice %k dim 3 [0, 16, 1] : tensor<1x?x4x32xf32> -> tensor<1x?x4x16xf32>
  %kp = ad.slice %k dim 3 [16, 9223372036854775807, 1] : tensor<1x?x4x32xf32> -> tensor<1x?x4x16xf32>
  %kc = ad.mul %kr, %ctab : tensor<1x?x4x16xf32>, tensor<1x?x1x16xf32> -> tensor<1x?x4x16xf32>
  %ke = ad.slice %kr dim 3 [0, 9223372036854775807, 2] : tensor<1x?x4x16xf32> -> tensor<1x?x4x8xf32>
  %ko = ad.slice %kr dim 3 [1, 9223372036854775807, 2] : tensor<1x?x4x16xf32> -> tensor<1x?x4x8xf32>
  %kn = ad.neg %ko : tensor<1x?x4x8xf32> -> tensor<1x?x4x8xf32>
  %kst = ad.torch_op "aten.stack.default"(%kn, %ke) [[#ad.ref<0>, #ad.ref<1>], -1 : i64] {} : (tensor<1x?x4x8xf32>, tensor<1x?x4x8xf32>) -> tensor<1x?x4x8x2xf32>
  %krot = ad.torch_op "aten.flatten.using_ints"(%kst) [#ad.ref<0>, -2 : i64] {} : (tensor<1x?x4x8x2xf32>) -> tensor<1x?x4x16xf32>
  %ks = ad.mul %krot, %stab : tensor<1x?x4x16xf32>, tensor<1x?x1x16xf32> -> tensor<1x?x4x16xf32>
  %ka = ad.add %kc, %ks : tensor<1x?x4x16xf32>, tensor<1x?x4x16xf32> -> tensor<1x?x4x16xf32>
  %kcat = ad.cat %ka, %kp dim -1 : (tensor<1x?x4x16xf32>, tensor<1x?x4x16xf32>) -> tensor<1x?x4x32xf32>
  %kh = ad.transpose %kcat 1, 2 : tensor<1x?x4x32xf32> -> tensor<1x4x?x32xf32>
  func.return %qh, %kh : tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>
}

// -----

// A near miss of partial rotary: the dims past 16 are not passed through, the first 16 are (again):
// cat(rot(x[..., :16]), x[..., :16]) has the head's type but is no rope of x.
// CHECK-LABEL: func.func @gptj_passing_the_rotated_dims_again
// CHECK-NOT:     ad.rope
// CHECK:         func.return
func.func @gptj_passing_the_rotated_dims_again(%q: tensor<1x?x4x32xf32>, %k: tensor<1x?x4x32xf32>, %cos: tensor<1x?x8xf32>, %sin: tensor<1x?x8xf32>) -> (tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>) {
  %cu = ad.unsqueeze %cos dim 2 : tensor<1x?x8xf32> -> tensor<1x?x1x8xf32>
  %ctab = ad.torch_op "aten.repeat_interleave.self_int"(%cu) [#ad.ref<0>, 2 : i64, 3 : i64] {} : (tensor<1x?x1x8xf32>) -> tensor<1x?x1x16xf32>
  %su = ad.unsqueeze %sin dim 2 : tensor<1x?x8xf32> -> tensor<1x?x1x8xf32>
  %stab = ad.torch_op "aten.repeat_interleave.self_int"(%su) [#ad.ref<0>, 2 : i64, 3 : i64] {} : (tensor<1x?x1x8xf32>) -> tensor<1x?x1x16xf32>
  %qr = ad.slice %q dim 3 [0, 16, 1] : tensor<1x?x4x32xf32> -> tensor<1x?x4x16xf32>
  %qp = ad.slice %q dim 3 [0, 16, 1] : tensor<1x?x4x32xf32> -> tensor<1x?x4x16xf32>
  %qc = ad.mul %qr, %ctab : tensor<1x?x4x16xf32>, tensor<1x?x1x16xf32> -> tensor<1x?x4x16xf32>
  %qe = ad.slice %qr dim 3 [0, 9223372036854775807, 2] : tensor<1x?x4x16xf32> -> tensor<1x?x4x8xf32>
  %qo = ad.slice %qr dim 3 [1, 9223372036854775807, 2] : tensor<1x?x4x16xf32> -> tensor<1x?x4x8xf32>
  %qn = ad.neg %qo : tensor<1x?x4x8xf32> -> tensor<1x?x4x8xf32>
  %qst = ad.torch_op "aten.stack.default"(%qn, %qe) [[#ad.ref<0>, #ad.ref<1>], -1 : i64] {} : (tensor<1x?x4x8xf32>, tensor<1x?x4x8xf32>) -> tensor<1x?x4x8x2xf32>
  %qrot = ad.torch_op "aten.flatten.using_ints"(%qst) [#ad.ref<0>, -2 : i64] {} : (tensor<1x?x4x8x2xf32>) -> tensor<1x?x4x16xf32>
  %qs = ad.mul %qrot, %stab : tensor<1x?x4x16xf32>, tensor<1x?x1x16xf32> -> tensor<1x?x4x16xf32>
  %qa = ad.add %qc, %qs : tensor<1x?x4x16xf32>, tensor<1x?x4x16xf32> -> tensor<1x?x4x16xf32>
  %qcat = ad.cat %qa, %qp dim -1 : (tensor<1x?x4x16xf32>, tensor<1x?x4x16xf32>) -> tensor<1x?x4x32xf32>
  %qh = ad.transpose %qcat 1, 2 : tensor<1x?x4x32xf32> -> tensor<1x4x?x32xf32>
  %kr = ad.slice %k dim 3 [0, 16, 1] : tensor<1x?x4x32xf32> -> tensor<1x?x4x16xf32>
  %kp = ad.slice %k dim 3 [0, 16, 1] : tensor<1x?x4x32xf32> -> tensor<1x?x4x16xf32>
  %kc = ad.mul %kr, %ctab : tensor<1x?x4x16xf32>, tensor<1x?x1x16xf32> -> tensor<1x?x4x16xf32>
  %ke = ad.slice %kr dim 3 [0, 9223372036854775807, 2] : tensor<1x?x4x16xf32> -> tensor<1x?x4x8xf32>
  %ko = ad.slice %kr dim 3 [1, 9223372036854775807, 2] : tensor<1x?x4x16xf32> -> tensor<1x?x4x8xf32>
  %kn = ad.neg %ko : tensor<1x?x4x8xf32> -> tensor<1x?x4x8xf32>
  %kst = ad.torch_op "aten.stack.default"(%kn, %ke) [[#ad.ref<0>, #ad.ref<1>], -1 : i64] {} : (tensor<1x?x4x8xf32>, tensor<1x?x4x8xf32>) -> tensor<1x?x4x8x2xf32>
  %krot = ad.torch_op "aten.flatten.using_ints"(%kst) [#ad.ref<0>, -2 : i64] {} : (tensor<1x?x4x8x2xf32>) -> tensor<1x?x4x16xf32>
  %ks = ad.mul %krot, %stab : tensor<1x?x4x16xf32>, tensor<1x?x1x16xf32> -> tensor<1x?x4x16xf32>
  %ka = ad.add %kc, %ks : tensor<1x?x4x16xf32>, tensor<1x?x4x16xf32> -> tensor<1x?x4x16xf32>
  %kcat = ad.cat %ka, %kp dim -1 : (tensor<1x?x4x16xf32>, tensor<1x?x4x16xf32>) -> tensor<1x?x4x32xf32>
  %kh = ad.transpose %kcat 1, 2 : tensor<1x?x4x32xf32> -> tensor<1x4x?x32xf32>
  func.return %qh, %kh : tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>
}

// -----

// A near miss of GPT-J's rotate_every_two: stack(-x[..., 1::2], x[..., 1::2]) pairs the odd dims
// with themselves, not a rotation: no ad.rope.
// CHECK-LABEL: func.func @gptj_pairs_of_odd_dims_only
// CHECK-NOT:     ad.rope
// CHECK:         func.return
func.func @gptj_pairs_of_odd_dims_only(%q: tensor<1x?x4x32xf32>, %k: tensor<1x?x4x32xf32>, %cos: tensor<1x?x8xf32>, %sin: tensor<1x?x8xf32>) -> (tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>) {
  %cu = ad.unsqueeze %cos dim 2 : tensor<1x?x8xf32> -> tensor<1x?x1x8xf32>
  %ctab = ad.torch_op "aten.repeat_interleave.self_int"(%cu) [#ad.ref<0>, 2 : i64, 3 : i64] {} : (tensor<1x?x1x8xf32>) -> tensor<1x?x1x16xf32>
  %su = ad.unsqueeze %sin dim 2 : tensor<1x?x8xf32> -> tensor<1x?x1x8xf32>
  %stab = ad.torch_op "aten.repeat_interleave.self_int"(%su) [#ad.ref<0>, 2 : i64, 3 : i64] {} : (tensor<1x?x1x8xf32>) -> tensor<1x?x1x16xf32>
  %qr = ad.slice %q dim 3 [0, 16, 1] : tensor<1x?x4x32xf32> -> tensor<1x?x4x16xf32>
  %qp = ad.slice %q dim 3 [16, 9223372036854775807, 1] : tensor<1x?x4x32xf32> -> tensor<1x?x4x16xf32>
  %qc = ad.mul %qr, %ctab : tensor<1x?x4x16xf32>, tensor<1x?x1x16xf32> -> tensor<1x?x4x16xf32>
  %qe = ad.slice %qr dim 3 [1, 9223372036854775807, 2] : tensor<1x?x4x16xf32> -> tensor<1x?x4x8xf32>
  %qo = ad.slice %qr dim 3 [1, 9223372036854775807, 2] : tensor<1x?x4x16xf32> -> tensor<1x?x4x8xf32>
  %qn = ad.neg %qo : tensor<1x?x4x8xf32> -> tensor<1x?x4x8xf32>
  %qst = ad.torch_op "aten.stack.default"(%qn, %qe) [[#ad.ref<0>, #ad.ref<1>], -1 : i64] {} : (tensor<1x?x4x8xf32>, tensor<1x?x4x8xf32>) -> tensor<1x?x4x8x2xf32>
  %qrot = ad.torch_op "aten.flatten.using_ints"(%qst) [#ad.ref<0>, -2 : i64] {} : (tensor<1x?x4x8x2xf32>) -> tensor<1x?x4x16xf32>
  %qs = ad.mul %qrot, %stab : tensor<1x?x4x16xf32>, tensor<1x?x1x16xf32> -> tensor<1x?x4x16xf32>
  %qa = ad.add %qc, %qs : tensor<1x?x4x16xf32>, tensor<1x?x4x16xf32> -> tensor<1x?x4x16xf32>
  %qcat = ad.cat %qa, %qp dim -1 : (tensor<1x?x4x16xf32>, tensor<1x?x4x16xf32>) -> tensor<1x?x4x32xf32>
  %qh = ad.transpose %qcat 1, 2 : tensor<1x?x4x32xf32> -> tensor<1x4x?x32xf32>
  %kr = ad.slice %k dim 3 [0, 16, 1] : tensor<1x?x4x32xf32> -> tensor<1x?x4x16xf32>
  %kp = ad.slice %k dim 3 [16, 9223372036854775807, 1] : tensor<1x?x4x32xf32> -> tensor<1x?x4x16xf32>
  %kc = ad.mul %kr, %ctab : tensor<1x?x4x16xf32>, tensor<1x?x1x16xf32> -> tensor<1x?x4x16xf32>
  %ke = ad.slice %kr dim 3 [1, 9223372036854775807, 2] : tensor<1x?x4x16xf32> -> tensor<1x?x4x8xf32>
  %ko = ad.slice %kr dim 3 [1, 9223372036854775807, 2] : tensor<1x?x4x16xf32> -> tensor<1x?x4x8xf32>
  %kn = ad.neg %ko : tensor<1x?x4x8xf32> -> tensor<1x?x4x8xf32>
  %kst = ad.torch_op "aten.stack.default"(%kn, %ke) [[#ad.ref<0>, #ad.ref<1>], -1 : i64] {} : (tensor<1x?x4x8xf32>, tensor<1x?x4x8xf32>) -> tensor<1x?x4x8x2xf32>
  %krot = ad.torch_op "aten.flatten.using_ints"(%kst) [#ad.ref<0>, -2 : i64] {} : (tensor<1x?x4x8x2xf32>) -> tensor<1x?x4x16xf32>
  %ks = ad.mul %krot, %stab : tensor<1x?x4x16xf32>, tensor<1x?x1x16xf32> -> tensor<1x?x4x16xf32>
  %ka = ad.add %kc, %ks : tensor<1x?x4x16xf32>, tensor<1x?x4x16xf32> -> tensor<1x?x4x16xf32>
  %kcat = ad.cat %ka, %kp dim -1 : (tensor<1x?x4x16xf32>, tensor<1x?x4x16xf32>) -> tensor<1x?x4x32xf32>
  %kh = ad.transpose %kcat 1, 2 : tensor<1x?x4x32xf32> -> tensor<1x4x?x32xf32>
  func.return %qh, %kh : tensor<1x4x?x32xf32>, tensor<1x4x?x32xf32>
}
