"""The OpenAI-compatible server over the continuous-batching engine (`ad-mlir serve`)."""
