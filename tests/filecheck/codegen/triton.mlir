// Triton code generation: the kernel and launcher that `-t triton` prints for each region.
// RUN: ad-opt %s --split-input-file -p fuse-elementwise -t triton | filecheck %s

// RMSNorm in bf16 over an odd row (96): one row per tile (BLOCK_C = 128 covers it), fp32 math
// after the loads, padding lanes set to the sum's neutral 0 before the reduction, the explicit
// cast to bf16 rounds where the program has it, the store casts to bf16. The weight is read
// by columns only, the activation through its runtime strides.
// CHECK-LABEL: kernel 1 of 1: red_cast_pow_mean_
// The launcher's grid arithmetic is plain Python (Triton's cdiv is a ConstexprFunction: ~100x dearer a call).
// CHECK:       from ad_mlir.codegen.launch import cdiv, next_power_of_2, broadcast_size, broadcast_stride, narrowed
// CHECK-NOT:   triton.cdiv
// CHECK:       def red_cast_pow_mean_{{[0-9a-f]+}}(in0, in1, out0, size0, n_rows, in0_st0, in0_st1, in1_st1, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
// CHECK:         i0 = rows
// CHECK-NEXT:    cols = tl.arange(0, BLOCK_C)[None, :]
// CHECK-NEXT:    col_mask = cols < 96
// CHECK:         [[W:t[0-9]+]] = tl.load(in1 + cols * in1_st1, mask=col_mask, other=0).to(tl.float32)
// CHECK-NEXT:    [[X:t[0-9]+]] = tl.load(in0 + i0 * in0_st0 + cols * in0_st1, mask=row_mask & col_mask, other=0).to(tl.float32)
// CHECK-NEXT:    [[SQ:t[0-9]+]] = [[X]] * [[X]]
// CHECK-NEXT:    [[PAD:t[0-9]+]] = tl.where(col_mask, [[SQ]], 0.0)
// CHECK-NEXT:    [[SUM:t[0-9]+]] = tl.sum([[PAD]], axis=1, keep_dims=True)
// CHECK-NEXT:    [[MEAN:t[0-9]+]] = [[SUM]] / 96.0
// CHECK-NEXT:    [[EPS:t[0-9]+]] = [[MEAN]] + 1e-06
// CHECK-NEXT:    [[R:t[0-9]+]] = tl.rsqrt([[EPS]])
// CHECK-NEXT:    [[N:t[0-9]+]] = [[X]] * [[R]]
// CHECK-NEXT:    [[NB:t[0-9]+]] = [[N]].to(tl.bfloat16).to(tl.float32)
// CHECK-NEXT:    [[Y:t[0-9]+]] = [[W]] * [[NB]]
// CHECK-NEXT:    tl.store(out0 + rows * 96 + cols, ([[Y]]).to(tl.bfloat16), mask=mask)
// CHECK:       OUTPUT_DTYPES = (torch.bfloat16, )
// CHECK:       def launch(kernel, tensors, scalars):
// CHECK:         size0 = in0.shape[0]
// CHECK:         if n_rows == 0 or 96 == 0:
// CHECK-NEXT:      return outs
// CHECK-NEXT:    block_r, block_c, num_warps = row_blocks(n_rows, 96)
// CHECK-NEXT:    kernel[(cdiv(n_rows, block_r),)](
// CHECK-NEXT:      in0, in1, outs[0], size0, n_rows, broadcast_stride(in0, 0), broadcast_stride(in0, 1), broadcast_stride(in1, 0),
func.func @rmsnorm(%x: tensor<?x96xbf16>, %w: tensor<96xbf16>) -> tensor<?x96xbf16> {
  %two = ad.constant 2 : i64
  %eps = ad.constant 1.000000e-06 : f64
  %xf = ad.cast %x : tensor<?x96xbf16> -> tensor<?x96xf32>
  %sq = ad.pow %xf, %two : tensor<?x96xf32>, i64 -> tensor<?x96xf32>
  %m = ad.mean %sq dim [-1] keepdim : tensor<?x96xf32> -> tensor<?x1xf32>
  %a = ad.add %m, %eps : tensor<?x1xf32>, f64 -> tensor<?x1xf32>
  %r = ad.rsqrt %a : tensor<?x1xf32> -> tensor<?x1xf32>
  %n = ad.mul %xf, %r : tensor<?x96xf32>, tensor<?x1xf32> -> tensor<?x96xf32>
  %nb = ad.cast %n : tensor<?x96xf32> -> tensor<?x96xbf16>
  %y = ad.mul %w, %nb : tensor<96xbf16>, tensor<?x96xbf16> -> tensor<?x96xbf16>
  func.return %y : tensor<?x96xbf16>
}

// -----

// MPT's scores + ALiBi bias: the bias is typed `4x?x?` but 1 at run time along its middle dim.
// Each dynamic size is the broadcast of every input that has it, and each stride is 0 where
// the input has size 1, whatever its type says (tests/unit/test_kernel_ops.py runs it).
// CHECK-LABEL: kernel 1 of 1: poi_mul_add_
// CHECK:       def output_shapes(tensors):
// CHECK-NEXT:    in0, in1, = tensors
// CHECK-NEXT:    size2 = broadcast_size(in0.shape[2], in1.shape[1])
// CHECK-NEXT:    size3 = broadcast_size(in0.shape[3], in1.shape[2])
// CHECK-NEXT:    return [(1, 4, size2, size3, )]
// CHECK:       def launch(kernel, tensors, scalars):
// CHECK:         in0, in1, outs[0], size2, size3, n_rows, broadcast_stride(in0, 1), broadcast_stride(in0, 2), broadcast_stride(in0, 3), broadcast_stride(in1, 0), broadcast_stride(in1, 1), broadcast_stride(in1, 2),
// CHECK-NOT:     narrowed
// CHECK:         return outs
func.func @alibi(%s: tensor<1x4x?x?xf32>, %b: tensor<4x?x?xf32>) -> tensor<1x4x?x?xf32> {
  %h = ad.constant 5.000000e-01 : f64
  %m = ad.mul %s, %h : tensor<1x4x?x?xf32>, f64 -> tensor<1x4x?x?xf32>
  %a = ad.add %m, %b : tensor<1x4x?x?xf32>, tensor<4x?x?xf32> -> tensor<1x4x?x?xf32>
  func.return %a : tensor<1x4x?x?xf32>
}

// -----

// A row longer than one tile (10000 > 8192): one pass over the row per reduction depth (the
// max, then the sum of exp(x - max)), then a pass that writes; amax keeps NaN like torch.
// CHECK-LABEL: kernel 1 of 1: red_amax_sub_exp_
// CHECK:         [[MAX:t[0-9]+]] = tl.full([BLOCK_R, 1], float("-inf"), tl.float32)
// CHECK-NEXT:    for c0 in range(0, 10000, BLOCK_C):
// CHECK-NEXT:        cols = c0 + tl.arange(0, BLOCK_C)[None, :]
// CHECK:             [[PADM:t[0-9]+]] = tl.where(col_mask, {{t[0-9]+}}, float("-inf"))
// CHECK-NEXT:        [[MAX]] = tl.maximum([[MAX]], tl.where(tl.max(([[PADM]] != [[PADM]]).to(tl.int32), axis=1, keep_dims=True) > 0, float("nan"), tl.max([[PADM]], axis=1, keep_dims=True)), propagate_nan=tl.PropagateNan.ALL)
// CHECK-NEXT:    [[SUM:t[0-9]+]] = tl.full([BLOCK_R, 1], 0.0, tl.float32)
// CHECK-NEXT:    for c0 in range(0, 10000, BLOCK_C):
// CHECK:             {{t[0-9]+}} = {{t[0-9]+}} - [[MAX]]
// CHECK:             [[SUM]] = [[SUM]] + tl.sum(
// CHECK-NEXT:    for c0 in range(0, 10000, BLOCK_C):
// CHECK:             {{t[0-9]+}} = {{t[0-9]+}} / [[SUM]]
// CHECK-NEXT:        tl.store(out0 + rows * 10000 + cols
// CHECK-NOT:     for c0
// CHECK:         block_r, block_c, num_warps = row_blocks(n_rows, 10000)
func.func @long_softmax(%x: tensor<2x10000xf32>) -> tensor<2x10000xf32> {
  %m = ad.amax %x dim [-1] keepdim : tensor<2x10000xf32> -> tensor<2x1xf32>
  %d = ad.sub %x, %m : tensor<2x10000xf32>, tensor<2x1xf32> -> tensor<2x10000xf32>
  %e = ad.exp %d : tensor<2x10000xf32> -> tensor<2x10000xf32>
  %s = ad.sum %e dim [-1] keepdim : tensor<2x10000xf32> -> tensor<2x1xf32>
  %y = ad.div %e, %s : tensor<2x10000xf32>, tensor<2x1xf32> -> tensor<2x10000xf32>
  func.return %y : tensor<2x10000xf32>
}

// -----

// RoPE's rotate_half: the last-dim slices and the cat are column index math on the one input
// (read in place through its strides, e.g. a transposed projection); each cat operand is
// computed at its own columns with the other lanes masked off. 2-D tiles over rows x columns.
// CHECK-LABEL: kernel 1 of 1: poi_mul_slice_neg_
// CHECK:         rem = rows
// CHECK-NEXT:    i2 = rem % size2
// CHECK-NEXT:    rem = rem // size2
// CHECK-NEXT:    i1 = rem
// CHECK-NEXT:    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
// CHECK-NEXT:    col_mask = cols < 16
// CHECK:         [[HI:t[0-9]+]] = tl.load(in0 + i1 * in0_st1 + i2 * in0_st2 + (8 + cols) * in0_st3, mask=row_mask & col_mask & (cols >= 0) & (cols < 8) & ((8 + cols) < 16), other=0)
// CHECK-NEXT:    [[NEG:t[0-9]+]] = -[[HI]]
// CHECK-NEXT:    [[LO:t[0-9]+]] = tl.load(in0 + i1 * in0_st1 + i2 * in0_st2 + (cols - 8) * in0_st3, mask=row_mask & col_mask & (cols >= 8) & (cols < 16) & ((cols - 8) < 16), other=0)
// CHECK-NEXT:    [[ROT:t[0-9]+]] = tl.where(cols < 8, [[NEG]], [[LO]])
// CHECK-NEXT:    {{t[0-9]+}} = tl.load(in2 + i2 * in2_st2 + cols * in2_st3
// CHECK:         tl.store(out0 + rows * 16 + cols, {{t[0-9]+}}, mask=mask)
// CHECK:         block_r, block_c, num_warps = pointwise_blocks(n_rows, 16)
// CHECK-NEXT:    kernel[(cdiv(n_rows, block_r), cdiv(16, block_c),)](
func.func @rope(%q: tensor<1x4x?x16xf32>, %cos: tensor<1x1x?x16xf32>, %sin: tensor<1x1x?x16xf32>) -> tensor<1x4x?x16xf32> {
  %a = ad.mul %q, %cos : tensor<1x4x?x16xf32>, tensor<1x1x?x16xf32> -> tensor<1x4x?x16xf32>
  %lo = ad.slice %q dim 3 [0, 8, 1] : tensor<1x4x?x16xf32> -> tensor<1x4x?x8xf32>
  %hi = ad.slice %q dim 3 [8, 9223372036854775807, 1] : tensor<1x4x?x16xf32> -> tensor<1x4x?x8xf32>
  %n = ad.neg %hi : tensor<1x4x?x8xf32> -> tensor<1x4x?x8xf32>
  %rot = ad.cat %n, %lo dim -1 : (tensor<1x4x?x8xf32>, tensor<1x4x?x8xf32>) -> tensor<1x4x?x16xf32>
  %b = ad.mul %rot, %sin : tensor<1x4x?x16xf32>, tensor<1x1x?x16xf32> -> tensor<1x4x?x16xf32>
  %y = ad.add %a, %b : tensor<1x4x?x16xf32>, tensor<1x4x?x16xf32> -> tensor<1x4x?x16xf32>
  func.return %y : tensor<1x4x?x16xf32>
}

// -----

// An output that broadcasts over the domain is written once: the per-column `1 + w` (also
// used outside) by the rows with index 0. A comparison's boolean result is stored as is.
// CHECK-LABEL: kernel 1 of 1: poi_add_mul_gt_
// CHECK:         tl.store(out0 + rows * 0 + cols, {{t[0-9]+}}, mask=row_mask & col_mask & (i0 == 0))
// CHECK:         [[Y:t[0-9]+]] = {{t[0-9]+}} * {{t[0-9]+}}
// CHECK-NEXT:    tl.store(out1 + rows * 32 + cols, [[Y]], mask=mask)
// CHECK-NEXT:    [[P:t[0-9]+]] = [[Y]] > 0.0
// CHECK-NEXT:    tl.store(out2 + rows * 32 + cols, [[P]], mask=mask)
// CHECK:       OUTPUT_DTYPES = (torch.float32, torch.float32, torch.bool, )
// CHECK:         return [(32, ), (8, 32, ), (8, 32, )]
func.func @broadcast_outputs(%x: tensor<8x32xf32>, %w: tensor<32xf32>) -> (tensor<32xf32>, tensor<8x32xf32>, tensor<8x32xi1>) {
  %one = ad.constant 1.000000e+00 : f64
  %zero = ad.constant 0.000000e+00 : f64
  %w1 = ad.add %w, %one : tensor<32xf32>, f64 -> tensor<32xf32>
  %y = ad.mul %x, %w1 : tensor<8x32xf32>, tensor<32xf32> -> tensor<8x32xf32>
  %p = ad.gt %y, %zero : tensor<8x32xf32>, f64 -> tensor<8x32xi1>
  func.return %w1, %y, %p : tensor<32xf32>, tensor<8x32xf32>, tensor<8x32xi1>
}

// -----

// A region of 0-d values (here a hand-written one: the fuser leaves a 0-d reduction out) has a
// domain of one element: its row is one column wide, so the sum reads the value once.
// CHECK-LABEL: kernel 1 of 1: red_sum_
// CHECK:         col_mask = cols < 1
// CHECK:         [[X:t[0-9]+]] = tl.load(in0 + tl.zeros([1, 1], tl.int32))
// CHECK-NEXT:    [[PAD:t[0-9]+]] = tl.where(col_mask, [[X]], 0.0)
// CHECK-NEXT:    [[S:t[0-9]+]] = tl.sum([[PAD]], axis=1, keep_dims=True)
// CHECK-NEXT:    tl.store(out0 + rows * 1 + cols, [[S]], mask=mask)
// CHECK:         return [()]
func.func @zero_dim_sum(%a: tensor<f32>) -> tensor<f32> {
  %r = ad.fused(%a) : (tensor<f32>) -> tensor<f32> {
  ^bb0(%x: tensor<f32>):
    %s = ad.sum %x dim [-1] : tensor<f32> -> tensor<f32>
    ad.yield %s : tensor<f32>
  }
  func.return %r : tensor<f32>
}

// -----

// An op with no kernel form (the MLA template has no sink logits) is named with the reason and
// runs as its torch reference; the target goes on to the other kernels.
// CHECK:       # ----- ad.cached_mla_attention at loc("model.layers.0.self_attn"): no kernel, runs as its torch reference (the MLA template has no sink logits)
// CHECK-NEXT:  # ----- kernel 2 of 2: poi_exp_
func.func @mla_with_sinks(%qn: tensor<?x4x?x16xbf16>, %qr: tensor<?x4x?x8xbf16>, %lat: tensor<?x1x?x32xbf16>, %kr: tensor<?x1x?x8xbf16>, %w: tensor<128x32xbf16>, %c: tensor<2x64x40xbf16>, %bt: tensor<?x1xi64>, %s: tensor<?xi64>, %sinks: tensor<4xf32>) -> tensor<?x4x?x16xbf16> {
  %0 = ad.cached_mla_attention %qn, %qr, %lat, %kr kv_b %w cache %c block_tables %bt cache_starts %s sinks %sinks : tensor<4xf32> scale 1.250000e-01 : (tensor<?x4x?x16xbf16>, tensor<?x4x?x8xbf16>, tensor<?x1x?x32xbf16>, tensor<?x1x?x8xbf16>, tensor<128x32xbf16>, tensor<2x64x40xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x16xbf16> loc("model.layers.0.self_attn")
  %1 = ad.exp %0 : tensor<?x4x?x16xbf16> -> tensor<?x4x?x16xbf16>
  func.return %1 : tensor<?x4x?x16xbf16>
}
