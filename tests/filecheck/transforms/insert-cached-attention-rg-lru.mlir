// insert-cached-attention on RecurrentGemma's RG-LRU as the export patches route HF's
// `RecurrentGemmaRglru._rnn_scan` (x and the gate a [batch, seq, width], a already 0 at position
// 0): an opaque op over the whole sequence becomes ad.cached_rg_lru over an fp32 state [slots, width].
// RUN: ad-opt %s -p 'insert-cached-attention{max-batch=2 max-seq-len=16}' | filecheck %s

// CHECK-LABEL: func.func @rg_lru
// CHECK-SAME:  %rg_lru_state{{.*}}: tensor<2x32xf32> {ad.input = "rg_lru_state_0", ad.cache = "model.layers.0.temporal_block.rg_lru rg_lru_state"}
// CHECK-NOT:   ad_mlir.rg_lru_scan
// CHECK:       %[[O:.*]] = ad.cached_rg_lru %x, %a state %rg_lru_state{{.*}} slots %cache_slots starts %cache_starts : (tensor<1x?x32xf32>, tensor<1x?x32xf32>, tensor<2x32xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<1x?x32xf32>
// CHECK-NEXT:  func.return %[[O]]
func.func @rg_lru(%x: tensor<1x?x32xf32> {ad.input = "x"}, %a: tensor<1x?x32xf32> {ad.input = "a"}) -> tensor<1x?x32xf32> {
  %y = ad.torch_op "ad_mlir.rg_lru_scan.default"(%x, %a) [#ad.ref<0>, #ad.ref<1>] {} : (tensor<1x?x32xf32>, tensor<1x?x32xf32>) -> tensor<1x?x32xf32> loc("model.layers.0.temporal_block.rg_lru")
  func.return %y : tensor<1x?x32xf32>
}
