// decompose: last-dim softmax into row-reduction primitives, computed in f32 for bf16/f16.
// RUN: ad-opt %s -p decompose | filecheck %s
// RUN: ad-opt %s -p decompose,fuse-elementwise | filecheck %s --check-prefix=FUSED

// CHECK-LABEL: func.func @softmax
// CHECK-NEXT:    %[[XF:.*]] = ad.cast %x : tensor<2x?x8xbf16> -> tensor<2x?x8xf32>
// CHECK-NEXT:    %[[M:.*]] = ad.amax %[[XF]] dim [-1] keepdim : tensor<2x?x8xf32> -> tensor<2x?x1xf32>
// CHECK-NEXT:    %[[D:.*]] = ad.sub %[[XF]], %[[M]]
// CHECK-NEXT:    %[[E:.*]] = ad.exp %[[D]]
// CHECK-NEXT:    %[[S:.*]] = ad.sum %[[E]] dim [-1] keepdim : tensor<2x?x8xf32> -> tensor<2x?x1xf32>
// CHECK-NEXT:    %[[Q:.*]] = ad.div %[[E]], %[[S]]
// CHECK-NEXT:    %[[Y:.*]] = ad.cast %[[Q]] : tensor<2x?x8xf32> -> tensor<2x?x8xbf16>
// CHECK-NEXT:    %[[YM:.*]] = ad.amax %y dim [-1] keepdim : tensor<4x8xf32> -> tensor<4x1xf32>
// CHECK-NEXT:    %[[YD:.*]] = ad.sub %y, %[[YM]] : tensor<4x8xf32>, tensor<4x1xf32> -> tensor<4x8xf32>
// CHECK-NEXT:    %[[YE:.*]] = ad.exp %[[YD]] : tensor<4x8xf32> -> tensor<4x8xf32>
// CHECK-NEXT:    %[[YS:.*]] = ad.sum %[[YE]] dim [-1] keepdim : tensor<4x8xf32> -> tensor<4x1xf32>
// CHECK-NEXT:    %[[YQ:.*]] = ad.div %[[YE]], %[[YS]] : tensor<4x8xf32>, tensor<4x1xf32> -> tensor<4x8xf32>
// CHECK-NEXT:    %[[Y0:.*]] = ad.softmax %y dim 0
// CHECK-NEXT:    func.return %[[Y]], %[[YQ]], %[[Y0]]
// FUSED-LABEL: func.func @softmax
// FUSED-COUNT-2: ad.fused
// FUSED-NOT:     ad.fused
// FUSED:         ad.softmax %y dim 0
func.func @softmax(%x: tensor<2x?x8xbf16>, %y: tensor<4x8xf32>) -> (tensor<2x?x8xbf16>, tensor<4x8xf32>, tensor<4x8xf32>) {
  %0 = ad.softmax %x dim -1 : tensor<2x?x8xbf16> -> tensor<2x?x8xbf16>
  %1 = ad.softmax %y dim 1 : tensor<4x8xf32> -> tensor<4x8xf32>
  %2 = ad.softmax %y dim 0 : tensor<4x8xf32> -> tensor<4x8xf32>
  func.return %0, %1, %2 : tensor<2x?x8xbf16>, tensor<4x8xf32>, tensor<4x8xf32>
}
