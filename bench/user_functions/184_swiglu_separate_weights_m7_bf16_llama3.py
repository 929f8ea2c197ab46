"""SwiGLU FFN input with separate gate and up weights at M=7 (prime: 7 speculative draft tokens verified at once): silu(x Wg^T) * (x Wu^T), two te.sum reductions with fp32 casts, TE, bf16, M=7 K=4096 N=14336 (Llama-3-8B mlp)."""
import numpy as np
from tvm import te
M, K, N = 7, 4096, 14336
SMALL = dict(K=64, N=48)
def make():
    x = te.placeholder((M, K), "bfloat16", name="x")
    wg = te.placeholder((N, K), "bfloat16", name="w_gate")
    wu = te.placeholder((N, K), "bfloat16", name="w_up")
    k1 = te.reduce_axis((0, K), name="k1")
    k2 = te.reduce_axis((0, K), name="k2")
    g = te.compute((M, N), lambda i, j: te.sum(x[i, k1].astype("float32") * wg[j, k1].astype("float32"), axis=k1), name="gate")
    u = te.compute((M, N), lambda i, j: te.sum(x[i, k2].astype("float32") * wu[j, k2].astype("float32"), axis=k2), name="up")
    h = te.compute((M, N), lambda i, j: (g[i, j] * te.sigmoid(g[i, j]) * u[i, j]).astype("bfloat16"), name="h")
    return te.create_prim_func([x, wg, wu, h])
def inputs(rng):
    return [rng.uniform(-1, 1, (M, K)).astype(np.float32), (rng.uniform(-1, 1, (N, K)) * 2 / np.sqrt(K)).astype(np.float32),
            (rng.uniform(-1, 1, (N, K)) * 2 / np.sqrt(K)).astype(np.float32)]
def reference(x, wg, wu):
    g = x @ wg.T
    return [g / (1 + np.exp(-g)) * (x @ wu.T)]
def torch_impl(x, wg, wu):
    import torch
    return [torch.nn.functional.silu(x @ wg.T) * (x @ wu.T)]
