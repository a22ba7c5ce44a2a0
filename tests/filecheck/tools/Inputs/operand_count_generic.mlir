"func.func"() <{sym_name = "f", function_type = (tensor<2x3xf32>) -> ()}> ({
^bb0(%x: tensor<2x3xf32>):
  %0 = "ad.add"(%x) : (tensor<2x3xf32>) -> tensor<2x3xf32>
  "func.return"() : () -> ()
}) : () -> ()
