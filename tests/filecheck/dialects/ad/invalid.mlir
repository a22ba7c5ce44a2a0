// Verifier errors: each names the file, line and column of the op and what is wrong.
// RUN: ad-opt %s --split-input-file --verify-diagnostics | filecheck %s

func.func @bad_broadcast(%x: tensor<2x3xf32>, %y: tensor<4x3xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.add' operand shapes 2x3, 4x3 do not broadcast
  %0 = ad.add %x, %y : tensor<2x3xf32>, tensor<4x3xf32> -> tensor<2x3xf32>
  func.return
}

// -----

func.func @bad_result_shape(%x: tensor<2x3xf32>, %y: tensor<1x3xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.mul' result shape 3x3 does not match the broadcast operand shape 2x3
  %0 = ad.mul %x, %y : tensor<2x3xf32>, tensor<1x3xf32> -> tensor<3x3xf32>
  func.return
}

// -----

func.func @unary_changes_dtype(%x: tensor<2x3xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.neg' result element type f16 differs from the input's f32
  %0 = ad.neg %x : tensor<2x3xf32> -> tensor<2x3xf16>
  func.return
}

// -----

func.func @compare_not_i1(%x: tensor<2x3xf32>, %s: f64) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.lt' must produce an i1 tensor
  %0 = ad.lt %x, %s : tensor<2x3xf32>, f64 -> tensor<2x3xf32>
  func.return
}

// -----

func.func @where_condition(%c: tensor<2x3xf32>, %x: tensor<2x3xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.where' condition must be an i1 tensor
  %0 = ad.where %c, %x, %x : tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32> -> tensor<2x3xf32>
  func.return
}

// -----

func.func @unsupported_element_type(%x: tensor<2x3xi16>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.exp' does not support element type i16 (carry the op as ad.torch_op)
  %0 = ad.exp %x : tensor<2x3xi16> -> tensor<2x3xi16>
  func.return
}

// -----

func.func @cast_shape(%x: tensor<2x3xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cast' must not change the shape
  %0 = ad.cast %x : tensor<2x3xf32> -> tensor<3x2xbf16>
  func.return
}

// -----

func.func @reshape_count(%x: tensor<2x3xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.reshape' changes the element count: 2x3 (6) -> 7 (7)
  %0 = ad.reshape %x [7] : tensor<2x3xf32> -> tensor<7xf32>
  func.return
}

// -----

func.func @permute_not_permutation(%x: tensor<2x3xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.permute' dims [0, 0] are not a permutation
  %0 = ad.permute %x [0, 0] : tensor<2x3xf32> -> tensor<2x2xf32>
  func.return
}

// -----

func.func @transpose_shape(%x: tensor<2x3xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.transpose' result shape should be 3x2
  %0 = ad.transpose %x 0, 1 : tensor<2x3xf32> -> tensor<2x3xf32>
  func.return
}

// -----

func.func @slice_step(%x: tensor<2x8xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.slice' step must be positive, got 0
  %0 = ad.slice %x dim 1 [0, 4, 0] : tensor<2x8xf32> -> tensor<2x4xf32>
  func.return
}

// -----

func.func @split_count(%x: tensor<2x8xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.split' has 3 sizes but 2 results
  %0, %1 = ad.split %x [2, 2, 4] dim 1 : tensor<2x8xf32> -> tensor<2x2xf32>, tensor<2x6xf32>
  func.return
}

// -----

func.func @linear_weight_rank(%x: tensor<2x8xf32>, %w: tensor<8xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.linear' weight must be 2-D, got 8
  %0 = ad.linear %x, %w : (tensor<2x8xf32>, tensor<8xf32>) -> tensor<2xf32>
  func.return
}

// -----

func.func @mm_chain(%a: tensor<2x8xf32>, %b: tensor<4x3xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.mm' shapes 2x8 and 4x3 do not chain
  %0 = ad.mm %a, %b : (tensor<2x8xf32>, tensor<4x3xf32>) -> tensor<2x3xf32>
  func.return
}

// -----

func.func @embedding_indices(%w: tensor<16x8xf32>, %i: tensor<4xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.embedding' indices must be i64 or i32
  %0 = ad.embedding %w, %i : (tensor<16x8xf32>, tensor<4xf32>) -> tensor<4x8xf32>
  func.return
}

// -----

func.func @attention_head_dim(%q: tensor<1x4x?x16xf32>, %k: tensor<1x4x?x8xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.attention' head_dim differs: query 16, key 8
  %0 = ad.attention %q, %k, %k : (tensor<1x4x?x16xf32>, tensor<1x4x?x8xf32>, tensor<1x4x?x8xf32>) -> tensor<1x4x?x16xf32>
  func.return
}

// -----

func.func @arange_rank(%n: index) {
  %0 = ad.constant 0 : i64
  %1 = ad.constant 1 : i64
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.arange' produces a 1-D tensor
  %2 = ad.arange %0, %n, %1 : i64, index, i64 -> tensor<1x?xi64>
  func.return
}

// -----

func.func @full_rank(%n: index, %v: f64) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.full' size does not match the result rank
  %0 = ad.full [1, %n], %v : f64 -> tensor<?xf32>
  func.return
}

// -----

func.func @rms_norm_weight(%x: tensor<2x64xf32>, %w: tensor<32xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.rms_norm' weight must be 1-D of the normalized size 64, got 32
  %0 = ad.rms_norm %x weight %w eps 1.0e-06 : (tensor<2x64xf32>, tensor<32xf32>) -> tensor<2x64xf32>
  func.return
}

// -----

func.func @rms_norm_result_type(%x: tensor<2x64xbf16>, %w: tensor<64xbf16>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.rms_norm' result element type must be bf16
  %0 = ad.rms_norm %x weight %w eps 1.0e-06 weight_in_fp32 : (tensor<2x64xbf16>, tensor<64xbf16>) -> tensor<2x64xf32>
  func.return
}

// -----

func.func @add_rms_norm_types(%x: tensor<2x64xbf16>, %r: tensor<2x64xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.add_rms_norm' input, residual and sum must have one type
  %0, %1 = ad.add_rms_norm %x, %r eps 1.0e-06 : (tensor<2x64xbf16>, tensor<2x64xf32>) -> (tensor<2x64xbf16>, tensor<2x64xbf16>)
  func.return
}

// -----

func.func @layer_norm_bias_size(%x: tensor<2x64xf32>, %b: tensor<32xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.layer_norm' bias must be 1-D of the normalized size 64, got 32
  %0 = ad.layer_norm %x bias %b eps 1.0e-05 : (tensor<2x64xf32> bias tensor<32xf32>) -> tensor<2x64xf32>
  func.return
}

// -----

func.func @layer_norm_weight_rank(%x: tensor<2x64xf32>, %w: tensor<2x64xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.layer_norm' weight must be 1-D of the normalized size 64, got 2x64
  %0 = ad.layer_norm %x weight %w eps 1.0e-05 : (tensor<2x64xf32> weight tensor<2x64xf32>) -> tensor<2x64xf32>
  func.return
}

// -----

func.func @layer_norm_result_type(%x: tensor<2x64xbf16>, %w: tensor<64xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.layer_norm' result element type must be the input's, bf16
  %0 = ad.layer_norm %x weight %w eps 1.0e-05 : (tensor<2x64xbf16> weight tensor<64xf32>) -> tensor<2x64xf32>
  func.return
}

// -----

func.func @layer_norm_integer_input(%x: tensor<2x64xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.layer_norm' input must be f32, f16 or bf16
  %0 = ad.layer_norm %x eps 1.0e-05 : (tensor<2x64xi64>) -> tensor<2x64xi64>
  func.return
}

// -----

func.func @add_layer_norm_types(%x: tensor<2x64xbf16>, %r: tensor<2x64xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.add_layer_norm' input, residual and sum must have one type
  %0, %1 = ad.add_layer_norm %x, %r eps 1.0e-05 : (tensor<2x64xbf16>, tensor<2x64xf32>) -> (tensor<2x64xbf16>, tensor<2x64xbf16>)
  func.return
}

// -----

func.func @silu_and_mul_types(%g: tensor<2x64xbf16>, %u: tensor<2x32xbf16>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.silu_and_mul' gate, up and result must have one type
  %0 = ad.silu_and_mul %g, %u : (tensor<2x64xbf16>, tensor<2x32xbf16>) -> tensor<2x64xbf16>
  func.return
}

// -----

func.func @gelu_and_mul_types(%g: tensor<2x64xbf16>, %u: tensor<2x64xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.gelu_and_mul' gate, up and result must have one type
  %0 = ad.gelu_and_mul %g, %u : (tensor<2x64xbf16>, tensor<2x64xf32>) -> tensor<2x64xbf16>
  func.return
}

// -----

func.func @gelu_and_mul_approximation(%g: tensor<2x64xbf16>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.gelu_and_mul' Expected one of "none", "tanh", but got "sigmoid"
  %0 = ad.gelu_and_mul %g, %g approximate "sigmoid" : (tensor<2x64xbf16>, tensor<2x64xbf16>) -> tensor<2x64xbf16>
  func.return
}

// -----

func.func @activation_kind(%x: tensor<2x64xbf16>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.activation' kind must be one of gelu, gelu_tanh, relu, relu2, silu, got 'swish'
  %0 = ad.activation "swish" %x : (tensor<2x64xbf16>) -> tensor<2x64xbf16>
  func.return
}

// -----

func.func @activation_bias(%x: tensor<2x64xbf16>, %b: tensor<32xbf16>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.activation' bias must be 1-D of the input's 64 features and its element type
  %0 = ad.activation "relu" %x bias %b : (tensor<2x64xbf16>, tensor<32xbf16>) -> tensor<2x64xbf16>
  func.return
}

// -----

func.func @activation_result(%x: tensor<2x64xbf16>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.activation' input and result must have one type
  %0 = ad.activation "silu" %x : (tensor<2x64xbf16>) -> tensor<2x64xf32>
  func.return
}

// -----

func.func @dynamic_scale_shape(%x: tensor<2x64xbf16>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.quantize_fp8_dynamic' scale must be f32 of shape 2x1
  %0, %1 = ad.quantize_fp8_dynamic %x per_token : tensor<2x64xbf16> -> (tensor<2x64xf8E4M3FN>, tensor<f32>)
  func.return
}

// -----

func.func @linear_fp8_operands(%x: tensor<2x64xbf16>, %w: tensor<8x64xf8E4M3FN>, %s: tensor<f32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.linear_fp8' input and weight must be f8E4M3FN
  %0 = ad.linear_fp8 %x, %w, %s, %s : (tensor<2x64xbf16>, tensor<8x64xf8E4M3FN>, tensor<f32>, tensor<f32>) -> tensor<2x8xbf16>
  func.return
}

// -----

func.func @linear_fp8_block_size(%x: tensor<2x64xbf16>, %w: tensor<8x64xf8E4M3FN>, %s: tensor<1x1xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.linear_fp8_block' block_size [96, 64] must be [bn, bk], powers of two >= 16
  %0 = ad.linear_fp8_block %x, %w, %s block [96, 64] : (tensor<2x64xbf16>, tensor<8x64xf8E4M3FN>, tensor<1x1xf32>) -> tensor<2x8xbf16>
  func.return
}

// -----

func.func @linear_fp8_block_weight(%x: tensor<2x64xbf16>, %w: tensor<8x64xbf16>, %s: tensor<1x1xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.linear_fp8_block' weight must be a static 2-D f8E4M3FN tensor, got tensor<8x64xbf16>
  %0 = ad.linear_fp8_block %x, %w, %s block [16, 64] : (tensor<2x64xbf16>, tensor<8x64xbf16>, tensor<1x1xf32>) -> tensor<2x8xbf16>
  func.return
}

// -----

func.func @linear_fp8_block_scales(%x: tensor<2x64xbf16>, %w: tensor<40x64xf8E4M3FN>, %s: tensor<2x2xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.linear_fp8_block' weight_scale_inv must be f32 3x2 for weight 40x64 in blocks [16, 32]
  %0 = ad.linear_fp8_block %x, %w, %s block [16, 32] : (tensor<2x64xbf16>, tensor<40x64xf8E4M3FN>, tensor<2x2xf32>) -> tensor<2x40xbf16>
  func.return
}

// -----

func.func @linear_fp8_block_result(%x: tensor<2x64xbf16>, %w: tensor<8x64xf8E4M3FN>, %s: tensor<1x1xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.linear_fp8_block' input must be f32, f16 or bf16, and the result of its type
  %0 = ad.linear_fp8_block %x, %w, %s block [16, 64] : (tensor<2x64xbf16>, tensor<8x64xf8E4M3FN>, tensor<1x1xf32>) -> tensor<2x8xf32>
  func.return
}

// -----

func.func @linear_nvfp4_weight(%x: tensor<2x64xbf16>, %w: tensor<8x32xi8>, %s: tensor<8x4xf8E4M3FN>, %g: tensor<f32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.linear_nvfp4' weight must be a static 2-D ui8 tensor (packed e2m1), got tensor<8x32xi8>
  %0 = ad.linear_nvfp4 %x, %w, %s, %g : (tensor<2x64xbf16>, tensor<8x32xi8>, tensor<8x4xf8E4M3FN>, tensor<f32>) -> tensor<2x8xbf16>
  func.return
}

// -----

func.func @linear_nvfp4_block_scales(%x: tensor<2x64xbf16>, %w: tensor<8x32xui8>, %s: tensor<8x2xf8E4M3FN>, %g: tensor<f32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.linear_nvfp4' weight_scale must be f8E4M3FN 8x4
  %0 = ad.linear_nvfp4 %x, %w, %s, %g : (tensor<2x64xbf16>, tensor<8x32xui8>, tensor<8x2xf8E4M3FN>, tensor<f32>) -> tensor<2x8xbf16>
  func.return
}

// -----

func.func @linear_nvfp4_global_scale(%x: tensor<2x64xbf16>, %w: tensor<8x32xui8>, %s: tensor<8x4xf8E4M3FN>, %g: tensor<4xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.linear_nvfp4' weight_scale_2 must be f32 of one value or [8]
  %0 = ad.linear_nvfp4 %x, %w, %s, %g : (tensor<2x64xbf16>, tensor<8x32xui8>, tensor<8x4xf8E4M3FN>, tensor<4xf32>) -> tensor<2x8xbf16>
  func.return
}

// -----

func.func @cached_attention_cache_heads(%q: tensor<?x4x?x64xbf16>, %k: tensor<?x2x?x64xbf16>, %kc: tensor<8x512x4x64xbf16>, %s: tensor<?xi64>, %bt: tensor<?x1xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_attention' pools must be [pages, page_size, 2, 64] (key) and [pages, page_size, 2, 64] (value) of the same pages and page_size
  %0 = ad.cached_attention %q, %k, %k cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x4x64xbf16>, tensor<8x512x4x64xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x64xbf16>
  func.return
}

// -----

func.func @cached_attention_compressed_cache(%q: tensor<?x4x?x64xbf16>, %k: tensor<?x2x?x64xbf16>, %kc: tensor<8x512x2x64xbf16>, %cc: tensor<8x256x2x64xbf16>, %s: tensor<?xi64>, %bt: tensor<?x1xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_attention' compressed entries and their cache must have the key's and the key cache's types
  %0 = ad.cached_attention %q, %k, %k cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 compressed %k, %cc : tensor<?x2x?x64xbf16>, tensor<8x256x2x64xbf16> : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x64xbf16>
  func.return
}

// -----

func.func @cached_attention_value_cache_width(%q: tensor<?x4x?x64xbf16>, %k: tensor<?x2x?x64xbf16>, %v: tensor<?x2x?x32xbf16>, %kc: tensor<8x512x2x64xbf16>, %s: tensor<?xi64>, %bt: tensor<?x1xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_attention' pools must be [pages, page_size, 2, 64] (key) and [pages, page_size, 2, 32] (value) of the same pages and page_size
  %0 = ad.cached_attention %q, %k, %v cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x32xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x32xbf16>
  func.return
}

// -----

func.func @cached_attention_value_result(%q: tensor<?x4x?x64xbf16>, %k: tensor<?x2x?x64xbf16>, %v: tensor<?x2x?x32xbf16>, %kc: tensor<8x512x2x64xbf16>, %vc: tensor<8x512x2x32xbf16>, %s: tensor<?xi64>, %bt: tensor<?x1xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_attention' result must have the query's type with the value's head_dim
  %0 = ad.cached_attention %q, %k, %v cache %kc, %vc block_tables %bt cache_starts %s scale 1.250000e-01 : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x32xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x32xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x64xbf16>
  func.return
}

// -----

func.func @cached_attention_cache_dtype(%q: tensor<?x4x?x64xbf16>, %k: tensor<?x2x?x64xbf16>, %kc: tensor<8x512x2x64xf32>, %s: tensor<?xi64>, %bt: tensor<?x1xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_attention' pools must have the key's element type (or be f8E4M3FN with kv_scales)
  %0 = ad.cached_attention %q, %k, %k cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xf32>, tensor<8x512x2x64xf32>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x64xbf16>
  func.return
}

// -----

// e4m3 pools need their scales.
func.func @cached_attention_fp8_without_scales(%q: tensor<?x4x?x64xbf16>, %k: tensor<?x2x?x64xbf16>, %kc: tensor<8x512x2x64xf8E4M3FN>, %s: tensor<?xi64>, %bt: tensor<?x1xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_attention' pools must have the key's element type (or be f8E4M3FN with kv_scales)
  %0 = ad.cached_attention %q, %k, %k cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xf8E4M3FN>, tensor<8x512x2x64xf8E4M3FN>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x64xbf16>
  func.return
}

// -----

// Scales only with e4m3 pools.
func.func @cached_attention_scales_without_fp8(%q: tensor<?x4x?x64xbf16>, %k: tensor<?x2x?x64xbf16>, %kc: tensor<8x512x2x64xbf16>, %s: tensor<?xi64>, %bt: tensor<?x1xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_attention' with kv_scales takes f8E4M3FN pools, not bf16 and bf16
  %0 = ad.cached_attention %q, %k, %k cache %kc, %kc kv_scales 1.000000e+00, 1.000000e+00 block_tables %bt cache_starts %s scale 1.250000e-01 : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x64xbf16>
  func.return
}

// -----

// A scale is positive.
func.func @cached_attention_fp8_zero_scale(%q: tensor<?x4x?x64xbf16>, %k: tensor<?x2x?x64xbf16>, %kc: tensor<8x512x2x64xf8E4M3FN>, %s: tensor<?xi64>, %bt: tensor<?x1xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_attention' v_scale must be positive and finite, not 0.0
  %0 = ad.cached_attention %q, %k, %k cache %kc, %kc kv_scales 1.000000e+00, 0.000000e+00 block_tables %bt cache_starts %s scale 1.250000e-01 : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xf8E4M3FN>, tensor<8x512x2x64xf8E4M3FN>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x64xbf16>
  func.return
}

// -----

// The distance bias is one vector per query token and head: [batch, heads, seq, extent].
func.func @cached_attention_distance_bias_heads(%q: tensor<?x4x?x64xbf16>, %k: tensor<?x2x?x64xbf16>, %kc: tensor<8x512x2x64xbf16>, %s: tensor<?xi64>, %db: tensor<?x2x?x6xf32>, %bt: tensor<?x1xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_attention' distance_bias must be a float [batch, heads, seq, extent] = [?, 4, ?, extent] with a static extent, not tensor<?x2x?x6xf32>
  %0 = ad.cached_attention %q, %k, %k cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 distance_bias %db : tensor<?x2x?x6xf32> : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x64xbf16>
  func.return
}

// -----

// MLA's latent pages hold rank + rope values per token (512 + 64 = 576), not rank alone.
func.func @cached_mla_cache_width(%qn: tensor<?x128x?x128xbf16>, %qr: tensor<?x128x?x64xbf16>, %lat: tensor<?x1x?x512xbf16>, %kr: tensor<?x1x?x64xbf16>, %w: tensor<32768x512xbf16>, %c: tensor<8x512x512xbf16>, %bt: tensor<?x1xi64>, %s: tensor<?xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_mla_attention' cache must be [pages, page_size, 512 + 64] of the latent's element type
  %0 = ad.cached_mla_attention %qn, %qr, %lat, %kr kv_b %w cache %c block_tables %bt cache_starts %s scale 1.250000e-01 : (tensor<?x128x?x128xbf16>, tensor<?x128x?x64xbf16>, tensor<?x1x?x512xbf16>, tensor<?x1x?x64xbf16>, tensor<32768x512xbf16>, tensor<8x512x512xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x128x?x128xbf16>
  func.return
}

// -----

// DeepSeek-V3's kv_b_proj [128 * (128 + 128), 512]: the value head dim (128) is what the weight leaves after nope.
func.func @cached_mla_value_dim(%qn: tensor<?x128x?x128xbf16>, %qr: tensor<?x128x?x64xbf16>, %lat: tensor<?x1x?x512xbf16>, %kr: tensor<?x1x?x64xbf16>, %w: tensor<32768x512xbf16>, %c: tensor<8x512x576xbf16>, %bt: tensor<?x1xi64>, %s: tensor<?xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_mla_attention' result must be [batch, 128, seq, 128] in the query's element type
  %0 = ad.cached_mla_attention %qn, %qr, %lat, %kr kv_b %w cache %c block_tables %bt cache_starts %s scale 1.250000e-01 : (tensor<?x128x?x128xbf16>, tensor<?x128x?x64xbf16>, tensor<?x1x?x512xbf16>, tensor<?x1x?x64xbf16>, tensor<32768x512xbf16>, tensor<8x512x576xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x128x?x192xbf16>
  func.return
}

// -----

// The kernel takes the page size as a constant: a dynamic one is refused.
func.func @cached_mla_page_size(%qn: tensor<?x128x?x128xbf16>, %qr: tensor<?x128x?x64xbf16>, %lat: tensor<?x1x?x512xbf16>, %kr: tensor<?x1x?x64xbf16>, %w: tensor<32768x512xbf16>, %p: tensor<512x?x576xbf16>, %bt: tensor<?x?xi64>, %s: tensor<?xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_mla_attention' page_size ? must be static and positive
  %0 = ad.cached_mla_attention %qn, %qr, %lat, %kr kv_b %w cache %p block_tables %bt cache_starts %s scale 1.250000e-01 : (tensor<?x128x?x128xbf16>, tensor<?x128x?x64xbf16>, tensor<?x1x?x512xbf16>, tensor<?x1x?x64xbf16>, tensor<32768x512xbf16>, tensor<512x?x576xbf16>, tensor<?x?xi64>, tensor<?xi64>) -> tensor<?x128x?x128xbf16>
  func.return
}

// -----

// With query_starts, one flattened batch: a query of batch 2 is refused.
func.func @cached_mla_flattened_batch(%qn: tensor<2x128x?x128xbf16>, %qr: tensor<2x128x?x64xbf16>, %lat: tensor<2x1x?x512xbf16>, %kr: tensor<2x1x?x64xbf16>, %w: tensor<32768x512xbf16>, %p: tensor<512x64x576xbf16>, %qs: tensor<?xi64>, %bt: tensor<?x?xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_mla_attention' q_nope/q_rope must be [1, heads, tokens, dim] and latent/k_rope [1, 1, tokens, dim], heads and dims static
  %0 = ad.cached_mla_attention %qn, %qr, %lat, %kr kv_b %w cache %p block_tables %bt cache_starts %qs query_starts %qs : tensor<?xi64> scale 1.250000e-01 : (tensor<2x128x?x128xbf16>, tensor<2x128x?x64xbf16>, tensor<2x1x?x512xbf16>, tensor<2x1x?x64xbf16>, tensor<32768x512xbf16>, tensor<512x64x576xbf16>, tensor<?x?xi64>, tensor<?xi64>) -> tensor<2x128x?x128xbf16>
  func.return
}

// -----

// DeepSeek sparse attention's selection is per batch row: not with a flattened batch.
func.func @cached_mla_selected_flattened(%qn: tensor<1x128x?x128xbf16>, %qr: tensor<1x128x?x64xbf16>, %lat: tensor<1x1x?x512xbf16>, %kr: tensor<1x1x?x64xbf16>, %w: tensor<32768x512xbf16>, %p: tensor<512x64x576xbf16>, %qs: tensor<?xi64>, %bt: tensor<?x?xi64>, %sel: tensor<1x?x4xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_mla_attention' selected takes batch rows, not query_starts
  %0 = ad.cached_mla_attention %qn, %qr, %lat, %kr kv_b %w cache %p block_tables %bt cache_starts %qs query_starts %qs : tensor<?xi64> selected %sel : tensor<1x?x4xi64> scale 1.250000e-01 : (tensor<1x128x?x128xbf16>, tensor<1x128x?x64xbf16>, tensor<1x1x?x512xbf16>, tensor<1x1x?x64xbf16>, tensor<32768x512xbf16>, tensor<512x64x576xbf16>, tensor<?x?xi64>, tensor<?xi64>) -> tensor<1x128x?x128xbf16>
  func.return
}

// -----

// Mamba1's A is [channels, state_size] (Mamba2's is one value per head).
func.func @cached_selective_scan_a(%x: tensor<?x64x?xf32>, %a: tensor<64xf32>, %b: tensor<?x16x?xf32>, %st: tensor<8x64x16xf32>, %s: tensor<?xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_selective_scan' a must be [64, state_size], state_size static
  %0 = ad.cached_selective_scan %x, %x, %a, %b, %b state %st slots %s starts %s : (tensor<?x64x?xf32>, tensor<?x64x?xf32>, tensor<64xf32>, tensor<?x16x?xf32>, tensor<?x16x?xf32>, tensor<8x64x16xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<?x64x?xf32>
  func.return
}

// -----

func.func @cached_attention_softcap(%q: tensor<?x4x?x64xbf16>, %k: tensor<?x2x?x64xbf16>, %kc: tensor<8x512x2x64xbf16>, %s: tensor<?xi64>, %bt: tensor<?x1xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_attention' softcap must be positive, not 0.0
  %0 = ad.cached_attention %q, %k, %k cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 softcap 0.000000e+00 : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x64xbf16>
  func.return
}

// -----

func.func @cached_attention_sinks(%q: tensor<?x4x?x64xbf16>, %k: tensor<?x2x?x64xbf16>, %kc: tensor<8x512x2x64xbf16>, %s: tensor<?xi64>, %sinks: tensor<2xbf16>, %bt: tensor<?x1xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_attention' sinks must be [heads] = [4], one per query head
  %0 = ad.cached_attention %q, %k, %k cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 sinks %sinks : tensor<2xbf16> : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x64xbf16>
  func.return
}

// -----

func.func @cached_attention_metadata(%q: tensor<?x4x?x64xbf16>, %k: tensor<?x2x?x64xbf16>, %kc: tensor<8x512x2x64xbf16>, %s: tensor<?xi32>, %bt: tensor<?x1xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_attention' cache_starts must be a rank-1 i64 tensor
  %0 = ad.cached_attention %q, %k, %k cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi32>) -> tensor<?x4x?x64xbf16>
  func.return
}

// -----

func.func @rope_attention_rotary_dim_over_head_dim(%q: tensor<1x4x?x64xbf16>, %cos: tensor<1x?x80xbf16>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.rope_attention' rotary_dim (the tables' last dim) 80 must be static, even and at most the head_dim 64
  %0 = ad.rope_attention %q, %q, %q rope %cos, %cos causal scale 1.250000e-01 : (tensor<1x4x?x64xbf16>, tensor<1x4x?x64xbf16>, tensor<1x4x?x64xbf16>, tensor<1x?x80xbf16>, tensor<1x?x80xbf16>) -> tensor<1x4x?x64xbf16>
  func.return
}

// -----

func.func @moe_mxfp4_scales(%x: tensor<?x64xbf16>, %l: tensor<?x4xbf16>, %gub: tensor<4x192x2x16xui8>, %gus: tensor<4x192x3xui8>, %gb: tensor<4x192xbf16>, %db: tensor<4x64x3x16xui8>, %ds: tensor<4x64x3xui8>, %b: tensor<4x64xbf16>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.moe_mxfp4' gate_up_scales must be 4x192x2 for 4 experts, hidden 64, intermediate 96
  %0 = ad.moe_mxfp4 %x, %l gate_up %gub, %gus, %gb down %db, %ds, %b top_k 2 alpha 1.702000e+00 limit 7.000000e+00 : (tensor<?x64xbf16>, tensor<?x4xbf16>, tensor<4x192x2x16xui8>, tensor<4x192x3xui8>, tensor<4x192xbf16>, tensor<4x64x3x16xui8>, tensor<4x64x3xui8>, tensor<4x64xbf16>) -> tensor<?x64xbf16>
  func.return
}

// -----

func.func @moe_fp8_block_scales(%x: tensor<?x256xbf16>, %ids: tensor<?x2xi64>, %w: tensor<?x2xf32>, %gu: tensor<4x256x256xf8E4M3FN>, %gus: tensor<4x2x1xf32>, %dn: tensor<4x256x128xf8E4M3FN>, %dns: tensor<4x2x1xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.moe_fp8_block' gate_up_scale_inv must be 4x2x2 for 4 experts, hidden 256, intermediate 128, blocks [128, 128]
  %0 = ad.moe_fp8_block %x, %ids, %w gate_up %gu, %gus down %dn, %dns block [128, 128] : (tensor<?x256xbf16>, tensor<?x2xi64>, tensor<?x2xf32>, tensor<4x256x256xf8E4M3FN>, tensor<4x2x1xf32>, tensor<4x256x128xf8E4M3FN>, tensor<4x2x1xf32>) -> tensor<?x256xbf16>
  func.return
}

// -----

func.func @moe_fp8_block_split_block(%x: tensor<?x256xbf16>, %ids: tensor<?x2xi64>, %w: tensor<?x2xf32>, %gu: tensor<4x128x256xf8E4M3FN>, %gus: tensor<4x1x2xf32>, %dn: tensor<4x256x64xf8E4M3FN>, %dns: tensor<4x2x1xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.moe_fp8_block' down 4x256x64 must be [E, 256, I], I a multiple of bn 128
  %0 = ad.moe_fp8_block %x, %ids, %w gate_up %gu, %gus down %dn, %dns block [128, 128] : (tensor<?x256xbf16>, tensor<?x2xi64>, tensor<?x2xf32>, tensor<4x128x256xf8E4M3FN>, tensor<4x1x2xf32>, tensor<4x256x64xf8E4M3FN>, tensor<4x2x1xf32>) -> tensor<?x256xbf16>
  func.return
}

// -----

func.func @moe_mxfp4_signed_blocks(%x: tensor<?x64xbf16>, %l: tensor<?x4xbf16>, %gub: tensor<4x192x2x16xi8>, %gus: tensor<4x192x2xui8>, %gb: tensor<4x192xbf16>, %db: tensor<4x64x3x16xui8>, %ds: tensor<4x64x3xui8>, %b: tensor<4x64xbf16>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.moe_mxfp4' blocks and scales must be ui8
  %0 = ad.moe_mxfp4 %x, %l gate_up %gub, %gus, %gb down %db, %ds, %b top_k 2 alpha 1.702000e+00 limit 7.000000e+00 : (tensor<?x64xbf16>, tensor<?x4xbf16>, tensor<4x192x2x16xi8>, tensor<4x192x2xui8>, tensor<4x192xbf16>, tensor<4x64x3x16xui8>, tensor<4x64x3xui8>, tensor<4x64xbf16>) -> tensor<?x64xbf16>
  func.return
}

// -----

func.func @moe_expert_count(%x: tensor<?x48xbf16>, %l: tensor<?x4xbf16>, %gu: tensor<6x64x48xbf16>, %d: tensor<6x48x32xbf16>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.moe' has 6 experts: 4 routed (router_logits) + 0 shared expected
  %0 = ad.moe %x, %l experts %gu, %d top_k 2 : (tensor<?x48xbf16>, tensor<?x4xbf16>, tensor<6x64x48xbf16>, tensor<6x48x32xbf16>) -> tensor<?x48xbf16>
  func.return
}

// -----

func.func @rope_odd_rotary_dim(%q: tensor<1x4x?x64xbf16>, %cos: tensor<1x?x15xbf16>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.rope' rotary_dim (the tables' last dim) 15 must be static, even and at most the head_dim 64
  %0, %1 = ad.rope %q, %q rope %cos, %cos interleaved : (tensor<1x4x?x64xbf16>, tensor<1x4x?x64xbf16>, tensor<1x?x15xbf16>, tensor<1x?x15xbf16>) -> (tensor<1x4x?x64xbf16>, tensor<1x4x?x64xbf16>)
  func.return
}

// -----

func.func @rope_attention_window_without_causal(%q: tensor<2x4x?x64xbf16>, %k: tensor<2x2x?x64xbf16>, %cos: tensor<1x?x64xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.rope_attention' window 4 must be positive and causal
  %0 = ad.rope_attention %q, %k, %k rope %cos, %cos window 4 scale 1.250000e-01 : (tensor<2x4x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<1x?x64xf32>, tensor<1x?x64xf32>) -> tensor<2x4x?x64xbf16>
  func.return
}

// -----

func.func @rope_tables_of_two_widths(%q: tensor<1x4x?x64xbf16>, %cos: tensor<1x?x32xbf16>, %sin: tensor<1x?x16xbf16>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.rope' cos and sin must be one [batch or 1, seq, rotary_dim] type
  %0, %1 = ad.rope %q, %q rope %cos, %sin : (tensor<1x4x?x64xbf16>, tensor<1x4x?x64xbf16>, tensor<1x?x32xbf16>, tensor<1x?x16xbf16>) -> (tensor<1x4x?x64xbf16>, tensor<1x4x?x64xbf16>)
  func.return
}

// -----

func.func @moe_weight_shapes(%x: tensor<?x48xbf16>, %l: tensor<?x4xbf16>, %gu: tensor<4x64x48xbf16>, %d: tensor<4x48x16xbf16>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.moe' expert weights 4x64x48 and 4x48x16 do not fit hidden 48: expected [E, 2 * I, 48] and [E, 48, I]
  %0 = ad.moe %x, %l experts %gu, %d top_k 2 : (tensor<?x48xbf16>, tensor<?x4xbf16>, tensor<4x64x48xbf16>, tensor<4x48x16xbf16>) -> tensor<?x48xbf16>
  func.return
}

// -----

func.func @cached_attention_interleaved_without_rope(%q: tensor<?x4x?x64xbf16>, %k: tensor<?x2x?x64xbf16>, %kc: tensor<8x512x2x64xbf16>, %s: tensor<?xi64>, %bt: tensor<?x1xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_attention' interleaved needs RoPE (cos and sin)
  %0 = ad.cached_attention %q, %k, %k interleaved cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x64xbf16>
  func.return
}

// -----

func.func @moe_top_k(%x: tensor<?x48xbf16>, %l: tensor<?x4xbf16>, %gu: tensor<4x64x48xbf16>, %d: tensor<4x48x32xbf16>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.moe' top_k 5 is not in 1..4
  %0 = ad.moe %x, %l experts %gu, %d top_k 5 : (tensor<?x48xbf16>, tensor<?x4xbf16>, tensor<4x64x48xbf16>, tensor<4x48x32xbf16>) -> tensor<?x48xbf16>
  func.return
}

// -----

func.func @cached_attention_rotary_dim_over_head_dim(%q: tensor<?x4x?x64xbf16>, %k: tensor<?x2x?x64xbf16>, %cos: tensor<?x?x66xbf16>, %kc: tensor<8x512x2x64xbf16>, %s: tensor<?xi64>, %bt: tensor<?x1xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_attention' rotary_dim (the tables' last dim) 66 must be static, even and at most the head_dim 64
  %0 = ad.cached_attention %q, %k, %k rope %cos, %cos cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>, tensor<?x?x66xbf16>, tensor<?x?x66xbf16>) -> tensor<?x4x?x64xbf16>
  func.return
}

// -----

func.func @rope_attention_softcap(%q: tensor<2x4x?x64xbf16>, %k: tensor<2x2x?x64xbf16>, %cos: tensor<1x?x64xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.rope_attention' softcap must be positive, not -1.0
  %0 = ad.rope_attention %q, %k, %k rope %cos, %cos causal softcap -1.000000e+00 scale 1.250000e-01 : (tensor<2x4x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<1x?x64xf32>, tensor<1x?x64xf32>) -> tensor<2x4x?x64xbf16>
  func.return
}

// -----

func.func @rope_attention_qk_norm_weight(%q: tensor<2x4x?x64xbf16>, %k: tensor<2x2x?x64xbf16>, %cos: tensor<1x?x64xf32>, %w: tensor<32xbf16>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.rope_attention' QK-norm weights must be [head_dim] = [64]
  %0 = ad.rope_attention %q, %k, %k rope %cos, %cos qk_norm(%w, %w : tensor<32xbf16>, tensor<32xbf16>) eps 1.000000e-06 causal scale 1.250000e-01 : (tensor<2x4x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<1x?x64xf32>, tensor<1x?x64xf32>) -> tensor<2x4x?x64xbf16>
  func.return
}

// -----

func.func @rope_attention_qk_norm_promoting_weight(%q: tensor<2x4x?x64xbf16>, %k: tensor<2x2x?x64xbf16>, %cos: tensor<1x?x64xf32>, %w: tensor<64xf32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.rope_attention' QK-norm weights must have the query's element type, or be weight_in_fp32 (a Llama-style weight of another type would promote)
  %0 = ad.rope_attention %q, %k, %k rope %cos, %cos qk_norm(%w, %w : tensor<64xf32>, tensor<64xf32>) eps 1.000000e-06 causal scale 1.250000e-01 : (tensor<2x4x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<1x?x64xf32>, tensor<1x?x64xf32>) -> tensor<2x4x?x64xbf16>
  func.return
}

// -----

func.func @cached_attention_qk_norm_weight(%q: tensor<?x4x?x64xbf16>, %k: tensor<?x2x?x64xbf16>, %kc: tensor<8x512x2x64xbf16>, %s: tensor<?xi64>, %w: tensor<64x1xbf16>, %bt: tensor<?x1xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_attention' QK-norm weights must be [head_dim] = [64]
  %0 = ad.cached_attention %q, %k, %k qk_norm(%w, %w : tensor<64x1xbf16>, tensor<64x1xbf16>) eps 1.000000e-06 cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x64xbf16>
  func.return
}

// -----

func.func @paged_attention_page_size(%q: tensor<1x4x?x64xbf16>, %k: tensor<1x2x?x64xbf16>, %kp: tensor<32x?x2x64xbf16>, %s: tensor<?xi64>, %bt: tensor<?x8xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_attention' page_size ? must be static and positive
  %0 = ad.cached_attention %q, %k, %k cache %kp, %kp block_tables %bt cache_starts %s query_starts %s : tensor<?xi64> scale 1.250000e-01 : (tensor<1x4x?x64xbf16>, tensor<1x2x?x64xbf16>, tensor<1x2x?x64xbf16>, tensor<32x?x2x64xbf16>, tensor<32x?x2x64xbf16>, tensor<?x8xi64>, tensor<?xi64>) -> tensor<1x4x?x64xbf16>
  func.return
}

// -----

func.func @paged_attention_block_tables(%q: tensor<1x4x?x64xbf16>, %k: tensor<1x2x?x64xbf16>, %kp: tensor<32x16x2x64xbf16>, %s: tensor<?xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_attention' block_tables must be a rank-2 i64 tensor
  %0 = ad.cached_attention %q, %k, %k cache %kp, %kp block_tables %s cache_starts %s query_starts %s : tensor<?xi64> scale 1.250000e-01 : (tensor<1x4x?x64xbf16>, tensor<1x2x?x64xbf16>, tensor<1x2x?x64xbf16>, tensor<32x16x2x64xbf16>, tensor<32x16x2x64xbf16>, tensor<?xi64>, tensor<?xi64>) -> tensor<1x4x?x64xbf16>
  func.return
}

// -----

func.func @paged_attention_flattened(%q: tensor<2x4x?x64xbf16>, %k: tensor<2x2x?x64xbf16>, %kp: tensor<32x16x2x64xbf16>, %s: tensor<?xi64>, %bt: tensor<?x8xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_attention' with query_starts takes one flattened batch: query [1, heads, tokens, head_dim], not batch 2
  %0 = ad.cached_attention %q, %k, %k cache %kp, %kp block_tables %bt cache_starts %s query_starts %s : tensor<?xi64> scale 1.250000e-01 : (tensor<2x4x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<2x2x?x64xbf16>, tensor<32x16x2x64xbf16>, tensor<32x16x2x64xbf16>, tensor<?x8xi64>, tensor<?xi64>) -> tensor<2x4x?x64xbf16>
  func.return
}

// -----

// The indexer's key cache holds its one key per token (128), not a head's query width.
func.func @cached_index_topk_cache_width(%iq: tensor<?x?x64x128xbf16>, %ik: tensor<?x?x128xbf16>, %iw: tensor<?x?x64xf32>, %ic: tensor<8x4096x64xbf16>, %s: tensor<?xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_index_topk' cache must be [slots, max_seq, 128] of the key's element type
  %sel = ad.cached_index_topk %iq, %ik, %iw cache %ic slots %s starts %s scale 1.000000e+00 topk 4 : (tensor<?x?x64x128xbf16>, tensor<?x?x128xbf16>, tensor<?x?x64xf32>, tensor<8x4096x64xbf16>, tensor<?xi64>, tensor<?xi64>) -> tensor<?x?x4xi64>
  func.return
}

// -----

// The selection is int64 positions, [batch, seq, k].
func.func @cached_mla_selected_dtype(%qn: tensor<?x128x?x128xbf16>, %qr: tensor<?x128x?x64xbf16>, %lat: tensor<?x1x?x512xbf16>, %kr: tensor<?x1x?x64xbf16>, %w: tensor<32768x512xbf16>, %c: tensor<8x512x576xbf16>, %bt: tensor<?x1xi64>, %s: tensor<?xi64>, %sel: tensor<?x?x4xi32>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_mla_attention' selected must be tensor<batch x seq x k x i64> of the query's batch and seq
  %0 = ad.cached_mla_attention %qn, %qr, %lat, %kr kv_b %w cache %c block_tables %bt cache_starts %s selected %sel : tensor<?x?x4xi32> scale 1.250000e-01 : (tensor<?x128x?x128xbf16>, tensor<?x128x?x64xbf16>, tensor<?x1x?x512xbf16>, tensor<?x1x?x64xbf16>, tensor<32768x512xbf16>, tensor<8x512x576xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x128x?x128xbf16>
  func.return
}

// -----

// A token window's state holds the input's channels.
func.func @cached_token_window_channels(%x: tensor<?x192x?xbf16>, %st: tensor<8x64x2xbf16>, %s: tensor<?xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_token_window' state must be the input's shape with static slots and width for its batch and token axes
  %0 = ad.cached_token_window %x state %st slots %s starts %s dim 2 : (tensor<?x192x?xbf16>, tensor<8x64x2xbf16>, tensor<?xi64>, tensor<?xi64>) -> tensor<?x192x?xbf16>
  func.return
}

// -----

func.func @cached_attention_selected_without_entries(%q: tensor<?x4x?x64xbf16>, %k: tensor<?x2x?x64xbf16>, %kc: tensor<8x512x2x64xbf16>, %s: tensor<?xi64>, %sel: tensor<?x?x2xi64>, %bt: tensor<?x1xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_attention' selected needs compressed entries
  %0 = ad.cached_attention %q, %k, %k cache %kc, %kc block_tables %bt cache_starts %s scale 1.250000e-01 selected %sel : tensor<?x?x2xi64> : (tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16>, tensor<8x512x2x64xbf16>, tensor<8x512x2x64xbf16>, tensor<?x1xi64>, tensor<?xi64>) -> tensor<?x4x?x64xbf16>
  func.return
}

// -----

// Its start rows are as many as the state's.
func.func @cached_token_window_initial(%v: tensor<?x?x32xbf16>, %v0: tensor<?x2x32xbf16>, %vst: tensor<8x1x32xbf16>, %s: tensor<?xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_token_window' initial must be [batch, 1, 32] of the input's element type
  %0 = ad.cached_token_window %v initial %v0 state %vst slots %s starts %s dim 1 : (tensor<?x?x32xbf16>, tensor<8x1x32xbf16>, tensor<?xi64>, tensor<?xi64>, tensor<?x2x32xbf16>) -> tensor<?x?x32xbf16>
  func.return
}

// -----

// The paged form's window is each flattened token's row one back: the input's type, not width + tokens.
func.func @cached_token_window_flattened(%v: tensor<1x?x32xbf16>, %vst: tensor<8x1x32xbf16>, %s: tensor<?xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_token_window' with query_starts: the result must be the input's type
  %0 = ad.cached_token_window %v state %vst slots %s starts %s query_starts %s : tensor<?xi64> dim 1 : (tensor<1x?x32xbf16>, tensor<8x1x32xbf16>, tensor<?xi64>, tensor<?xi64>) -> tensor<1x?x64xbf16>
  func.return
}

// -----

// With query_starts (the paged form's flattened sequences), a state op takes a batch of 1.
func.func @conv_query_starts_batch(%x: tensor<2x8x?xf32>, %w: tensor<8x1x3xf32>, %st: tensor<4x8x2xf32>, %s: tensor<?xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_causal_conv1d' with query_starts (the flattened sequences of the paged form) takes a batch of 1, not 2
  %0 = ad.cached_causal_conv1d %x, %w state %st slots %s starts %s query_starts %s : tensor<?xi64> : (tensor<2x8x?xf32>, tensor<8x1x3xf32>, tensor<4x8x2xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<2x8x?xf32>
  func.return
}

// -----

// The RG-LRU's state is one fp32 value per channel of the input's width.
func.func @cached_rg_lru_state(%x: tensor<?x?x64xbf16>, %st: tensor<8x32xf32>, %s: tensor<?xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_rg_lru' state must be [slots, 64] in f32
  %0 = ad.cached_rg_lru %x, %x state %st slots %s starts %s : (tensor<?x?x64xbf16>, tensor<?x?x64xbf16>, tensor<8x32xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<?x?x64xbf16>
  func.return
}

// -----

func.func @cached_rg_lru_gate(%x: tensor<?x?x64xbf16>, %a: tensor<?x?x32xbf16>, %st: tensor<8x64xf32>, %s: tensor<?xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_rg_lru' input and a must be one [batch, seq, width] shape, width static
  %0 = ad.cached_rg_lru %x, %a state %st slots %s starts %s : (tensor<?x?x64xbf16>, tensor<?x?x32xbf16>, tensor<8x64xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<?x?x64xbf16>
  func.return
}

// -----

// RWKV's WKV state is three fp32 values (num, den, max) per channel of the keys' width.
func.func @cached_wkv_state(%w: tensor<64xf32>, %x: tensor<?x?x64xbf16>, %st: tensor<8x64xf32>, %s: tensor<?xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_wkv' state must be [slots, 3, 64] in f32
  %0 = ad.cached_wkv %w, %w, %x, %x state %st slots %s starts %s : (tensor<64xf32>, tensor<64xf32>, tensor<?x?x64xbf16>, tensor<?x?x64xbf16>, tensor<8x64xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<?x?x64xbf16>
  func.return
}

// -----

func.func @cached_wkv_decay(%w: tensor<32xf32>, %x: tensor<?x?x64xbf16>, %st: tensor<8x3x64xf32>, %s: tensor<?xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_wkv' w and u must be [width]
  %0 = ad.cached_wkv %w, %w, %x, %x state %st slots %s starts %s : (tensor<32xf32>, tensor<32xf32>, tensor<?x?x64xbf16>, tensor<?x?x64xbf16>, tensor<8x3x64xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<?x?x64xbf16>
  func.return
}

// -----

func.func @cached_wkv_value(%w: tensor<64xf32>, %x: tensor<?x?x64xbf16>, %v: tensor<?x?x32xbf16>, %st: tensor<8x3x64xf32>, %s: tensor<?xi64>) {
  // CHECK: invalid.mlir:[[# @LINE + 1]]:3: error: 'ad.cached_wkv' key and value must be one [batch, seq, width] shape, width static
  %0 = ad.cached_wkv %w, %w, %x, %v state %st slots %s starts %s : (tensor<64xf32>, tensor<64xf32>, tensor<?x?x64xbf16>, tensor<?x?x32xbf16>, tensor<8x3x64xf32>, tensor<?xi64>, tensor<?xi64>) -> tensor<?x?x64xbf16>
  func.return
}
