func.func @f(%x: tensor<2x3xf32>) {
  %0 = ad.neg %z : tensor<2x3xf32> -> tensor<2x3xf32>
  func.return
}
