"""What `ad` ops mean in torch: the op table (FX target <-> op), the torch reference of the
LLM-level ops and the reference evaluator of a function (the CPU path and what verification
compares against)."""
