from ad_mlir.report import main

main()
