"""`ad-bench`: kernel benchmarks (GPU), compile time, modelled memory traffic and PTX resources
(CPU), written as JSON + markdown + plots under `benchmarks/results/<machine>/`."""
