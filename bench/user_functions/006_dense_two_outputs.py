"""Dense with two outputs (pre-activation and SiLU), TE, W [N,K], fp16, M=128 K=1024 N=4096."""
import numpy as np
from tvm import te
M, K, N = 128, 1024, 4096
SMALL = dict(M=16, K=32, N=24)
def make():
    x = te.placeholder((M, K), "float16", name="x")
    w = te.placeholder((N, K), "float16", name="w")
    k = te.reduce_axis((0, K), name="k")
    y = te.compute((M, N), lambda i, j: te.sum(x[i, k].astype("float32") * w[j, k].astype("float32"), axis=k), name="y")
    pre = te.compute((M, N), lambda i, j: y[i, j].astype("float16"), name="pre")
    act = te.compute((M, N), lambda i, j: (y[i, j] / (1.0 + te.exp(-y[i, j]))).astype("float16"), name="act")
    return te.create_prim_func([x, w, pre, act])
def inputs(rng):
    return [rng.uniform(-1, 1, (M, K)).astype(np.float32), (rng.uniform(-1, 1, (N, K)) / np.sqrt(K) * 3).astype(np.float32)]
def reference(x, w):
    y = x @ w.T
    return [y, y / (1 + np.exp(-y))]
def torch_impl(x, w):
    import torch
    y = x @ w.T
    return [y, torch.nn.functional.silu(y)]
