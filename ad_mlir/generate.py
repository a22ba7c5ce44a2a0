"""`python -m ad_mlir.generate`: the generation CLI (`ad_mlir.llm.generate`)."""

from ad_mlir.llm.generate import main

if __name__ == "__main__":
    main()
