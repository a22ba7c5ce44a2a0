"""`python -m ad_mlir`: SmolLM2 answers a question through the compiled, cached graph
(`ad_mlir.generate`'s options); `python -m ad_mlir --report [...]`: a tiny HF model through the
pipeline, with a report of every stage (`ad_mlir.tools.report`'s options)."""

import sys

if "--report" in sys.argv[1:]:
    import torch

    from ad_mlir.codegen.interpreter import default_to_interpreter

    if "--no-interpret" not in sys.argv[1:] and not torch.cuda.is_available():
        default_to_interpreter()  # before ad_mlir.tools.report imports torch.export, which imports triton
    from ad_mlir.tools.report import main

    main([a for a in sys.argv[1:] if a != "--report"])
else:
    from ad_mlir.llm.generate import main

    main()
