func.func @f(%x: tensor<2x3xf32>) {
  %0 = ad.neg %x : tensor<2x3xf64> -> tensor<2x3xf32>
  func.return
}
