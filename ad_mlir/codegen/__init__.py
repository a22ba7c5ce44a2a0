"""Triton code generation for `ad.fused` regions (the codegen issue builds it)."""
