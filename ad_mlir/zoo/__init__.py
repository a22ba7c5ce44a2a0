"""The HF model zoo: tiny built-in families (`tiny`), every transformers causal-LM type built
small (`small`) and the checkpoints a `--model` argument names (`checkpoints`). It imports
nothing else of ad_mlir."""
