"""Dense + bias + residual with symbolic rows M = te.var('n'), TE, W [N,K], fp16, K=4096 N=4096, n in 1..1000."""
import numpy as np
from tvm import te
K, N = 4096, 4096
SMALL = dict(K=64, N=32)
SYMBOLIC = {"n": [1, 17, 128, 1000]}
def make():
    n = te.var("n")
    x = te.placeholder((n, K), "float16", name="x")
    w = te.placeholder((N, K), "float16", name="w")
    b = te.placeholder((N,), "float16", name="b")
    r = te.placeholder((n, N), "float16", name="res")
    k = te.reduce_axis((0, K), name="k")
    y = te.compute((n, N), lambda i, j: te.sum(x[i, k].astype("float32") * w[j, k].astype("float32"), axis=k), name="y")
    o = te.compute((n, N), lambda i, j: (y[i, j] + b[j].astype("float32") + r[i, j].astype("float32")).astype("float16"), name="o")
    return te.create_prim_func([x, w, b, r, o])
def inputs(rng, n):
    return [rng.uniform(-1, 1, (n, K)).astype(np.float32), (rng.uniform(-1, 1, (N, K)) / np.sqrt(K)).astype(np.float32),
            rng.uniform(-1, 1, (N,)).astype(np.float32), rng.uniform(-1, 1, (n, N)).astype(np.float32)]
def reference(x, w, b, r, n):
    return [x @ w.T + b + r]
def torch_impl(x, w, b, r, n):
    import torch
    return [torch.nn.functional.linear(x, w, b) + r]
