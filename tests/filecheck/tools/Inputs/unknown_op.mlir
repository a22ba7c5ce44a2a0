func.func @f(%x: tensor<2x3xf32>) {
  %0 = ad.frobnicate %x : tensor<2x3xf32>
  func.return
}
