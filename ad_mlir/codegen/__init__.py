"""Triton code generation for `ad.fused` regions: kernel source, cache, PTX, `-t triton`."""
