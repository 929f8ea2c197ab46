"""Gated SwiGLU dense silu(x Wg^T) * (x Wu^T), TE with explicit casts, two [N,K] weights, fp16, M=512 K=4096 N=11008 (Llama-7B)."""
import numpy as np
from tvm import te
M, K, N = 512, 4096, 11008
SMALL = dict(M=16, K=64, N=40)
def make():
    x = te.placeholder((M, K), "float16", name="x")
    wg = te.placeholder((N, K), "float16", name="w_gate")
    wu = te.placeholder((N, K), "float16", name="w_up")
    k = te.reduce_axis((0, K), name="k")
    g = te.compute((M, N), lambda i, j: te.sum(x[i, k].astype("float32") * wg[j, k].astype("float32"), axis=k), name="g")
    k2 = te.reduce_axis((0, K), name="k2")
    u = te.compute((M, N), lambda i, j: te.sum(x[i, k2].astype("float32") * wu[j, k2].astype("float32"), axis=k2), name="u")
    o = te.compute((M, N), lambda i, j: (g[i, j] * te.sigmoid(g[i, j]) * u[i, j]).astype("float16"), name="o")
    return te.create_prim_func([x, wg, wu, o])
def inputs(rng):
    s = 2 / np.sqrt(K)
    return [rng.uniform(-1, 1, (M, K)).astype(np.float32), (rng.uniform(-1, 1, (N, K)) * s).astype(np.float32),
            (rng.uniform(-1, 1, (N, K)) * s).astype(np.float32)]
def reference(x, wg, wu):
    g = x @ wg.T; u = x @ wu.T
    return [g / (1 + np.exp(-g)) * u]
def torch_impl(x, wg, wu):
    import torch
    return [torch.nn.functional.silu(x @ wg.T) * (x @ wu.T)]
