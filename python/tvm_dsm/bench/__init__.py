"""Benchmark harness: CUDA-graph timing (needs torch on a GPU) and the results schema."""
