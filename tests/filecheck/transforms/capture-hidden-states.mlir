// capture-hidden-states: the residual stream after the given layer counts (0: the embeddings, 2:
// the last layer's output) becomes one more result, concatenated along the hidden axis.
// RUN: ad-opt %s --split-input-file -p 'capture-hidden-states{layers=0,1,2}' | filecheck %s
// RUN: ad-opt %s --split-input-file -p 'capture-hidden-states{layers=0,1,2},fuse-add-rmsnorm' | filecheck %s --check-prefix=FUSED
// RUN: ad-opt %s --split-input-file -p 'capture-hidden-states' | filecheck %s --check-prefix=NONE
// RUN: ad-opt %s --split-input-file -p 'capture-hidden-states{layers=3}' --verify-diagnostics | filecheck %s --check-prefix=RANGE

// As exported: each layer ends in its residual add (its location is the layer's), which the next
// layer's norm and residual add read; RoPE's cos crosses from the ops before the layers too, but
// is not of the stream's type.
// CHECK-LABEL: func.func @exported
// CHECK:         %[[R1:.*]] = ad.add %h0, %o0
// CHECK:         %[[R2:.*]] = ad.add %r1, %o1
// CHECK:         %[[N:.*]] = ad.rms_norm %[[R2]]
// CHECK-NEXT:    %hidden_states = ad.cat %h0, %[[R1]], %[[R2]] dim -1 : (tensor<1x?x8xf32>, tensor<1x?x8xf32>, tensor<1x?x8xf32>) -> tensor<1x?x24xf32>
// CHECK-NEXT:    func.return %[[N]], %hidden_states : tensor<1x?x8xf32>, tensor<1x?x24xf32>
// The fused residual adds' users read the add-norm ops' sums, the capture among them.
// FUSED-LABEL: func.func @exported
// FUSED:         %{{.*}}, %[[S1:.*]] = ad.add_rms_norm %h0, %o0
// FUSED:         %{{.*}}, %[[S2:.*]] = ad.add_rms_norm %[[S1]], %o1
// FUSED-NEXT:    %hidden_states = ad.cat %h0, %[[S1]], %[[S2]] dim -1
// Without layers the function is unchanged.
// NONE-LABEL: func.func @exported
// NONE-NOT:      ad.cat
// NONE:          func.return %n : tensor<1x?x8xf32>
// RANGE: layer 3 is out of range: the model has 2 decoder layers (0 to 2)
func.func @exported(%w: tensor<8xf32>, %ids: tensor<1x?xi64>, %emb: tensor<16x8xf32>, %cos: tensor<1x?x8xf32>) -> tensor<1x?x8xf32> {
  %h0 = ad.embedding %emb, %ids : (tensor<16x8xf32>, tensor<1x?xi64>) -> tensor<1x?x8xf32> loc("model.embed_tokens")
  %x0 = ad.rms_norm %h0 weight %w eps 1.0e-06 : (tensor<1x?x8xf32>, tensor<8xf32>) -> tensor<1x?x8xf32> loc("model.layers.0.input_layernorm")
  %o0 = ad.mul %x0, %cos : tensor<1x?x8xf32>, tensor<1x?x8xf32> -> tensor<1x?x8xf32> loc("model.layers.0.self_attn")
  %r1 = ad.add %h0, %o0 : tensor<1x?x8xf32>, tensor<1x?x8xf32> -> tensor<1x?x8xf32> loc("model.layers.0")
  %x1 = ad.rms_norm %r1 weight %w eps 1.0e-06 : (tensor<1x?x8xf32>, tensor<8xf32>) -> tensor<1x?x8xf32> loc("model.layers.1.input_layernorm")
  %o1 = ad.mul %x1, %cos : tensor<1x?x8xf32>, tensor<1x?x8xf32> -> tensor<1x?x8xf32> loc("model.layers.1.self_attn")
  %r2 = ad.add %r1, %o1 : tensor<1x?x8xf32>, tensor<1x?x8xf32> -> tensor<1x?x8xf32> loc("model.layers.1")
  %n = ad.rms_norm %r2 weight %w eps 1.0e-06 : (tensor<1x?x8xf32>, tensor<8xf32>) -> tensor<1x?x8xf32> loc("model.norm")
  func.return %n : tensor<1x?x8xf32>
}

// -----

// After fuse-add-rmsnorm: a layer's last residual add sits in the next layer's (or the final)
// norm, located there; what crosses the boundary are its summands, and the capture reads its sum.
// CHECK-LABEL: func.func @fused
// CHECK:         %{{.*}}, %[[S1:.*]] = ad.add_rms_norm %h0, %o0
// CHECK:         %[[N:.*]], %[[S2:.*]] = ad.add_rms_norm %[[S1]], %o1
// CHECK-NEXT:    %hidden_states = ad.cat %h0, %[[S1]], %[[S2]] dim -1
// CHECK-NEXT:    func.return %[[N]], %hidden_states
func.func @fused(%w: tensor<8xf32>, %ids: tensor<1x?xi64>, %emb: tensor<16x8xf32>) -> tensor<1x?x8xf32> {
  %h0 = ad.embedding %emb, %ids : (tensor<16x8xf32>, tensor<1x?xi64>) -> tensor<1x?x8xf32> loc("model.embed_tokens")
  %x0 = ad.rms_norm %h0 weight %w eps 1.0e-06 : (tensor<1x?x8xf32>, tensor<8xf32>) -> tensor<1x?x8xf32> loc("model.layers.0.input_layernorm")
  %o0 = ad.exp %x0 : tensor<1x?x8xf32> -> tensor<1x?x8xf32> loc("model.layers.0.mlp")
  %x1, %r1 = ad.add_rms_norm %h0, %o0 weight %w eps 1.0e-06 : (tensor<1x?x8xf32>, tensor<1x?x8xf32>, tensor<8xf32>) -> (tensor<1x?x8xf32>, tensor<1x?x8xf32>) loc("model.layers.1.input_layernorm")
  %o1 = ad.exp %x1 : tensor<1x?x8xf32> -> tensor<1x?x8xf32> loc("model.layers.1.mlp")
  %n, %r2 = ad.add_rms_norm %r1, %o1 weight %w eps 1.0e-06 : (tensor<1x?x8xf32>, tensor<1x?x8xf32>, tensor<8xf32>) -> (tensor<1x?x8xf32>, tensor<1x?x8xf32>) loc("model.norm")
  func.return %n : tensor<1x?x8xf32>
}
