// Every `ad` op parses, verifies and prints back in its custom form; the generic form
// re-parses to the same custom form.
// RUN: ad-opt %s | filecheck %s
// RUN: ad-opt %s --print-op-generic | ad-opt | filecheck %s

func.func @elementwise(%x: tensor<2x?xf32>, %y: tensor<1x?xf32>, %r: tensor<2x1xbf16>, %c: tensor<2x?xi1>, %i: tensor<2x?xi64>) {
  // CHECK-LABEL: func.func @elementwise
  %0 = ad.neg %x : tensor<2x?xf32> -> tensor<2x?xf32>
  // CHECK-NEXT: %{{.*}} = ad.neg %x : tensor<2x?xf32> -> tensor<2x?xf32>
  %1 = ad.abs %x : tensor<2x?xf32> -> tensor<2x?xf32>
  // CHECK-NEXT: ad.abs %x : tensor<2x?xf32> -> tensor<2x?xf32>
  %2 = ad.exp %x : tensor<2x?xf32> -> tensor<2x?xf32>
  // CHECK-NEXT: ad.exp %x
  %3 = ad.log %x : tensor<2x?xf32> -> tensor<2x?xf32>
  // CHECK-NEXT: ad.log %x
  %4 = ad.sqrt %x : tensor<2x?xf32> -> tensor<2x?xf32>
  // CHECK-NEXT: ad.sqrt %x
  %5 = ad.rsqrt %x : tensor<2x?xf32> -> tensor<2x?xf32>
  // CHECK-NEXT: ad.rsqrt %x
  %6 = ad.reciprocal %x : tensor<2x?xf32> -> tensor<2x?xf32>
  // CHECK-NEXT: ad.reciprocal %x
  %7 = ad.sin %x : tensor<2x?xf32> -> tensor<2x?xf32>
  // CHECK-NEXT: ad.sin %x
  %8 = ad.cos %x : tensor<2x?xf32> -> tensor<2x?xf32>
  // CHECK-NEXT: ad.cos %x
  %9 = ad.tanh %x : tensor<2x?xf32> -> tensor<2x?xf32>
  // CHECK-NEXT: ad.tanh %x
  %10 = ad.erf %x : tensor<2x?xf32> -> tensor<2x?xf32>
  // CHECK-NEXT: ad.erf %x
  %11 = ad.sigmoid %x : tensor<2x?xf32> -> tensor<2x?xf32>
  // CHECK-NEXT: ad.sigmoid %x
  %12 = ad.silu %r : tensor<2x1xbf16> -> tensor<2x1xbf16>
  // CHECK-NEXT: ad.silu %r : tensor<2x1xbf16> -> tensor<2x1xbf16>
  %13 = ad.relu %x : tensor<2x?xf32> -> tensor<2x?xf32>
  // CHECK-NEXT: ad.relu %x
  %14 = ad.logical_not %c : tensor<2x?xi1> -> tensor<2x?xi1>
  // CHECK-NEXT: ad.logical_not %c : tensor<2x?xi1> -> tensor<2x?xi1>
  %15 = ad.bitwise_not %i : tensor<2x?xi64> -> tensor<2x?xi64>
  // CHECK-NEXT: ad.bitwise_not %i : tensor<2x?xi64> -> tensor<2x?xi64>
  %16 = ad.gelu %x approximate "tanh" : tensor<2x?xf32> -> tensor<2x?xf32>
  // CHECK-NEXT: ad.gelu %x approximate "tanh" : tensor<2x?xf32> -> tensor<2x?xf32>
  %17 = ad.gelu %x : tensor<2x?xf32> -> tensor<2x?xf32>
  // CHECK-NEXT: ad.gelu %x : tensor<2x?xf32> -> tensor<2x?xf32>
  %18 = ad.cast %x : tensor<2x?xf32> -> tensor<2x?xbf16>
  // CHECK-NEXT: ad.cast %x : tensor<2x?xf32> -> tensor<2x?xbf16>
  %19 = ad.cast %r : tensor<2x1xbf16> -> tensor<2x1xf8E4M3FN>
  // CHECK-NEXT: ad.cast %r : tensor<2x1xbf16> -> tensor<2x1xf8E4M3FN>
  %s = ad.constant 2.500000e-01 : f64
  // CHECK-NEXT: %s = ad.constant 2.500000e-01 : f64
  %n = ad.constant 3 : i64
  // CHECK-NEXT: %n = ad.constant 3 : i64
  %20 = ad.add %x, %y alpha 2.000000e+00 : f64 : tensor<2x?xf32>, tensor<1x?xf32> -> tensor<2x?xf32>
  // CHECK-NEXT: ad.add %x, %y alpha 2.000000e+00 : f64 : tensor<2x?xf32>, tensor<1x?xf32> -> tensor<2x?xf32>
  %21 = ad.sub %x, %s : tensor<2x?xf32>, f64 -> tensor<2x?xf32>
  // CHECK-NEXT: ad.sub %x, %s : tensor<2x?xf32>, f64 -> tensor<2x?xf32>
  %22 = ad.mul %x, %r : tensor<2x?xf32>, tensor<2x1xbf16> -> tensor<2x?xf32>
  // CHECK-NEXT: ad.mul %x, %r : tensor<2x?xf32>, tensor<2x1xbf16> -> tensor<2x?xf32>
  %23 = ad.div %x, %y rounding_mode "floor" : tensor<2x?xf32>, tensor<1x?xf32> -> tensor<2x?xf32>
  // CHECK-NEXT: ad.div %x, %y rounding_mode "floor" : tensor<2x?xf32>, tensor<1x?xf32> -> tensor<2x?xf32>
  %24 = ad.pow %x, %n : tensor<2x?xf32>, i64 -> tensor<2x?xf32>
  // CHECK-NEXT: ad.pow %x, %n : tensor<2x?xf32>, i64 -> tensor<2x?xf32>
  %25 = ad.maximum %x, %y : tensor<2x?xf32>, tensor<1x?xf32> -> tensor<2x?xf32>
  // CHECK-NEXT: ad.maximum %x, %y
  %26 = ad.minimum %x, %y : tensor<2x?xf32>, tensor<1x?xf32> -> tensor<2x?xf32>
  // CHECK-NEXT: ad.minimum %x, %y
  %27 = ad.bitwise_and %i, %n : tensor<2x?xi64>, i64 -> tensor<2x?xi64>
  // CHECK-NEXT: ad.bitwise_and %i, %n
  %28 = ad.bitwise_or %i, %i : tensor<2x?xi64>, tensor<2x?xi64> -> tensor<2x?xi64>
  // CHECK-NEXT: ad.bitwise_or %i, %i
  %29 = ad.logical_and %c, %c : tensor<2x?xi1>, tensor<2x?xi1> -> tensor<2x?xi1>
  // CHECK-NEXT: ad.logical_and %c, %c
  %30 = ad.logical_or %c, %c : tensor<2x?xi1>, tensor<2x?xi1> -> tensor<2x?xi1>
  // CHECK-NEXT: ad.logical_or %c, %c
  %31 = ad.eq %x, %y : tensor<2x?xf32>, tensor<1x?xf32> -> tensor<2x?xi1>
  // CHECK-NEXT: ad.eq %x, %y : tensor<2x?xf32>, tensor<1x?xf32> -> tensor<2x?xi1>
  %32 = ad.ne %i, %n : tensor<2x?xi64>, i64 -> tensor<2x?xi1>
  // CHECK-NEXT: ad.ne %i, %n
  %33 = ad.lt %x, %s : tensor<2x?xf32>, f64 -> tensor<2x?xi1>
  // CHECK-NEXT: ad.lt %x, %s
  %34 = ad.le %x, %s : tensor<2x?xf32>, f64 -> tensor<2x?xi1>
  // CHECK-NEXT: ad.le %x, %s
  %35 = ad.gt %x, %s : tensor<2x?xf32>, f64 -> tensor<2x?xi1>
  // CHECK-NEXT: ad.gt %x, %s
  %36 = ad.ge %x, %s : tensor<2x?xf32>, f64 -> tensor<2x?xi1>
  // CHECK-NEXT: ad.ge %x, %s
  %37 = ad.where %c, %x, %s : tensor<2x?xi1>, tensor<2x?xf32>, f64 -> tensor<2x?xf32>
  // CHECK-NEXT: ad.where %c, %x, %s : tensor<2x?xi1>, tensor<2x?xf32>, f64 -> tensor<2x?xf32>
  func.return
}

func.func @reductions(%x: tensor<2x?x8xbf16>) {
  // CHECK-LABEL: func.func @reductions
  %0 = ad.sum %x dim [-1] keepdim dtype f32 : tensor<2x?x8xbf16> -> tensor<2x?x1xf32>
  // CHECK-NEXT: ad.sum %x dim [-1] keepdim dtype f32 : tensor<2x?x8xbf16> -> tensor<2x?x1xf32>
  %1 = ad.mean %x dim [0, 2] : tensor<2x?x8xbf16> -> tensor<?xbf16>
  // CHECK-NEXT: ad.mean %x dim [0, 2] : tensor<2x?x8xbf16> -> tensor<?xbf16>
  %2 = ad.sum %x : tensor<2x?x8xbf16> -> tensor<bf16>
  // CHECK-NEXT: ad.sum %x : tensor<2x?x8xbf16> -> tensor<bf16>
  %3 = ad.amax %x dim [-1] keepdim : tensor<2x?x8xbf16> -> tensor<2x?x1xbf16>
  // CHECK-NEXT: ad.amax %x dim [-1] keepdim : tensor<2x?x8xbf16> -> tensor<2x?x1xbf16>
  %4 = ad.amin %x dim [1] : tensor<2x?x8xbf16> -> tensor<2x8xbf16>
  // CHECK-NEXT: ad.amin %x dim [1] : tensor<2x?x8xbf16> -> tensor<2x8xbf16>
  %5 = ad.softmax %x dim -1 dtype f32 : tensor<2x?x8xbf16> -> tensor<2x?x8xf32>
  // CHECK-NEXT: ad.softmax %x dim -1 dtype f32 : tensor<2x?x8xbf16> -> tensor<2x?x8xf32>
  func.return
}

func.func @views(%x: tensor<2x?x8xf32>, %s: index) {
  // CHECK-LABEL: func.func @views
  %0 = ad.reshape %x [2, %s, 2, 4] : tensor<2x?x8xf32> -> tensor<2x?x2x4xf32>
  // CHECK-NEXT: ad.reshape %x [2, %s, 2, 4] : tensor<2x?x8xf32> -> tensor<2x?x2x4xf32>
  %1 = ad.expand %0 [2, -1, 2, 4] : tensor<2x?x2x4xf32> -> tensor<2x?x2x4xf32>
  // CHECK-NEXT: ad.expand %{{.*}} [2, -1, 2, 4] : tensor<2x?x2x4xf32> -> tensor<2x?x2x4xf32>
  %2 = ad.permute %x [2, 0, 1] : tensor<2x?x8xf32> -> tensor<8x2x?xf32>
  // CHECK-NEXT: ad.permute %x [2, 0, 1] : tensor<2x?x8xf32> -> tensor<8x2x?xf32>
  %3 = ad.transpose %x 1, 2 : tensor<2x?x8xf32> -> tensor<2x8x?xf32>
  // CHECK-NEXT: ad.transpose %x 1, 2 : tensor<2x?x8xf32> -> tensor<2x8x?xf32>
  %4 = ad.unsqueeze %x dim 1 : tensor<2x?x8xf32> -> tensor<2x1x?x8xf32>
  // CHECK-NEXT: ad.unsqueeze %x dim 1 : tensor<2x?x8xf32> -> tensor<2x1x?x8xf32>
  %5 = ad.squeeze %4 dim [1] : tensor<2x1x?x8xf32> -> tensor<2x?x8xf32>
  // CHECK-NEXT: ad.squeeze %{{.*}} dim [1] : tensor<2x1x?x8xf32> -> tensor<2x?x8xf32>
  %6 = ad.slice %x dim 2 [4, 9223372036854775807, 1] : tensor<2x?x8xf32> -> tensor<2x?x4xf32>
  // CHECK-NEXT: ad.slice %x dim 2 [4, 9223372036854775807, 1] : tensor<2x?x8xf32> -> tensor<2x?x4xf32>
  %7 = ad.cat %6, %6 dim -1 : (tensor<2x?x4xf32>, tensor<2x?x4xf32>) -> tensor<2x?x8xf32>
  // CHECK-NEXT: ad.cat %{{.*}}, %{{.*}} dim -1 : (tensor<2x?x4xf32>, tensor<2x?x4xf32>) -> tensor<2x?x8xf32>
  %8, %9 = ad.split %x [3, 5] dim 2 : tensor<2x?x8xf32> -> tensor<2x?x3xf32>, tensor<2x?x5xf32>
  // CHECK-NEXT: ad.split %x [3, 5] dim 2 : tensor<2x?x8xf32> -> tensor<2x?x3xf32>, tensor<2x?x5xf32>
  %10 = ad.alias %x : tensor<2x?x8xf32> -> tensor<2x?x8xf32>
  // CHECK-NEXT: ad.alias %x : tensor<2x?x8xf32> -> tensor<2x?x8xf32>
  %11 = ad.clone %x : tensor<2x?x8xf32> -> tensor<2x?x8xf32>
  // CHECK-NEXT: ad.clone %x : tensor<2x?x8xf32> -> tensor<2x?x8xf32>
  %12 = ad.sym_size %x dim 1 : tensor<2x?x8xf32>
  // CHECK-NEXT: ad.sym_size %x dim 1 : tensor<2x?x8xf32>
  func.return
}

func.func @linalg(%x: tensor<?x8xf32>, %w: tensor<16x8xf32>, %b: tensor<16xf32>, %m: tensor<8x16xf32>, %bx: tensor<4x?x8xf32>, %bw: tensor<4x8x3xf32>) {
  // CHECK-LABEL: func.func @linalg
  %0 = ad.linear %x, %w : (tensor<?x8xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>
  // CHECK-NEXT: ad.linear %x, %w : (tensor<?x8xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>
  %1 = ad.linear %x, %w bias %b : (tensor<?x8xf32>, tensor<16x8xf32>, tensor<16xf32>) -> tensor<?x16xf32>
  // CHECK-NEXT: ad.linear %x, %w bias %b : (tensor<?x8xf32>, tensor<16x8xf32>, tensor<16xf32>) -> tensor<?x16xf32>
  %2 = ad.mm %x, %m : (tensor<?x8xf32>, tensor<8x16xf32>) -> tensor<?x16xf32>
  // CHECK-NEXT: ad.mm %x, %m : (tensor<?x8xf32>, tensor<8x16xf32>) -> tensor<?x16xf32>
  %3 = ad.bmm %bx, %bw : (tensor<4x?x8xf32>, tensor<4x8x3xf32>) -> tensor<4x?x3xf32>
  // CHECK-NEXT: ad.bmm %bx, %bw : (tensor<4x?x8xf32>, tensor<4x8x3xf32>) -> tensor<4x?x3xf32>
  %4 = ad.matmul %bx, %m : (tensor<4x?x8xf32>, tensor<8x16xf32>) -> tensor<4x?x16xf32>
  // CHECK-NEXT: ad.matmul %bx, %m : (tensor<4x?x8xf32>, tensor<8x16xf32>) -> tensor<4x?x16xf32>
  %5 = ad.addmm %b, %x, %m : (tensor<16xf32>, tensor<?x8xf32>, tensor<8x16xf32>) -> tensor<?x16xf32>
  // CHECK-NEXT: ad.addmm %b, %x, %m : (tensor<16xf32>, tensor<?x8xf32>, tensor<8x16xf32>) -> tensor<?x16xf32>
  func.return
}

func.func @llm(%ids: tensor<1x?xi64>, %table: tensor<128x64xbf16>, %q: tensor<1x4x?x16xbf16>, %k: tensor<1x2x?x16xbf16>, %mask: tensor<1x1x?x?xi1>) {
  // CHECK-LABEL: func.func @llm
  %0 = ad.embedding %table, %ids : (tensor<128x64xbf16>, tensor<1x?xi64>) -> tensor<1x?x64xbf16>
  // CHECK-NEXT: ad.embedding %table, %ids : (tensor<128x64xbf16>, tensor<1x?xi64>) -> tensor<1x?x64xbf16>
  %1 = ad.attention %q, %k, %k mask %mask scale 2.500000e-01 : f64 gqa : (tensor<1x4x?x16xbf16>, tensor<1x2x?x16xbf16>, tensor<1x2x?x16xbf16>, tensor<1x1x?x?xi1>) -> tensor<1x4x?x16xbf16>
  // CHECK-NEXT: ad.attention %q, %k, %k mask %mask scale 2.500000e-01 : f64 gqa : (tensor<1x4x?x16xbf16>, tensor<1x2x?x16xbf16>, tensor<1x2x?x16xbf16>, tensor<1x1x?x?xi1>) -> tensor<1x4x?x16xbf16>
  %2 = ad.attention %q, %q, %q causal : (tensor<1x4x?x16xbf16>, tensor<1x4x?x16xbf16>, tensor<1x4x?x16xbf16>) -> tensor<1x4x?x16xbf16>
  // CHECK-NEXT: ad.attention %q, %q, %q causal : (tensor<1x4x?x16xbf16>, tensor<1x4x?x16xbf16>, tensor<1x4x?x16xbf16>) -> tensor<1x4x?x16xbf16>
  func.return
}

func.func @factories(%n: index) {
  // CHECK-LABEL: func.func @factories
  %zero = ad.constant 0 : i64
  %one = ad.constant 1 : i64
  %0 = ad.arange %zero, %n, %one device <device "cpu"> : i64, index, i64 -> tensor<?xi64>
  // CHECK: ad.arange %zero, %n, %one device <device "cpu"> : i64, index, i64 -> tensor<?xi64>
  %f = ad.constant -1.500000e+00 : f64
  %1 = ad.full [1, %n], %f : f64 -> tensor<1x?xf32>
  // CHECK: ad.full [1, %n], %{{.*}} : f64 -> tensor<1x?xf32>
  func.return
}

func.func @opaque(%x: tensor<1x?xi64>, %y: tensor<1x?x8xf32>) -> tensor<1x?xi64> {
  // CHECK-LABEL: func.func @opaque
  %0 = ad.torch_op "aten.cumsum.default"(%x) [#ad.ref<0>, -1 : i64] {} : (tensor<1x?xi64>) -> tensor<1x?xi64>
  // CHECK-NEXT: ad.torch_op "aten.cumsum.default"(%x) [#ad.ref<0>, -1 : i64] {} : (tensor<1x?xi64>) -> tensor<1x?xi64>
  %1 = ad.torch_op "aten.to.device"(%y) [#ad.ref<0>, #ad.torch<device "cpu">, f32] {} : (tensor<1x?x8xf32>) -> tensor<1x?x8xf32>
  // CHECK-NEXT: ad.torch_op "aten.to.device"(%y) [#ad.ref<0>, #ad.torch<device "cpu">, f32] {} : (tensor<1x?x8xf32>) -> tensor<1x?x8xf32>
  ad.torch_op "aten._assert_tensor_metadata.default"(%y) [#ad.ref<0>] {dtype = f32, layout = #ad.torch<layout "strided">} : (tensor<1x?x8xf32>) -> ()
  // CHECK-NEXT: ad.torch_op "aten._assert_tensor_metadata.default"(%y) [#ad.ref<0>] {dtype = f32, layout = #ad.torch<layout "strided">} : (tensor<1x?x8xf32>) -> ()
  func.return %0 : tensor<1x?xi64>
}

func.func @llm_ops(%x: tensor<2x?x64xbf16>, %r: tensor<2x?x64xbf16>, %w: tensor<64xbf16>, %wf: tensor<64xf32>, %g: tensor<2x?x128xbf16>) {
  // CHECK-LABEL: func.func @llm_ops
  %0 = ad.rms_norm %x weight %w eps 1.000000e-06 : (tensor<2x?x64xbf16>, tensor<64xbf16>) -> tensor<2x?x64xbf16>
  // CHECK-NEXT: ad.rms_norm %x weight %w eps 1.000000e-06 : (tensor<2x?x64xbf16>, tensor<64xbf16>) -> tensor<2x?x64xbf16>
  %1 = ad.rms_norm %x eps 1.000000e-05 : (tensor<2x?x64xbf16>) -> tensor<2x?x64xbf16>
  // CHECK-NEXT: ad.rms_norm %x eps 1.000000e-05 : (tensor<2x?x64xbf16>) -> tensor<2x?x64xbf16>
  %2 = ad.rms_norm %x weight %wf eps 1.000000e-06 : (tensor<2x?x64xbf16>, tensor<64xf32>) -> tensor<2x?x64xf32>
  // CHECK-NEXT: ad.rms_norm %x weight %wf eps 1.000000e-06 : (tensor<2x?x64xbf16>, tensor<64xf32>) -> tensor<2x?x64xf32>
  %3, %4 = ad.add_rms_norm %x, %r weight %w eps 1.000000e-06 offset 1.000000e+00 weight_in_fp32 : (tensor<2x?x64xbf16>, tensor<2x?x64xbf16>, tensor<64xbf16>) -> (tensor<2x?x64xbf16>, tensor<2x?x64xbf16>)
  // CHECK-NEXT: ad.add_rms_norm %x, %r weight %w eps 1.000000e-06 offset 1.000000e+00 weight_in_fp32 : (tensor<2x?x64xbf16>, tensor<2x?x64xbf16>, tensor<64xbf16>) -> (tensor<2x?x64xbf16>, tensor<2x?x64xbf16>)
  %5 = ad.silu_and_mul %g, %g : (tensor<2x?x128xbf16>, tensor<2x?x128xbf16>) -> tensor<2x?x128xbf16>
  // CHECK-NEXT: ad.silu_and_mul %g, %g : (tensor<2x?x128xbf16>, tensor<2x?x128xbf16>) -> tensor<2x?x128xbf16>
  func.return
}

func.func @layer_norm_ops(%x: tensor<2x?x64xbf16>, %r: tensor<2x?x64xbf16>, %w: tensor<64xbf16>, %b: tensor<64xbf16>, %wf: tensor<64xf32>) {
  // CHECK-LABEL: func.func @layer_norm_ops
  %0 = ad.layer_norm %x weight %w bias %b eps 1.000000e-05 : (tensor<2x?x64xbf16> weight tensor<64xbf16> bias tensor<64xbf16>) -> tensor<2x?x64xbf16>
  // CHECK-NEXT: ad.layer_norm %x weight %w bias %b eps 1.000000e-05 : (tensor<2x?x64xbf16> weight tensor<64xbf16> bias tensor<64xbf16>) -> tensor<2x?x64xbf16>
  %1 = ad.layer_norm %x eps 1.000000e-06 : (tensor<2x?x64xbf16>) -> tensor<2x?x64xbf16>
  // CHECK-NEXT: ad.layer_norm %x eps 1.000000e-06 : (tensor<2x?x64xbf16>) -> tensor<2x?x64xbf16>
  %2 = ad.layer_norm %x bias %b eps 1.000000e-05 : (tensor<2x?x64xbf16> bias tensor<64xbf16>) -> tensor<2x?x64xbf16>
  // CHECK-NEXT: ad.layer_norm %x bias %b eps 1.000000e-05 : (tensor<2x?x64xbf16> bias tensor<64xbf16>) -> tensor<2x?x64xbf16>
  %3 = ad.layer_norm %x weight %wf eps 1.000000e-05 : (tensor<2x?x64xbf16> weight tensor<64xf32>) -> tensor<2x?x64xbf16>
  // CHECK-NEXT: ad.layer_norm %x weight %wf eps 1.000000e-05 : (tensor<2x?x64xbf16> weight tensor<64xf32>) -> tensor<2x?x64xbf16>
  %4, %5 = ad.add_layer_norm %x, %r weight %w bias %b eps 1.000000e-05 : (tensor<2x?x64xbf16>, tensor<2x?x64xbf16> weight tensor<64xbf16> bias tensor<64xbf16>) -> (tensor<2x?x64xbf16>, tensor<2x?x64xbf16>)
  // CHECK-NEXT: ad.add_layer_norm %x, %r weight %w bias %b eps 1.000000e-05 : (tensor<2x?x64xbf16>, tensor<2x?x64xbf16> weight tensor<64xbf16> bias tensor<64xbf16>) -> (tensor<2x?x64xbf16>, tensor<2x?x64xbf16>)
  %6, %7 = ad.add_layer_norm %x, %r eps 1.000000e-05 : (tensor<2x?x64xbf16>, tensor<2x?x64xbf16>) -> (tensor<2x?x64xbf16>, tensor<2x?x64xbf16>)
  // CHECK-NEXT: ad.add_layer_norm %x, %r eps 1.000000e-05 : (tensor<2x?x64xbf16>, tensor<2x?x64xbf16>) -> (tensor<2x?x64xbf16>, tensor<2x?x64xbf16>)
  func.return
}

func.func @mlp_activations(%g: tensor<2x?x128xbf16>, %u: tensor<2x?x128xbf16>, %b: tensor<128xbf16>, %x: tensor<?x96xf32>) {
  // CHECK-LABEL: func.func @mlp_activations
  %0 = ad.gelu_and_mul %g, %u approximate "tanh" : (tensor<2x?x128xbf16>, tensor<2x?x128xbf16>) -> tensor<2x?x128xbf16>
  // CHECK-NEXT: ad.gelu_and_mul %g, %u approximate "tanh" : (tensor<2x?x128xbf16>, tensor<2x?x128xbf16>) -> tensor<2x?x128xbf16>
  %1 = ad.gelu_and_mul %g, %u : (tensor<2x?x128xbf16>, tensor<2x?x128xbf16>) -> tensor<2x?x128xbf16>
  // CHECK-NEXT: ad.gelu_and_mul %g, %u : (tensor<2x?x128xbf16>, tensor<2x?x128xbf16>) -> tensor<2x?x128xbf16>
  %2 = ad.activation "gelu_tanh" %g bias %b : (tensor<2x?x128xbf16>, tensor<128xbf16>) -> tensor<2x?x128xbf16>
  // CHECK-NEXT: ad.activation "gelu_tanh" %g bias %b : (tensor<2x?x128xbf16>, tensor<128xbf16>) -> tensor<2x?x128xbf16>
  %3 = ad.activation "relu2" %x : (tensor<?x96xf32>) -> tensor<?x96xf32>
  // CHECK-NEXT: ad.activation "relu2" %x : (tensor<?x96xf32>) -> tensor<?x96xf32>
  func.return
}

func.func @fp8_ops(%x: tensor<4x?x64xbf16>, %w: tensor<32x64xbf16>, %s: tensor<f32>) {
  // CHECK-LABEL: func.func @fp8_ops
  %q = ad.quantize_fp8 %x, %s : (tensor<4x?x64xbf16>, tensor<f32>) -> tensor<4x?x64xf8E4M3FN>
  // CHECK-NEXT: ad.quantize_fp8 %x, %s : (tensor<4x?x64xbf16>, tensor<f32>) -> tensor<4x?x64xf8E4M3FN>
  %qd, %sd = ad.quantize_fp8_dynamic %x per_token : tensor<4x?x64xbf16> -> (tensor<4x?x64xf8E4M3FN>, tensor<4x?x1xf32>)
  // CHECK-NEXT: ad.quantize_fp8_dynamic %x per_token : tensor<4x?x64xbf16> -> (tensor<4x?x64xf8E4M3FN>, tensor<4x?x1xf32>)
  %wq, %ws = ad.quantize_fp8_dynamic %w : tensor<32x64xbf16> -> (tensor<32x64xf8E4M3FN>, tensor<f32>)
  // CHECK-NEXT: ad.quantize_fp8_dynamic %w : tensor<32x64xbf16> -> (tensor<32x64xf8E4M3FN>, tensor<f32>)
  %y = ad.linear_fp8 %qd, %wq, %sd, %ws : (tensor<4x?x64xf8E4M3FN>, tensor<32x64xf8E4M3FN>, tensor<4x?x1xf32>, tensor<f32>) -> tensor<4x?x32xbf16>
  // CHECK-NEXT: ad.linear_fp8 %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} : (tensor<4x?x64xf8E4M3FN>, tensor<32x64xf8E4M3FN>, tensor<4x?x1xf32>, tensor<f32>) -> tensor<4x?x32xbf16>
  %d = ad.dequantize_fp8 %q, %s : (tensor<4x?x64xf8E4M3FN>, tensor<f32>) -> tensor<4x?x64xf32>
  // CHECK-NEXT: ad.dequantize_fp8 %{{.*}}, %s : (tensor<4x?x64xf8E4M3FN>, tensor<f32>) -> tensor<4x?x64xf32>
  func.return
}

func.func @linear_fp8_block(%x: tensor<4x?x256xbf16>, %w: tensor<192x256xf8E4M3FN>, %ws: tensor<2x2xf32>, %b: tensor<192xbf16>, %wr: tensor<40x50xf8E4M3FN>, %wrs: tensor<3x2xf32>, %xr: tensor<?x50xf32>) {
  // CHECK-LABEL: func.func @linear_fp8_block
  %0 = ad.linear_fp8_block %x, %w, %ws block [128, 128] : (tensor<4x?x256xbf16>, tensor<192x256xf8E4M3FN>, tensor<2x2xf32>) -> tensor<4x?x192xbf16>
  // CHECK-NEXT: ad.linear_fp8_block %x, %w, %ws block [128, 128] : (tensor<4x?x256xbf16>, tensor<192x256xf8E4M3FN>, tensor<2x2xf32>) -> tensor<4x?x192xbf16>
  %1 = ad.linear_fp8_block %x, %w, %ws bias %b block [128, 128] : (tensor<4x?x256xbf16>, tensor<192x256xf8E4M3FN>, tensor<2x2xf32>, tensor<192xbf16>) -> tensor<4x?x192xbf16>
  // CHECK-NEXT: ad.linear_fp8_block %x, %w, %ws bias %b block [128, 128] : (tensor<4x?x256xbf16>, tensor<192x256xf8E4M3FN>, tensor<2x2xf32>, tensor<192xbf16>) -> tensor<4x?x192xbf16>
  %2 = ad.linear_fp8_block %xr, %wr, %wrs block [16, 32] : (tensor<?x50xf32>, tensor<40x50xf8E4M3FN>, tensor<3x2xf32>) -> tensor<?x40xf32>
  // CHECK-NEXT: ad.linear_fp8_block %xr, %wr, %wrs block [16, 32] : (tensor<?x50xf32>, tensor<40x50xf8E4M3FN>, tensor<3x2xf32>) -> tensor<?x40xf32>
  func.return
}

func.func @linear_nvfp4(%x: tensor<4x?x64xbf16>, %w: tensor<48x32xui8>, %ws: tensor<48x4xf8E4M3FN>, %g: tensor<f32>, %gr: tensor<48xf32>, %b: tensor<48xbf16>) {
  // CHECK-LABEL: func.func @linear_nvfp4
  %0 = ad.linear_nvfp4 %x, %w, %ws, %g : (tensor<4x?x64xbf16>, tensor<48x32xui8>, tensor<48x4xf8E4M3FN>, tensor<f32>) -> tensor<4x?x48xbf16>
  // CHECK-NEXT: ad.linear_nvfp4 %x, %w, %ws, %g : (tensor<4x?x64xbf16>, tensor<48x32xui8>, tensor<48x4xf8E4M3FN>, tensor<f32>) -> tensor<4x?x48xbf16>
  %1 = ad.linear_nvfp4 %x, %w, %ws, %gr bias %b : (tensor<4x?x64xbf16>, tensor<48x32xui8>, tensor<48x4xf8E4M3FN>, tensor<48xf32>, tensor<48xbf16>) -> tensor<4x?x48xbf16>
  // CHECK-NEXT: ad.linear_nvfp4 %x, %w, %ws, %gr bias %b : (tensor<4x?x64xbf16>, tensor<48x32xui8>, tensor<48x4xf8E4M3FN>, tensor<48xf32>, tensor<48xbf16>) -> tensor<4x?x48xbf16>
  func.return
}

func.func @cached_attention_paged(%q: tensor<1x4x?x64xbf16>, %k: tensor<1x2x?x64xbf16>, %cos: tensor<1x?x64xbf16>, %kp: tensor<32x16x2x64xbf16>, %qs: tensor<?xi64>, %cs: tensor<?xi64>, %bt: tensor<?x8xi64>, %w4: tensor<4xbf16>, %db: tensor<1x4x?x6xbf16>, %kp8: tensor<32x16x2x64xf8E4M3FN>) {
  // CHECK-LABEL: func.func @cached_attention_paged
  %0 = ad.cached_attention %q, %k, %k rope %cos, %cos cache %kp, %kp block_tables %bt cache_starts %cs query_starts %qs : tensor<?xi64> scale 1.250000e-01 : (tensor<1x4x?x64xbf16>, tensor<1x2x?x64xbf16>, tensor<1x2x?x64xbf16>, tensor<32x16x2x64xbf16>, tensor<32x16x2x64xbf16>, tensor<?x8xi64>, tensor<?xi64>, tensor<1x?x64xbf16>, tensor<1x?x64xbf16>) -> tensor<1x4x?x64xbf16>
  // CHECK-NEXT: ad.cached_attention %q, %k, %k rope %cos, %cos cache %kp, %kp block_tables %bt cache_starts %cs query_starts %qs : tensor<?xi64> scale 1.250000e-01 : (tensor<1x4x?x64xbf16>, tensor<1x2x?x64xbf16>, tensor<1x2x?x64xbf16>, tensor<32x16x2x64xbf16>, tensor<32x16x2x64xbf16>, tensor<?x8xi64>, tensor<?xi64>, tensor<1x?x64xbf16>, tensor<1x?x64xbf16>) -> tensor<1x4x?x64xbf16>
  %1 = ad.cached_attention %q, %k, %k rope %cos, %cos interleaved cache %kp, %kp block_tables %bt cache_starts %cs query_starts %qs : tensor<?xi64> scale 1.250000e-01 window 4 softcap 5.000000e+01 sinks %w4 : tensor<4xbf16> alibi %w4 : tensor<4xbf16> : (tensor<1x4x?x64xbf16>, tensor<1x2x?x64xbf16>, tensor<1x2x?x64xbf16>, tensor<32x16x2x64xbf16>, tensor<32x16x2x64xbf16>, tensor<?x8xi64>, tensor<?xi64>, tensor<1x?x64xbf16>, tensor<1x?x64xbf16>) -> tensor<1x4x?x64xbf16>
  // CHECK-NEXT: ad.cached_attention %q, %k, %k rope %cos, %cos interleaved cache %kp, %kp block_tables %bt cache_starts %cs query_starts %qs : tensor<?xi64> scale 1.250000e-01 window 4 softcap 5.000000e+01 sinks %w4 : tensor<4xbf16> alibi %w4 : tensor<4xbf16> : (tensor<1x4x?x64xbf16>, tensor<1x2x?x64xbf16>, tensor<1x2x?x64xbf16>, tensor<32x16x2x64xbf16>, tensor<32x16x2x64xbf16>, tensor<?x8xi64>, tensor<?xi64>, tensor<1x?x64xbf16>, tensor<1x?x64xbf16>) -> tensor<1x4x?x64xbf16>
  %2 = ad.cached_attention %q, %k, %k cache %kp, %kp block_tables %bt cache_starts %cs query_starts %qs : tensor<?xi64> scale 1.250000e-01 distance_bias %db : tensor<1x4x?x6xbf16> : (tensor<1x4x?x64xbf16>, tensor<1x2x?x64xbf16>, tensor<1x2x?x64xbf16>, tensor<32x16x2x64xbf16>, tensor<32x16x2x64xbf16>, tensor<?x8xi64>, tensor<?xi64>) -> tensor<1x4x?x64xbf16>
  // CHECK-NEXT: ad.cached_attention %q, %k, %k cache %kp, %kp block_tables %bt cache_starts %cs query_starts %qs : tensor<?xi64> scale 1.250000e-01 distance_bias %db : tensor<1x4x?x6xbf16> : (tensor<1x4x?x64xbf16>, tensor<1x2x?x64xbf16>, tensor<1x2x?x64xbf16>, tensor<32x16x2x64xbf16>, tensor<32x16x2x64xbf16>, tensor<?x8xi64>, tensor<?xi64>) -> tensor<1x4x?x64xbf16>
  // FP8 K/V cache: e4m3 pools with their per-tensor scales.
  %3 = ad.cached_attention %q, %k, %k rope %cos, %cos cache %kp8, %kp8 kv_scales 1.000000e+00, 5.000000e-01 block_tables %bt cache_starts %cs query_starts %qs : tensor<?xi64> scale 1.250000e-01 : (tensor<1x4x?x64xbf16>, tensor<1x2x?x64xbf16>, tensor<1x2x?x64xbf16>, tensor<32x16x2x64xf8E4M3FN>, tensor<32x16x2x64xf8E4M3FN>, tensor<?x8xi64>, tensor<?xi64>, tensor<1x?x64xbf16>, tensor<1x?x64xbf16>) -> tensor<1x4x?x64xbf16>
  // CHECK-NEXT: ad.cached_attention %q, %k, %k rope %cos, %cos cache %kp8, %kp8 kv_scales 1.000000e+00, 5.000000e-01 block_tables %bt cache_starts %cs query_starts %qs : tensor<?xi64> scale 1.250000e-01 : (tensor<1x4x?x64xbf16>, tensor<1x2x?x64xbf16>, tensor<1x2x?x64xbf16>, tensor<32x16x2x64xf8E4M3FN>, tensor<32x16x2x64xf8E4M3FN>, tensor<?x8xi64>, tensor<?xi64>, tensor<1x?x64xbf16>, tensor<1x?x64xbf16>) -> tensor<1x4x?x64xbf16>
  func.return
}

func.func @cached_attention(%q: tensor<?x4x?x64xbf16>, %k: tensor<?x2x?x64xbf16>, %cos: tensor<?x?x64xbf16>, %kc: tensor<8x512x2x64xbf16>, %s: tensor<?xi64>, %w: tensor<64xf32>, %part: tensor<?x?x16xbf16>, %w4: tensor<4xbf16>, %part2: tensor<?x2x?x32xbf16>, %vc32: tensor<8x512x2x32xbf16>, %db: tensor<?x4x?x6xf32>, %sel: tensor<?x?x2xi64>, %bt: tensor<?x1xi64>) {
  // CHECK-LABEL: func.func @cached_attention
  %0 = ad.cached_attention %q, %k, %k rope %cos, %cos cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>, tensor<?x?x64xbf16>, tensor<?x?x64xbf16>) -> tensor<?x4x?x64xbf16>
  // CHECK-NEXT: ad.cached_attention %q, %k, %k rope %cos, %cos cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>, tensor<?x?x64xbf16>, tensor<?x?x64xbf16>) -> tensor<?x4x?x64xbf16>
  %q1 = ad.cached_attention %q, %k, %k rope %cos, %cos qk_norm(%w, %w : tensor<64xf32>, tensor<64xf32>) eps 1.000000e-06 offset 1.000000e+00 weight_in_fp32 cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>, tensor<?x?x64xbf16>, tensor<?x?x64xbf16>) -> tensor<?x4x?x64xbf16>
  // CHECK-NEXT: ad.cached_attention %q, %k, %k rope %cos, %cos qk_norm(%w, %w : tensor<64xf32>, tensor<64xf32>) eps 1.000000e-06 offset 1.000000e+00 weight_in_fp32 cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>, tensor<?x?x64xbf16>, tensor<?x?x64xbf16>) -> tensor<?x4x?x64xbf16>
  %1 = ad.cached_attention %q, %k, %k cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 window 128 : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x64xbf16>
  // CHECK-NEXT: ad.cached_attention %q, %k, %k cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 window 128 : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x64xbf16>
  %2 = ad.cached_attention %q, %k, %k rope %cos, %cos cache %kc, %kc block_tables %bt cache_starts %s scale 6.250000e-02 window 4096 softcap 5.000000e+01 : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>, tensor<?x?x64xbf16>, tensor<?x?x64xbf16>) -> tensor<?x4x?x64xbf16>
  // CHECK-NEXT: ad.cached_attention %q, %k, %k rope %cos, %cos cache %kc, %kc block_tables %bt cache_starts %s scale 6.250000e-02 window 4096 softcap 5.000000e+01 : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>, tensor<?x?x64xbf16>, tensor<?x?x64xbf16>) -> tensor<?x4x?x64xbf16>
  // gpt-oss: a sink logit per query head, a sliding window, no RoPE (applied before).
  %sinks = ad.cached_attention %q, %k, %k cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 window 128 sinks %w4 : tensor<4xbf16> : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x64xbf16>
  // CHECK-NEXT: ad.cached_attention %q, %k, %k cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 window 128 sinks %w4 : tensor<4xbf16> : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x64xbf16>
  // BLOOM: ALiBi slopes per query head.
  %alibi = ad.cached_attention %q, %k, %k cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 alibi %w4 : tensor<4xbf16> : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x64xbf16>
  // CHECK-NEXT: ad.cached_attention %q, %k, %k cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 alibi %w4 : tensor<4xbf16> : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x64xbf16>
  // Inkling: each new token's bias over its 6 backward distances, per query head.
  %dist = ad.cached_attention %q, %k, %k cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 distance_bias %db : tensor<?x4x?x6xf32> : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x64xbf16>
  // CHECK-NEXT: ad.cached_attention %q, %k, %k cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 distance_bias %db : tensor<?x4x?x6xf32> : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x64xbf16>
  // DeepSeek-V4's HCA at compress rate 1: compressed entries (keys and values) in a cache of their own.
  %v4 = ad.cached_attention %q, %k, %k cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 window 128 sinks %w4 : tensor<4xbf16> compressed %k, %kc : tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16> : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x64xbf16>
  // CHECK-NEXT: ad.cached_attention %q, %k, %k cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 window 128 sinks %w4 : tensor<4xbf16> compressed %k, %kc : tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16> : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x64xbf16>
  // DeepSeek-V4's CSA: only the entries its indexer chose (-1: none).
  %v4s = ad.cached_attention %q, %k, %k cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 window 128 sinks %w4 : tensor<4xbf16> compressed %k, %kc : tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16> selected %sel : tensor<?x?x2xi64> : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x64xbf16>
  // CHECK-NEXT: ad.cached_attention %q, %k, %k cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 window 128 sinks %w4 : tensor<4xbf16> compressed %k, %kc : tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16> selected %sel : tensor<?x?x2xi64> : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x64xbf16>
  // DeepSeek's heads: the value (its cache and the result) 32 wide, the query and key 64.
  %mla = ad.cached_attention %q, %k, %part2 cache %kc, %vc32 block_tables %bt cache_starts %s scale 1.250000e-01 : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x32xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x32xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x32xbf16>
  // CHECK-NEXT: ad.cached_attention %q, %k, %part2 cache %kc, %vc32 block_tables %bt cache_starts %s scale 1.250000e-01 : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x32xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x32xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x32xbf16>
  // Partial rotary (the tables' width: 16 of 64 dims), interleaved pairs.
  %3 = ad.cached_attention %q, %k, %k rope %part, %part interleaved cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>, tensor<?x?x16xbf16>, tensor<?x?x16xbf16>) -> tensor<?x4x?x64xbf16>
  // CHECK-NEXT: ad.cached_attention %q, %k, %k rope %part, %part interleaved cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>, tensor<?x?x16xbf16>, tensor<?x?x16xbf16>) -> tensor<?x4x?x64xbf16>
  func.return
}

// MLA at DeepSeek-V3's sizes: 128 heads of nope 128 + rope 64, value 128, a latent cache of 512 + 64
// (the slot form: 8 slots of 4096 tokens, each one page, the block tables one page wide).
func.func @cached_mla_attention(%qn: tensor<?x128x?x128xbf16>, %qr: tensor<?x128x?x64xbf16>, %lat: tensor<?x1x?x512xbf16>, %kr: tensor<?x1x?x64xbf16>, %w: tensor<32768x512xbf16>, %c: tensor<8x4096x576xbf16>, %bt: tensor<?x1xi64>, %s: tensor<?xi64>) {
  // CHECK-LABEL: func.func @cached_mla_attention
  %0 = ad.cached_mla_attention %qn, %qr, %lat, %kr kv_b %w cache %c block_tables %bt cache_starts %s scale 1.250000e-01 : (tensor<?x128x?x128xbf16>, tensor<?x128x?x64xbf16>, tensor<?x1x?x512xbf16>, tensor<?x1x?x64xbf16>, tensor<32768x512xbf16>, tensor<8x4096x576xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x128x?x128xbf16>
  // CHECK-NEXT: ad.cached_mla_attention %qn, %qr, %lat, %kr kv_b %w cache %c block_tables %bt cache_starts %s scale 1.250000e-01 : (tensor<?x128x?x128xbf16>, tensor<?x128x?x64xbf16>, tensor<?x1x?x512xbf16>, tensor<?x1x?x64xbf16>, tensor<32768x512xbf16>, tensor<8x4096x576xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x128x?x128xbf16>
  func.return
}

// DeepSeek-V3.2's sparse attention: the indexer (64 heads of 128, top 2048 of an index-key cache
// of 128 per token) and the MLA restricted to its selection; HY-V4's sink logits.
func.func @cached_sparse_mla_attention(%qn: tensor<?x128x?x128xbf16>, %qr: tensor<?x128x?x64xbf16>, %lat: tensor<?x1x?x512xbf16>, %kr: tensor<?x1x?x64xbf16>, %w: tensor<32768x512xbf16>, %c: tensor<8x4096x576xbf16>, %bt: tensor<?x1xi64>, %s: tensor<?xi64>, %iq: tensor<?x?x64x128xbf16>, %ik: tensor<?x?x128xbf16>, %iw: tensor<?x?x64xf32>, %ic: tensor<8x4096x128xbf16>, %sinks: tensor<128xf32>) {
  // CHECK-LABEL: func.func @cached_sparse_mla_attention
  %sel = ad.cached_index_topk %iq, %ik, %iw cache %ic slots %s starts %s scale 0.088388347648318447 topk 2048 : (tensor<?x?x64x128xbf16>, tensor<?x?x128xbf16>, tensor<?x?x64xf32>, tensor<8x4096x128xbf16>, tensor<?xi64>, tensor<?xi64>) -> tensor<?x?x2048xi64>
  // CHECK-NEXT: %sel = ad.cached_index_topk %iq, %ik, %iw cache %ic slots %s starts %s scale 0.088388347648318447 topk 2048 : (tensor<?x?x64x128xbf16>, tensor<?x?x128xbf16>, tensor<?x?x64xf32>, tensor<8x4096x128xbf16>, tensor<?xi64>, tensor<?xi64>) -> tensor<?x?x2048xi64>
  %0 = ad.cached_mla_attention %qn, %qr, %lat, %kr kv_b %w cache %c block_tables %bt cache_starts %s selected %sel : tensor<?x?x2048xi64> sinks %sinks : tensor<128xf32> scale 1.250000e-01 : (tensor<?x128x?x128xbf16>, tensor<?x128x?x64xbf16>, tensor<?x1x?x512xbf16>, tensor<?x1x?x64xbf16>, tensor<32768x512xbf16>, tensor<8x4096x576xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x128x?x128xbf16>
  // CHECK-NEXT: ad.cached_mla_attention %qn, %qr, %lat, %kr kv_b %w cache %c block_tables %bt cache_starts %s selected %sel : tensor<?x?x2048xi64> sinks %sinks : tensor<128xf32> scale 1.250000e-01 : (tensor<?x128x?x128xbf16>, tensor<?x128x?x64xbf16>, tensor<?x1x?x512xbf16>, tensor<?x1x?x64xbf16>, tensor<32768x512xbf16>, tensor<8x4096x576xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x128x?x128xbf16>
  func.return
}

// Mamba1's selective scan at Falcon-Mamba-7B's sizes (8192 channels, state 16), with and without D, z and dt_bias.
func.func @cached_selective_scan(%x: tensor<?x8192x?xbf16>, %a: tensor<8192x16xf32>, %b: tensor<?x16x?xbf16>, %d: tensor<8192xf32>, %st: tensor<8x8192x16xf32>, %s: tensor<?xi64>) {
  // CHECK-LABEL: func.func @cached_selective_scan
  %0 = ad.cached_selective_scan %x, %x, %a, %b, %b d %d z %x dt_bias %d dt_softplus state %st slots %s starts %s : (tensor<?x8192x?xbf16>, tensor<?x8192x?xbf16>, tensor<8192x16xf32>, tensor<?x16x?xbf16>, tensor<?x16x?xbf16>, tensor<8x8192x16xf32>, tensor<?xi64>, tensor<?xi64>, d tensor<8192xf32>, z tensor<?x8192x?xbf16>, dt_bias tensor<8192xf32>) -> tensor<?x8192x?xf32>
  // CHECK-NEXT: ad.cached_selective_scan %x, %x, %a, %b, %b d %d z %x dt_bias %d dt_softplus state %st slots %s starts %s : (tensor<?x8192x?xbf16>, tensor<?x8192x?xbf16>, tensor<8192x16xf32>, tensor<?x16x?xbf16>, tensor<?x16x?xbf16>, tensor<8x8192x16xf32>, tensor<?xi64>, tensor<?xi64>, d tensor<8192xf32>, z tensor<?x8192x?xbf16>, dt_bias tensor<8192xf32>) -> tensor<?x8192x?xf32>
  %1 = ad.cached_selective_scan %x, %x, %a, %b, %b state %st slots %s starts %s : (tensor<?x8192x?xbf16>, tensor<?x8192x?xbf16>, tensor<8192x16xf32>, tensor<?x16x?xbf16>, tensor<?x16x?xbf16>, tensor<8x8192x16xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<?x8192x?xbf16>
  // CHECK-NEXT: ad.cached_selective_scan %x, %x, %a, %b, %b state %st slots %s starts %s : (tensor<?x8192x?xbf16>, tensor<?x8192x?xbf16>, tensor<8192x16xf32>, tensor<?x16x?xbf16>, tensor<?x16x?xbf16>, tensor<8x8192x16xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<?x8192x?xbf16>
  func.return
}

// The paged form's state ops: one flattened batch of sequences (query_starts), each sequence's
// state slot and start.
func.func @state_ops_over_flattened_sequences(%x: tensor<1x8x?xf32>, %w: tensor<8x1x3xf32>, %cs: tensor<4x8x2xf32>, %q: tensor<1x?x2x16xf32>, %v: tensor<1x?x4x8xf32>, %g: tensor<1x?x4xf32>, %rs: tensor<4x4x16x8xf32>, %s: tensor<?xi64>) {
  // CHECK-LABEL: func.func @state_ops_over_flattened_sequences
  %0 = ad.cached_causal_conv1d %x, %w state %cs slots %s starts %s query_starts %s : tensor<?xi64> : (tensor<1x8x?xf32>, tensor<8x1x3xf32>, tensor<4x8x2xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<1x8x?xf32>
  // CHECK-NEXT: ad.cached_causal_conv1d %x, %w state %cs slots %s starts %s query_starts %s : tensor<?xi64> : (tensor<1x8x?xf32>, tensor<8x1x3xf32>, tensor<4x8x2xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<1x8x?xf32>
  %1 = ad.cached_gated_delta_rule %q, %q, %v, %g, %g state %rs slots %s starts %s query_starts %s : tensor<?xi64> : (tensor<1x?x2x16xf32>, tensor<1x?x2x16xf32>, tensor<1x?x4x8xf32>, tensor<1x?x4xf32>, tensor<1x?x4xf32>, tensor<4x4x16x8xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<1x?x4x8xf32>
  // CHECK-NEXT: ad.cached_gated_delta_rule %q, %q, %v, %g, %g state %rs slots %s starts %s query_starts %s : tensor<?xi64> : (tensor<1x?x2x16xf32>, tensor<1x?x2x16xf32>, tensor<1x?x4x8xf32>, tensor<1x?x4xf32>, tensor<1x?x4xf32>, tensor<4x4x16x8xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<1x?x4x8xf32>
  func.return
}

func.func @rope_attention(%q: tensor<2x4x?x64xbf16>, %k: tensor<2x2x?x64xbf16>, %cos: tensor<1x?x64xf32>, %m: tensor<1x1x?x?xi1>, %wq: tensor<64xbf16>, %wk: tensor<64xbf16>, %wf: tensor<64xf32>, %part: tensor<1x?x32xf32>) {
  // CHECK-LABEL: func.func @rope_attention
  %0 = ad.rope_attention %q, %k, %k rope %cos, %cos mask %m scale 1.250000e-01 : (tensor<2x4x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<1x?x64xf32>, tensor<1x?x64xf32>, tensor<1x1x?x?xi1>) -> tensor<2x4x?x64xbf16>
  // CHECK-NEXT: ad.rope_attention %q, %k, %k rope %cos, %cos mask %m scale 1.250000e-01 : (tensor<2x4x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<1x?x64xf32>, tensor<1x?x64xf32>, tensor<1x1x?x?xi1>) -> tensor<2x4x?x64xbf16>
  %1 = ad.rope_attention %q, %k, %k rope %cos, %cos causal scale 1.250000e-01 : (tensor<2x4x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<1x?x64xf32>, tensor<1x?x64xf32>) -> tensor<2x4x?x64xbf16>
  // CHECK-NEXT: ad.rope_attention %q, %k, %k rope %cos, %cos causal scale 1.250000e-01 : (tensor<2x4x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<1x?x64xf32>, tensor<1x?x64xf32>) -> tensor<2x4x?x64xbf16>
  // Partial rotary (32 of 64 dims: the tables' width), interleaved pairs.
  %2 = ad.rope_attention %q, %k, %k rope %part, %part interleaved mask %m causal scale 1.250000e-01 : (tensor<2x4x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<1x?x32xf32>, tensor<1x?x32xf32>, tensor<1x1x?x?xi1>) -> tensor<2x4x?x64xbf16>
  // CHECK-NEXT: ad.rope_attention %q, %k, %k rope %part, %part interleaved mask %m causal scale 1.250000e-01 : (tensor<2x4x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<1x?x32xf32>, tensor<1x?x32xf32>, tensor<1x1x?x?xi1>) -> tensor<2x4x?x64xbf16>
  // A sliding window and a soft cap.
  %3 = ad.rope_attention %q, %k, %k rope %cos, %cos causal window 4096 softcap 5.000000e+01 scale 1.250000e-01 : (tensor<2x4x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<1x?x64xf32>, tensor<1x?x64xf32>) -> tensor<2x4x?x64xbf16>
  // CHECK-NEXT: ad.rope_attention %q, %k, %k rope %cos, %cos causal window 4096 softcap 5.000000e+01 scale 1.250000e-01 : (tensor<2x4x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<1x?x64xf32>, tensor<1x?x64xf32>) -> tensor<2x4x?x64xbf16>
  %qn = ad.rope_attention %q, %k, %k rope %cos, %cos qk_norm(%wq, %wk : tensor<64xbf16>, tensor<64xbf16>) eps 1.000000e-06 mask %m scale 1.250000e-01 : (tensor<2x4x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<1x?x64xf32>, tensor<1x?x64xf32>, tensor<1x1x?x?xi1>) -> tensor<2x4x?x64xbf16>
  // CHECK-NEXT: ad.rope_attention %q, %k, %k rope %cos, %cos qk_norm(%wq, %wk : tensor<64xbf16>, tensor<64xbf16>) eps 1.000000e-06 mask %m scale 1.250000e-01 : (tensor<2x4x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<1x?x64xf32>, tensor<1x?x64xf32>, tensor<1x1x?x?xi1>) -> tensor<2x4x?x64xbf16>
  %qn1 = ad.rope_attention %q, %k, %k rope %cos, %cos qk_norm(%wf, %wf : tensor<64xf32>, tensor<64xf32>) eps 1.000000e-06 offset 1.000000e+00 weight_in_fp32 causal scale 1.250000e-01 : (tensor<2x4x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<1x?x64xf32>, tensor<1x?x64xf32>) -> tensor<2x4x?x64xbf16>
  // CHECK-NEXT: ad.rope_attention %q, %k, %k rope %cos, %cos qk_norm(%wf, %wf : tensor<64xf32>, tensor<64xf32>) eps 1.000000e-06 offset 1.000000e+00 weight_in_fp32 causal scale 1.250000e-01 : (tensor<2x4x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<1x?x64xf32>, tensor<1x?x64xf32>) -> tensor<2x4x?x64xbf16>
  // Every property together.
  %4 = ad.rope_attention %q, %k, %k rope %part, %part interleaved mask %m causal window 16 softcap 3.000000e+01 scale 1.250000e-01 : (tensor<2x4x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<1x?x32xf32>, tensor<1x?x32xf32>, tensor<1x1x?x?xi1>) -> tensor<2x4x?x64xbf16>
  // CHECK-NEXT: ad.rope_attention %q, %k, %k rope %part, %part interleaved mask %m causal window 16 softcap 3.000000e+01 scale 1.250000e-01 : (tensor<2x4x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<1x?x32xf32>, tensor<1x?x32xf32>, tensor<1x1x?x?xi1>) -> tensor<2x4x?x64xbf16>
  func.return
}

func.func @rope(%q: tensor<2x4x?x64xbf16>, %k: tensor<2x2x?x64xbf16>, %cos: tensor<1x?x64xbf16>, %part: tensor<1x?x20xbf16>) {
  // CHECK-LABEL: func.func @rope
  %0, %1 = ad.rope %q, %k rope %cos, %cos : (tensor<2x4x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<1x?x64xbf16>, tensor<1x?x64xbf16>) -> (tensor<2x4x?x64xbf16>, tensor<2x2x?x64xbf16>)
  // CHECK-NEXT: ad.rope %q, %k rope %cos, %cos : (tensor<2x4x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<1x?x64xbf16>, tensor<1x?x64xbf16>) -> (tensor<2x4x?x64xbf16>, tensor<2x2x?x64xbf16>)
  %2, %3 = ad.rope %q, %k rope %part, %part interleaved : (tensor<2x4x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<1x?x20xbf16>, tensor<1x?x20xbf16>) -> (tensor<2x4x?x64xbf16>, tensor<2x2x?x64xbf16>)
  // CHECK-NEXT: ad.rope %q, %k rope %part, %part interleaved : (tensor<2x4x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<1x?x20xbf16>, tensor<1x?x20xbf16>) -> (tensor<2x4x?x64xbf16>, tensor<2x2x?x64xbf16>)
  func.return
}

func.func @collectives(%x: tensor<4x?xbf16>) {
  // CHECK-LABEL: func.func @collectives
  %0 = ad.all_reduce %x "sum" group "0" : tensor<4x?xbf16> -> tensor<4x?xbf16>
  // CHECK-NEXT: %[[R:.*]] = ad.all_reduce %x "sum" group "0" : tensor<4x?xbf16> -> tensor<4x?xbf16>
  %1 = ad.wait_tensor %0 : tensor<4x?xbf16> -> tensor<4x?xbf16>
  // CHECK-NEXT: ad.wait_tensor %[[R]] : tensor<4x?xbf16> -> tensor<4x?xbf16>
  func.return
}

func.func @moe(%x: tensor<?x48xbf16>, %l: tensor<?x4xbf16>, %gu: tensor<6x64x48xbf16>, %d: tensor<6x48x32xbf16>, %g: tensor<?x1xbf16>) {
  // CHECK-LABEL: func.func @moe
  %0 = ad.moe %x, %l experts %gu, %d shared 2 gate %g top_k 2 normalize round_weights : (tensor<?x48xbf16>, tensor<?x4xbf16>, tensor<6x64x48xbf16>, tensor<6x48x32xbf16>, tensor<?x1xbf16>) -> tensor<?x48xbf16>
  // CHECK-NEXT: ad.moe %x, %l experts %gu, %d shared 2 gate %g top_k 2 normalize round_weights : (tensor<?x48xbf16>, tensor<?x4xbf16>, tensor<6x64x48xbf16>, tensor<6x48x32xbf16>, tensor<?x1xbf16>) -> tensor<?x48xbf16>
  %1 = ad.moe %x, %l experts %gu, %d shared 2 top_k 1 : (tensor<?x48xbf16>, tensor<?x4xbf16>, tensor<6x64x48xbf16>, tensor<6x48x32xbf16>) -> tensor<?x48xbf16>
  // CHECK-NEXT: ad.moe %x, %l experts %gu, %d shared 2 top_k 1 : (tensor<?x48xbf16>, tensor<?x4xbf16>, tensor<6x64x48xbf16>, tensor<6x48x32xbf16>) -> tensor<?x48xbf16>
  func.return
}

// gpt-oss's MoE on MXFP4 experts: hidden 64, intermediate 96, 4 experts, top 2.
func.func @moe_mxfp4(%x: tensor<?x64xbf16>, %l: tensor<?x4xbf16>, %gub: tensor<4x192x2x16xui8>, %gus: tensor<4x192x2xui8>, %gb: tensor<4x192xbf16>, %db: tensor<4x64x3x16xui8>, %ds: tensor<4x64x3xui8>, %b: tensor<4x64xbf16>) {
  // CHECK-LABEL: func.func @moe_mxfp4
  %0 = ad.moe_mxfp4 %x, %l gate_up %gub, %gus, %gb down %db, %ds, %b top_k 2 alpha 1.702000e+00 limit 7.000000e+00 : (tensor<?x64xbf16>, tensor<?x4xbf16>, tensor<4x192x2x16xui8>, tensor<4x192x2xui8>, tensor<4x192xbf16>, tensor<4x64x3x16xui8>, tensor<4x64x3xui8>, tensor<4x64xbf16>) -> tensor<?x64xbf16>
  // CHECK-NEXT: ad.moe_mxfp4 %x, %l gate_up %gub, %gus, %gb down %db, %ds, %b top_k 2 alpha 1.702000e+00 limit 7.000000e+00 : (tensor<?x64xbf16>, tensor<?x4xbf16>, tensor<4x192x2x16xui8>, tensor<4x192x2xui8>, tensor<4x192xbf16>, tensor<4x64x3x16xui8>, tensor<4x64x3xui8>, tensor<4x64xbf16>) -> tensor<?x64xbf16>
  func.return
}

// MoE experts on fine-grained FP8 weights from the router's choices: hidden 256, intermediate 128, 4 experts, top 2, blocks [128, 128].
func.func @moe_fp8_block(%x: tensor<?x256xbf16>, %ids: tensor<?x2xi64>, %w: tensor<?x2xf32>, %gu: tensor<4x256x256xf8E4M3FN>, %gus: tensor<4x2x2xf32>, %dn: tensor<4x256x128xf8E4M3FN>, %dns: tensor<4x2x1xf32>) {
  // CHECK-LABEL: func.func @moe_fp8_block
  %0 = ad.moe_fp8_block %x, %ids, %w gate_up %gu, %gus down %dn, %dns block [128, 128] : (tensor<?x256xbf16>, tensor<?x2xi64>, tensor<?x2xf32>, tensor<4x256x256xf8E4M3FN>, tensor<4x2x2xf32>, tensor<4x256x128xf8E4M3FN>, tensor<4x2x1xf32>) -> tensor<?x256xbf16>
  // CHECK-NEXT: ad.moe_fp8_block %x, %ids, %w gate_up %gu, %gus down %dn, %dns block [128, 128] : (tensor<?x256xbf16>, tensor<?x2xi64>, tensor<?x2xf32>, tensor<4x256x256xf8E4M3FN>, tensor<4x2x2xf32>, tensor<4x256x128xf8E4M3FN>, tensor<4x2x1xf32>) -> tensor<?x256xbf16>
  func.return
}

// MLA in the paged form at DeepSeek-V3's sizes: one flattened batch over a pool of 512 pages of 64 latents (512 + 64).
func.func @cached_mla_attention_paged(%qn: tensor<1x128x?x128xbf16>, %qr: tensor<1x128x?x64xbf16>, %lat: tensor<1x1x?x512xbf16>, %kr: tensor<1x1x?x64xbf16>, %w: tensor<32768x512xbf16>, %p: tensor<512x64x576xbf16>, %qs: tensor<?xi64>, %cs: tensor<?xi64>, %bt: tensor<?x?xi64>) {
  // CHECK-LABEL: func.func @cached_mla_attention_paged
  %0 = ad.cached_mla_attention %qn, %qr, %lat, %kr kv_b %w cache %p block_tables %bt cache_starts %cs query_starts %qs : tensor<?xi64> scale 1.250000e-01 : (tensor<1x128x?x128xbf16>, tensor<1x128x?x64xbf16>, tensor<1x1x?x512xbf16>, tensor<1x1x?x64xbf16>, tensor<32768x512xbf16>, tensor<512x64x576xbf16>, tensor<?x?xi64>, tensor<?xi64>) -> tensor<1x128x?x128xbf16>
  // CHECK-NEXT: ad.cached_mla_attention %qn, %qr, %lat, %kr kv_b %w cache %p block_tables %bt cache_starts %cs query_starts %qs : tensor<?xi64> scale 1.250000e-01 : (tensor<1x128x?x128xbf16>, tensor<1x128x?x64xbf16>, tensor<1x1x?x512xbf16>, tensor<1x1x?x64xbf16>, tensor<32768x512xbf16>, tensor<512x64x576xbf16>, tensor<?x?xi64>, tensor<?xi64>) -> tensor<1x128x?x128xbf16>
  func.return
}

// A cached token window: ZAYA's 2 q/k inputs before a step ([slots, channels, 2] along the last
// axis), and its one delayed value before a step, a sequence starting from its start row.
func.func @cached_token_window(%x: tensor<?x192x?xbf16>, %st: tensor<8x192x2xbf16>, %v: tensor<?x?x32xbf16>, %v0: tensor<?x1x32xbf16>, %vst: tensor<8x1x32xbf16>, %s: tensor<?xi64>, %vf: tensor<1x?x32xbf16>, %vf0: tensor<1x1x32xbf16>) {
  // CHECK-LABEL: func.func @cached_token_window
  %0 = ad.cached_token_window %x state %st slots %s starts %s dim 2 : (tensor<?x192x?xbf16>, tensor<8x192x2xbf16>, tensor<?xi64>, tensor<?xi64>) -> tensor<?x192x?xbf16>
  // CHECK-NEXT: ad.cached_token_window %x state %st slots %s starts %s dim 2 : (tensor<?x192x?xbf16>, tensor<8x192x2xbf16>, tensor<?xi64>, tensor<?xi64>) -> tensor<?x192x?xbf16>
  %1 = ad.cached_token_window %v initial %v0 state %vst slots %s starts %s dim 1 : (tensor<?x?x32xbf16>, tensor<8x1x32xbf16>, tensor<?xi64>, tensor<?xi64>, tensor<?x1x32xbf16>) -> tensor<?x?x32xbf16>
  // CHECK-NEXT: ad.cached_token_window %v initial %v0 state %vst slots %s starts %s dim 1 : (tensor<?x?x32xbf16>, tensor<8x1x32xbf16>, tensor<?xi64>, tensor<?xi64>, tensor<?x1x32xbf16>) -> tensor<?x?x32xbf16>
  // The paged form: one flattened batch, each token's row one back in its own sequence (the input's type).
  %2 = ad.cached_token_window %vf initial %vf0 state %vst slots %s starts %s query_starts %s : tensor<?xi64> dim 1 : (tensor<1x?x32xbf16>, tensor<8x1x32xbf16>, tensor<?xi64>, tensor<?xi64>, tensor<1x1x32xbf16>) -> tensor<1x?x32xbf16>
  // CHECK-NEXT: ad.cached_token_window %vf initial %vf0 state %vst slots %s starts %s query_starts %s : tensor<?xi64> dim 1 : (tensor<1x?x32xbf16>, tensor<8x1x32xbf16>, tensor<?xi64>, tensor<?xi64>, tensor<1x1x32xbf16>) -> tensor<1x?x32xbf16>
  func.return
}

// RecurrentGemma's RG-LRU at recurrent-gemma-2b's width (2560), slot and paged forms.
func.func @cached_rg_lru(%x: tensor<?x?x2560xbf16>, %f: tensor<1x?x2560xbf16>, %st: tensor<8x2560xf32>, %s: tensor<?xi64>) {
  // CHECK-LABEL: func.func @cached_rg_lru
  %0 = ad.cached_rg_lru %x, %x state %st slots %s starts %s : (tensor<?x?x2560xbf16>, tensor<?x?x2560xbf16>, tensor<8x2560xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<?x?x2560xbf16>
  // CHECK-NEXT: ad.cached_rg_lru %x, %x state %st slots %s starts %s : (tensor<?x?x2560xbf16>, tensor<?x?x2560xbf16>, tensor<8x2560xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<?x?x2560xbf16>
  %1 = ad.cached_rg_lru %f, %f state %st slots %s starts %s query_starts %s : tensor<?xi64> : (tensor<1x?x2560xbf16>, tensor<1x?x2560xbf16>, tensor<8x2560xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<1x?x2560xbf16>
  // CHECK-NEXT: ad.cached_rg_lru %f, %f state %st slots %s starts %s query_starts %s : tensor<?xi64> : (tensor<1x?x2560xbf16>, tensor<1x?x2560xbf16>, tensor<8x2560xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<1x?x2560xbf16>
  func.return
}

// RWKV's time mixing at RWKV-4 1.5B's width (2048), slot and paged forms.
func.func @cached_wkv(%w: tensor<2048xf32>, %x: tensor<?x?x2048xbf16>, %f: tensor<1x?x2048xbf16>, %st: tensor<8x3x2048xf32>, %s: tensor<?xi64>) {
  // CHECK-LABEL: func.func @cached_wkv
  %0 = ad.cached_wkv %w, %w, %x, %x state %st slots %s starts %s : (tensor<2048xf32>, tensor<2048xf32>, tensor<?x?x2048xbf16>, tensor<?x?x2048xbf16>, tensor<8x3x2048xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<?x?x2048xbf16>
  // CHECK-NEXT: ad.cached_wkv %w, %w, %x, %x state %st slots %s starts %s : (tensor<2048xf32>, tensor<2048xf32>, tensor<?x?x2048xbf16>, tensor<?x?x2048xbf16>, tensor<8x3x2048xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<?x?x2048xbf16>
  %1 = ad.cached_wkv %w, %w, %f, %f state %st slots %s starts %s query_starts %s : tensor<?xi64> : (tensor<2048xf32>, tensor<2048xf32>, tensor<1x?x2048xbf16>, tensor<1x?x2048xbf16>, tensor<8x3x2048xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<1x?x2048xbf16>
  // CHECK-NEXT: ad.cached_wkv %w, %w, %f, %f state %st slots %s starts %s query_starts %s : tensor<?xi64> : (tensor<2048xf32>, tensor<2048xf32>, tensor<1x?x2048xbf16>, tensor<1x?x2048xbf16>, tensor<8x3x2048xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<1x?x2048xbf16>
  func.return
}
