"""The kernel templates: one module per templated op (ending in its `EMITTER`, listed in
`codegen/emitters.py`), the generic region kernel, and the pieces they share (the module
skeleton, the source writer, the block sizes, the per-sequence launch of the state ops)."""
