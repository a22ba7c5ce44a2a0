"""Runnable examples (`python -m ad_mlir.examples.<name>`)."""
