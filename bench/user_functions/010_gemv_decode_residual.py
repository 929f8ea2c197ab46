"""Decode GEMV (M=1) + residual, TE, W [N,K], fp16, K=4096 N=14336 (Mistral up-proj width)."""
import numpy as np
from tvm import te
M, K, N = 1, 4096, 14336
SMALL = dict(K=64, N=40)
def make():
    x = te.placeholder((M, K), "float16", name="x")
    w = te.placeholder((N, K), "float16", name="w")
    r = te.placeholder((M, N), "float16", name="res")
    k = te.reduce_axis((0, K), name="k")
    y = te.compute((M, N), lambda i, j: te.sum(x[i, k].astype("float32") * w[j, k].astype("float32"), axis=k), name="y")
    o = te.compute((M, N), lambda i, j: (y[i, j] + r[i, j].astype("float32")).astype("float16"), name="o")
    return te.create_prim_func([x, w, r, o])
def inputs(rng):
    return [rng.uniform(-1, 1, (M, K)).astype(np.float32), (rng.uniform(-1, 1, (N, K)) / np.sqrt(K)).astype(np.float32),
            rng.uniform(-1, 1, (M, N)).astype(np.float32)]
def reference(x, w, r):
    return [x @ w.T + r]
def torch_impl(x, w, r):
    return [x @ w.T + r]
