"""Decode batch-4 x @ W with W [K,N] (no transpose), TE explicit casts, fp16, K=5120 N=5120 (Qwen-14B-ish hidden)."""
import numpy as np
from tvm import te
M, K, N = 4, 5120, 5120
SMALL = dict(K=64, N=40)
def make():
    x = te.placeholder((M, K), "float16", name="x")
    w = te.placeholder((K, N), "float16", name="w")
    k = te.reduce_axis((0, K), name="k")
    y = te.compute((M, N), lambda i, j: te.sum(x[i, k].astype("float32") * w[k, j].astype("float32"), axis=k), name="y")
    o = te.compute((M, N), lambda i, j: y[i, j].astype("float16"), name="o")
    return te.create_prim_func([x, w, o])
def inputs(rng):
    return [rng.uniform(-1, 1, (M, K)).astype(np.float32), (rng.uniform(-1, 1, (K, N)) / np.sqrt(K)).astype(np.float32)]
def reference(x, w):
    return [x @ w]
def torch_impl(x, w):
    return [x @ w]
