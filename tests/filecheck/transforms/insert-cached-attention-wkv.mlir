// insert-cached-attention on RWKV's time mixing as the export patches route HF's
// `rwkv_linear_attention` (w = -exp(time_decay) and u [width], k and v [batch, seq, width]): an
// opaque op over the whole sequence becomes ad.cached_wkv over an fp32 state [slots, 3, width].
// RUN: ad-opt %s -p 'insert-cached-attention{max-batch=2 max-seq-len=16}' | filecheck %s

// CHECK-LABEL: func.func @wkv
// CHECK-SAME:  %wkv_state{{.*}}: tensor<2x3x32xf32> {ad.input = "wkv_state_0", ad.cache = "rwkv.blocks.0.attention wkv_state"}
// CHECK-NOT:   ad_mlir.wkv_scan
// CHECK:       %[[O:.*]] = ad.cached_wkv %w, %u, %k, %v state %wkv_state{{.*}} slots %cache_slots starts %cache_starts : (tensor<32xf32>, tensor<32xf32>, tensor<1x?x32xf32>, tensor<1x?x32xf32>, tensor<2x3x32xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<1x?x32xf32>
// CHECK-NEXT:  func.return %[[O]]
func.func @wkv(%w: tensor<32xf32> {ad.input = "w"}, %u: tensor<32xf32> {ad.input = "u"}, %k: tensor<1x?x32xf32> {ad.input = "k"}, %v: tensor<1x?x32xf32> {ad.input = "v"}) -> tensor<1x?x32xf32> {
  %y = ad.torch_op "ad_mlir.wkv_scan.default"(%w, %u, %k, %v) [#ad.ref<0>, #ad.ref<1>, #ad.ref<2>, #ad.ref<3>] {} : (tensor<32xf32>, tensor<32xf32>, tensor<1x?x32xf32>, tensor<1x?x32xf32>) -> tensor<1x?x32xf32> loc("rwkv.blocks.0.attention")
  func.return %y : tensor<1x?x32xf32>
}
