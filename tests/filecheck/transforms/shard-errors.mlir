// shard: configurations that cannot work are errors naming the layer (or linear) and the numbers.
// RUN: ad-opt %s --split-input-file --verify-diagnostics -p 'shard{world-size=3}' | filecheck %s
// RUN: not ad-opt %s -p 'shard{world-size=0}' 2>&1 | filecheck %s --check-prefix=ZERO
// RUN: not ad-opt %s -p 'shard{world-size=2 shard-layers=attention,moe}' 2>&1 | filecheck %s --check-prefix=KINDS

// ZERO-NOT: Traceback
// ZERO: {{^}}error: shard: world-size must be at least 1, got 0{{$}}
// KINDS: {{^}}error: shard: unknown shard-layers ['moe'] (known: attention, mlp){{$}}

// CHECK: model.layers.0.mlp: %g (2x?x16) has 16 along dim 2, which 3 ranks cannot split
func.func @features(%x: tensor<2x?x8xf32> {ad.input = "x"}, %wg: tensor<16x8xf32> {ad.param = "model.layers.0.mlp.gate_proj.weight"}, %wd: tensor<8x16xf32> {ad.param = "model.layers.0.mlp.down_proj.weight"}) -> tensor<2x?x8xf32> {
  %g = ad.linear %x, %wg : (tensor<2x?x8xf32>, tensor<16x8xf32>) -> tensor<2x?x16xf32> loc("model.layers.0.mlp.gate_proj")
  %s = ad.silu %g : tensor<2x?x16xf32> -> tensor<2x?x16xf32> loc("model.layers.0.mlp")
  %d = ad.linear %s, %wd : (tensor<2x?x16xf32>, tensor<8x16xf32>) -> tensor<2x?x8xf32> loc("model.layers.0.mlp.down_proj")
  func.return %d : tensor<2x?x8xf32>
}

// -----

// CHECK: lm_head: ad.shard must be one of colwise, rowwise, replicated, got "vocab"
func.func @bad_hint(%x: tensor<2x8xf32> {ad.input = "x"}, %w: tensor<12x8xf32> {ad.param = "lm_head.weight"}) -> tensor<2x12xf32> {
  %y = ad.linear %x, %w {ad.shard = "vocab"} : (tensor<2x8xf32>, tensor<12x8xf32>) -> tensor<2x12xf32> loc("lm_head")
  func.return %y : tensor<2x12xf32>
}

// -----

// CHECK: lm_head is marked colwise, but its result reaches the function's results
func.func @colwise_output(%x: tensor<2x8xf32> {ad.input = "x"}, %w: tensor<12x8xf32> {ad.param = "lm_head.weight"}) -> tensor<2x12xf32> {
  %y = ad.linear %x, %w {ad.shard = "colwise"} : (tensor<2x8xf32>, tensor<12x8xf32>) -> tensor<2x12xf32> loc("lm_head")
  func.return %y : tensor<2x12xf32>
}

// -----

// CHECK: proj is marked rowwise, but no column-wise linear reaches it
func.func @rowwise_alone(%x: tensor<2x12xf32> {ad.input = "x"}, %w: tensor<8x12xf32> {ad.param = "proj.weight"}) -> tensor<2x8xf32> {
  %y = ad.linear %x, %w {ad.shard = "rowwise"} : (tensor<2x12xf32>, tensor<8x12xf32>) -> tensor<2x8xf32> loc("proj")
  func.return %y : tensor<2x8xf32>
}

// -----

// A hinted block that cannot keep its split: an error, where an unhinted one is only logged.
// CHECK: block: the hinted block (up column-wise, down row-wise) cannot be sharded: ad.add reads %c whole along the split dim
func.func @hinted_whole(%x: tensor<2x8xf32> {ad.input = "x"}, %wu: tensor<6x8xf32> {ad.param = "block.up.weight"}, %c: tensor<6xf32> {ad.param = "block.c"}, %wd: tensor<8x6xf32> {ad.param = "block.down.weight"}) -> tensor<2x8xf32> {
  %u = ad.linear %x, %wu {ad.shard = "colwise"} : (tensor<2x8xf32>, tensor<6x8xf32>) -> tensor<2x6xf32> loc("block.up")
  %a = ad.add %u, %c : tensor<2x6xf32>, tensor<6xf32> -> tensor<2x6xf32>
  %d = ad.linear %a, %wd : (tensor<2x6xf32>, tensor<8x6xf32>) -> tensor<2x8xf32> loc("block.down")
  func.return %d : tensor<2x8xf32>
}
