"""The generation runtime (`LLM`: caches, slots, prefill and decode, sampling) and its CLI
(`python -m ad_mlir.generate`), users of the compiler."""
