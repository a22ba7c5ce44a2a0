// insert-cached-attention on Mamba1's selective scan as the export patches route HF's
// `mamba_selective_scan` (x, dt [batch, channels, seq], A [channels, state], B and C [batch,
// state, seq], D, the gate z, the dt bias, softplus): an opaque op over the whole sequence becomes
// ad.cached_selective_scan over an fp32 state [slots, channels, state_size], all its settings carried.
// RUN: ad-opt %s -p 'insert-cached-attention{max-batch=2 max-seq-len=16}' | filecheck %s

// CHECK-LABEL: func.func @mamba
// CHECK-SAME:  %ssm_state{{.*}}: tensor<2x16x4xf32> {ad.input = "ssm_state_0", ad.cache = "model.layers.0.mixer ssm_state"}
// CHECK-NOT:   ad_mlir.selective_scan
// CHECK:       %[[O:.*]] = ad.cached_selective_scan %x, %dt, %a, %b, %c d %d z %z dt_bias %dt_bias dt_softplus state %ssm_state{{.*}} slots %cache_slots starts %cache_starts : (tensor<1x16x?xf32>, tensor<1x16x?xf32>, tensor<16x4xf32>, tensor<1x4x?xf32>, tensor<1x4x?xf32>, tensor<2x16x4xf32>, tensor<?xi64>, tensor<?xi64>, d tensor<16xf32>, z tensor<1x16x?xf32>, dt_bias tensor<16xf32>) -> tensor<1x16x?xf32>
// CHECK-NEXT:  func.return %[[O]]
func.func @mamba(%x: tensor<1x16x?xf32> {ad.input = "x"}, %dt: tensor<1x16x?xf32> {ad.input = "dt"}, %a: tensor<16x4xf32> {ad.param = "model.layers.0.mixer.A"}, %b: tensor<1x4x?xf32> {ad.input = "b"}, %c: tensor<1x4x?xf32> {ad.input = "c"}, %d: tensor<16xf32> {ad.param = "model.layers.0.mixer.D"}, %z: tensor<1x16x?xf32> {ad.input = "z"}, %dt_bias: tensor<16xf32> {ad.param = "model.layers.0.mixer.dt_proj.bias"}) -> tensor<1x16x?xf32> {
  %y = ad.torch_op "ad_mlir.selective_scan.default"(%x, %dt, %a, %b, %c, %d, %z, %dt_bias) ["transformers.models.mamba.modeling_mamba", #ad.ref<0>, #ad.ref<1>, #ad.ref<2>, #ad.ref<3>, #ad.ref<4>, #ad.ref<5>, #ad.ref<6>, #ad.ref<7>, true] {} : (tensor<1x16x?xf32>, tensor<1x16x?xf32>, tensor<16x4xf32>, tensor<1x4x?xf32>, tensor<1x4x?xf32>, tensor<16xf32>, tensor<1x16x?xf32>, tensor<16xf32>) -> tensor<1x16x?xf32> loc("model.layers.0.mixer")
  func.return %y : tensor<1x16x?xf32>
}
