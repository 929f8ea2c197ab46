"""Fused gate_up projection W[2N,K] then silu(first half)*second half in one PrimFunc, TE, fp16, M=256 K=2048 N=8192 (Phi-3-mini-like)."""
import numpy as np
from tvm import te
M, K, N = 256, 2048, 8192
SMALL = dict(M=16, K=64, N=24)
def make():
    x = te.placeholder((M, K), "float16", name="x")
    w = te.placeholder((2 * N, K), "float16", name="w_gate_up")
    k = te.reduce_axis((0, K), name="k")
    y = te.compute((M, 2 * N), lambda i, j: te.sum(x[i, k].astype("float32") * w[j, k].astype("float32"), axis=k), name="y")
    o = te.compute((M, N), lambda i, j: (y[i, j] * te.sigmoid(y[i, j]) * y[i, j + N]).astype("float16"), name="o")
    return te.create_prim_func([x, w, o])
def inputs(rng):
    return [rng.uniform(-1, 1, (M, K)).astype(np.float32), (rng.uniform(-1, 1, (2 * N, K)) * 2 / np.sqrt(K)).astype(np.float32)]
def reference(x, w):
    y = x @ w.T; g, u = y[:, :N], y[:, N:]
    return [g / (1 + np.exp(-g)) * u]
def torch_impl(x, w):
    import torch
    g, u = (x @ w.T).chunk(2, dim=-1)
    return [torch.nn.functional.silu(g) * u]
