// Fusion decisions of fuse-elementwise: what goes into one ad.fused region, and what stays out.
// RUN: ad-opt %s -p fuse-elementwise --split-input-file | filecheck %s
// RUN: ad-opt %s -p 'fuse-elementwise{max-ops=2}' --split-input-file | filecheck %s --check-prefix=MAX2
// RUN: ad-opt %s -p 'fuse-elementwise{allow-reductions=false}' --split-input-file | filecheck %s --check-prefix=NORED

// A chain with broadcast inputs (scalar, per-row, per-column) and a cast becomes one region;
// the scalar constant is copied in, the other operands are inputs.
// CHECK-LABEL: func.func @chain_with_broadcasts
// CHECK-NEXT:    %[[F:.*]] = ad.fused(%x, %row, %col) : (tensor<4x?xf32>, tensor<4x1xf32>, tensor<?xf32>) -> tensor<4x?xbf16> {
// CHECK-NEXT:    ^bb0(%[[X:.*]]: tensor<4x?xf32>, %[[R:.*]]: tensor<4x1xf32>, %[[C:.*]]: tensor<?xf32>):
// CHECK-NEXT:      %[[K:.*]] = ad.constant 2.000000e+00 : f64
// CHECK-NEXT:      %[[A:.*]] = ad.mul %[[X]], %[[K]]
// CHECK-NEXT:      %[[B:.*]] = ad.add %[[A]], %[[R]]
// CHECK-NEXT:      %[[D:.*]] = ad.sub %[[B]], %[[C]]
// CHECK-NEXT:      %[[E:.*]] = ad.cast %[[D]] : tensor<4x?xf32> -> tensor<4x?xbf16>
// CHECK-NEXT:      ad.yield %[[E]] : tensor<4x?xbf16>
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[F]]
// MAX2-LABEL: func.func @chain_with_broadcasts
// MAX2-COUNT-2: ad.fused
// MAX2-NOT: ad.fused
// MAX2: func.return
func.func @chain_with_broadcasts(%x: tensor<4x?xf32>, %row: tensor<4x1xf32>, %col: tensor<?xf32>) -> tensor<4x?xbf16> {
  %two = ad.constant 2.000000e+00 : f64
  %0 = ad.mul %x, %two : tensor<4x?xf32>, f64 -> tensor<4x?xf32>
  %1 = ad.add %0, %row : tensor<4x?xf32>, tensor<4x1xf32> -> tensor<4x?xf32>
  %2 = ad.sub %1, %col : tensor<4x?xf32>, tensor<?xf32> -> tensor<4x?xf32>
  %3 = ad.cast %2 : tensor<4x?xf32> -> tensor<4x?xbf16>
  func.return %3 : tensor<4x?xbf16>
}

// -----

// A value used inside and outside the region is a second output; a value with several
// users inside stays one op.
// CHECK-LABEL: func.func @multi_output
// CHECK-NEXT:    %[[F0:.*]], %[[F1:.*]] = ad.fused(%x) : (tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<8x16xf32>)
// CHECK:           %[[E:.*]] = ad.exp
// CHECK-NEXT:      %[[S:.*]] = ad.mul %[[E]], %[[E]]
// CHECK-NEXT:      ad.yield %[[E]], %[[S]]
// CHECK:         %[[L:.*]] = ad.linear %[[F0]], %w
// CHECK-NEXT:    func.return %[[F1]], %[[L]]
func.func @multi_output(%x: tensor<8x16xf32>, %w: tensor<4x16xf32>) -> (tensor<8x16xf32>, tensor<8x4xf32>) {
  %0 = ad.exp %x : tensor<8x16xf32> -> tensor<8x16xf32>
  %1 = ad.linear %0, %w : (tensor<8x16xf32>, tensor<4x16xf32>) -> tensor<8x4xf32>
  %2 = ad.mul %0, %0 : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x16xf32>
  func.return %2, %1 : tensor<8x16xf32>, tensor<8x4xf32>
}

// -----

// a -> linear -> b with b also using a: fusing a and b would make the region its own
// ancestor. Two regions, the linear between them.
// CHECK-LABEL: func.func @no_cycle
// CHECK:         %[[A:.*]] = ad.fused(%x)
// CHECK:           ad.neg
// CHECK:         %[[L:.*]] = ad.linear %[[A]], %w
// CHECK-NEXT:    %[[B:.*]] = ad.fused(%[[A]], %[[L]])
// CHECK-NEXT:    ^bb0
// CHECK-NEXT:      ad.add
// CHECK-NEXT:      ad.yield
func.func @no_cycle(%x: tensor<8x8xf32>, %w: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %0 = ad.neg %x : tensor<8x8xf32> -> tensor<8x8xf32>
  %1 = ad.linear %0, %w : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
  %2 = ad.add %0, %1 : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  func.return %2 : tensor<8x8xf32>
}

// -----

// RMSNorm with the residual add: one row region (last-dim mean, row-shaped rsqrt) with the
// sum as a second output.
// CHECK-LABEL: func.func @add_rmsnorm
// CHECK-NEXT:    %[[F0:.*]], %[[F1:.*]] = ad.fused(%x, %res, %w) : (tensor<2x?x64xbf16>, tensor<2x?x64xbf16>, tensor<64xbf16>) -> (tensor<2x?x64xbf16>, tensor<2x?x64xbf16>)
// CHECK:           %[[H:.*]] = ad.add
// CHECK:           ad.mean %{{.*}} dim [-1] keepdim : tensor<2x?x64xf32> -> tensor<2x?x1xf32>
// CHECK:           ad.rsqrt %{{.*}} : tensor<2x?x1xf32> -> tensor<2x?x1xf32>
// CHECK:           ad.yield %[[H]], %{{.*}} : tensor<2x?x64xbf16>, tensor<2x?x64xbf16>
// CHECK-NOT:     ad.mean
// CHECK:         func.return %[[F1]], %[[F0]]
// NORED-LABEL: func.func @add_rmsnorm
// NORED:         ad.fused
// NORED:         ad.mean
// NORED:         ad.fused
func.func @add_rmsnorm(%x: tensor<2x?x64xbf16>, %res: tensor<2x?x64xbf16>, %w: tensor<64xbf16>) -> (tensor<2x?x64xbf16>, tensor<2x?x64xbf16>) {
  %eps = ad.constant 1.000000e-06 : f64
  %two = ad.constant 2 : i64
  %h = ad.add %x, %res : tensor<2x?x64xbf16>, tensor<2x?x64xbf16> -> tensor<2x?x64xbf16>
  %hf = ad.cast %h : tensor<2x?x64xbf16> -> tensor<2x?x64xf32>
  %sq = ad.pow %hf, %two : tensor<2x?x64xf32>, i64 -> tensor<2x?x64xf32>
  %var = ad.mean %sq dim [-1] keepdim : tensor<2x?x64xf32> -> tensor<2x?x1xf32>
  %ve = ad.add %var, %eps : tensor<2x?x1xf32>, f64 -> tensor<2x?x1xf32>
  %r = ad.rsqrt %ve : tensor<2x?x1xf32> -> tensor<2x?x1xf32>
  %n = ad.mul %hf, %r : tensor<2x?x64xf32>, tensor<2x?x1xf32> -> tensor<2x?x64xf32>
  %nb = ad.cast %n : tensor<2x?x64xf32> -> tensor<2x?x64xbf16>
  %y = ad.mul %w, %nb : tensor<64xbf16>, tensor<2x?x64xbf16> -> tensor<2x?x64xbf16>
  func.return %y, %h : tensor<2x?x64xbf16>, tensor<2x?x64xbf16>
}

// -----

// Reductions over other dims, or without keepdim, are not row reductions: they stay out,
// and so do f64 math and ops of another shape than the region's.
// CHECK-LABEL: func.func @not_fused
// CHECK:         ad.sum %x dim [0] keepdim
// CHECK:         ad.amax %x dim [1] :
// CHECK:         ad.exp %d : tensor<8x4xf64>
// CHECK:         %[[T:.*]] = ad.fused(%x)
// CHECK:           ad.neg
// CHECK:         ad.transpose %[[T]]
// CHECK:         ad.fused
// CHECK:           ad.exp
func.func @not_fused(%x: tensor<8x4xf32>, %d: tensor<8x4xf64>) -> (tensor<1x4xf32>, tensor<8xf32>, tensor<8x4xf64>, tensor<4x8xf32>) {
  %0 = ad.sum %x dim [0] keepdim : tensor<8x4xf32> -> tensor<1x4xf32>
  %1 = ad.amax %x dim [1] : tensor<8x4xf32> -> tensor<8xf32>
  %2 = ad.exp %d : tensor<8x4xf64> -> tensor<8x4xf64>
  %3 = ad.neg %x : tensor<8x4xf32> -> tensor<8x4xf32>
  %4 = ad.transpose %3 0, 1 : tensor<8x4xf32> -> tensor<4x8xf32>
  %5 = ad.exp %4 : tensor<4x8xf32> -> tensor<4x8xf32>
  func.return %0, %1, %2, %5 : tensor<1x4xf32>, tensor<8xf32>, tensor<8x4xf64>, tensor<4x8xf32>
}

// -----

// Two independent chains of different shapes make two regions.
// CHECK-LABEL: func.func @two_domains
// CHECK-COUNT-2: ad.fused
// CHECK-NOT:     ad.fused
func.func @two_domains(%x: tensor<8x4xf32>, %y: tensor<3xf32>) -> (tensor<8x4xf32>, tensor<3xf32>) {
  %0 = ad.exp %x : tensor<8x4xf32> -> tensor<8x4xf32>
  %1 = ad.exp %y : tensor<3xf32> -> tensor<3xf32>
  %2 = ad.neg %0 : tensor<8x4xf32> -> tensor<8x4xf32>
  %3 = ad.neg %1 : tensor<3xf32> -> tensor<3xf32>
  func.return %2, %3 : tensor<8x4xf32>, tensor<3xf32>
}

// -----

// RoPE's rotate_half: the last-dim slices of q, the neg and the cat join the multiply-adds in
// one region whose only tensor inputs are q, cos and sin; nothing of it is left outside.
// CHECK-LABEL: func.func @rope
// CHECK-NEXT:    %[[F:.*]] = ad.fused(%q, %cos, %sin) : (tensor<1x4x?x16xf32>, tensor<1x1x?x16xf32>, tensor<1x1x?x16xf32>) -> tensor<1x4x?x16xf32> {
// CHECK:           ad.slice %{{.*}} dim 3 [0, 8, 1]
// CHECK:           ad.slice %{{.*}} dim 3 [8, 9223372036854775807, 1]
// CHECK:           ad.neg
// CHECK:           ad.cat
// CHECK:           ad.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[F]]
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

// A slice alone is a view: a region of it would copy for nothing. A slice of a dim other than
// the last, or with dynamic bounds, is not column math and stays out of regions.
// CHECK-LABEL: func.func @views_stay_views
// CHECK-NOT:     ad.fused
// CHECK:         %[[S:.*]] = ad.slice %x dim 1 [0, 4, 1]
// CHECK-NEXT:    %[[R:.*]] = ad.slice %x dim 0 [0, 2, 1]
// CHECK-NEXT:    %[[E:.*]] = ad.fused(%[[R]])
// CHECK:           ad.exp
// CHECK:         func.return %[[S]], %[[E]]
func.func @views_stay_views(%x: tensor<4x8xf32>) -> (tensor<4x4xf32>, tensor<2x8xf32>) {
  %0 = ad.slice %x dim 1 [0, 4, 1] : tensor<4x8xf32> -> tensor<4x4xf32>
  %1 = ad.slice %x dim 0 [0, 2, 1] : tensor<4x8xf32> -> tensor<2x8xf32>
  %2 = ad.exp %1 : tensor<2x8xf32> -> tensor<2x8xf32>
  func.return %0, %2 : tensor<4x4xf32>, tensor<2x8xf32>
}

// -----

// Column ops and row reductions do not share a region (a reduction runs over the region's
// columns, which a cat changes): the cat is one region, the softmax over it another.
// CHECK-LABEL: func.func @cat_then_softmax
// CHECK:         %[[C:.*]] = ad.fused(%a, %b)
// CHECK:           ad.cat
// CHECK-NOT:       ad.amax
// CHECK:         ad.fused(%[[C]])
// CHECK:           ad.amax
func.func @cat_then_softmax(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>) -> tensor<4x16xf32> {
  %n = ad.neg %a : tensor<4x8xf32> -> tensor<4x8xf32>
  %c = ad.cat %n, %b dim 1 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x16xf32>
  %m = ad.amax %c dim [-1] keepdim : tensor<4x16xf32> -> tensor<4x1xf32>
  %d = ad.sub %c, %m : tensor<4x16xf32>, tensor<4x1xf32> -> tensor<4x16xf32>
  func.return %d : tensor<4x16xf32>
}

// -----

// A cat without `dim` concatenates along dim 0 (torch.cat's default), not the last dim: it is
// not a column op and stays out of the region (its rows would be read from the wrong input).
// CHECK-LABEL: func.func @cat_of_rows
// CHECK-NEXT:    %[[C:.*]] = ad.cat %a, %b : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<4x4xf32>
// CHECK-NEXT:    ad.fused(%[[C]])
// CHECK-NEXT:    ^{{.*}}(%{{.*}}: tensor<4x4xf32>):
// CHECK-NEXT:      ad.exp
func.func @cat_of_rows(%a: tensor<2x4xf32>, %b: tensor<2x4xf32>) -> tensor<4x4xf32> {
  %c = ad.cat %a, %b : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<4x4xf32>
  %e = ad.exp %c : tensor<4x4xf32> -> tensor<4x4xf32>
  func.return %e : tensor<4x4xf32>
}

// -----

// Gemma's `1 + w` on the weight alone broadcasts into the norm's domain: it joins the row
// region (computed per tile), whose input is then the weight itself.
// CHECK-LABEL: func.func @one_plus_weight
// CHECK-NEXT:    %[[F:.*]] = ad.fused(%w, %x) : (tensor<64xf32>, tensor<?x64xf32>) -> tensor<?x64xf32>
// CHECK:           ad.add %{{.*}}, %{{.*}} : tensor<64xf32>, f64 -> tensor<64xf32>
// CHECK:           ad.mean
// CHECK:         func.return %[[F]]
func.func @one_plus_weight(%x: tensor<?x64xf32>, %w: tensor<64xf32>) -> tensor<?x64xf32> {
  %one = ad.constant 1.000000e+00 : f64
  %eps = ad.constant 1.000000e-06 : f64
  %w1 = ad.add %w, %one : tensor<64xf32>, f64 -> tensor<64xf32>
  %sq = ad.mul %x, %x : tensor<?x64xf32>, tensor<?x64xf32> -> tensor<?x64xf32>
  %m = ad.mean %sq dim [-1] keepdim : tensor<?x64xf32> -> tensor<?x1xf32>
  %e = ad.add %m, %eps : tensor<?x1xf32>, f64 -> tensor<?x1xf32>
  %r = ad.rsqrt %e : tensor<?x1xf32> -> tensor<?x1xf32>
  %n = ad.mul %x, %r : tensor<?x64xf32>, tensor<?x1xf32> -> tensor<?x64xf32>
  %y = ad.mul %n, %w1 : tensor<?x64xf32>, tensor<64xf32> -> tensor<?x64xf32>
  func.return %y : tensor<?x64xf32>
}

// -----

// Ops the Triton codegen has no exact form for stay out: pow with an exponent other than
// 1, 2, 3, +-0.5, -1, -2, and integer division with a rounding mode.
// CHECK-LABEL: func.func @no_kernel_form
// CHECK:         ad.pow %x, %{{.*}} : tensor<4x4xf32>, f64
// CHECK:         ad.div %i, %{{.*}} rounding_mode "floor"
// CHECK-NOT:     ad.fused
func.func @no_kernel_form(%x: tensor<4x4xf32>, %i: tensor<4x4xi64>) -> (tensor<4x4xf32>, tensor<4x4xi64>) {
  %e = ad.constant 1.700000e+00 : f64
  %k = ad.constant 3 : i64
  %0 = ad.pow %x, %e : tensor<4x4xf32>, f64 -> tensor<4x4xf32>
  %1 = ad.div %i, %k rounding_mode "floor" : tensor<4x4xi64>, i64 -> tensor<4x4xi64>
  func.return %0, %1 : tensor<4x4xf32>, tensor<4x4xi64>
}
