"""Dense + bias + GELU-tanh (GPT-2 gelu_new), TE, W [N,K], fp16, M=256 K=768 N=3072."""
import numpy as np
from tvm import te
import tvm
M, K, N = 256, 768, 3072
SMALL = dict(M=16, K=64, N=48)
def make():
    x = te.placeholder((M, K), "float16", name="x")
    w = te.placeholder((N, K), "float16", name="w")
    b = te.placeholder((N,), "float16", name="b")
    k = te.reduce_axis((0, K), name="k")
    y = te.compute((M, N), lambda i, j: te.sum(x[i, k].astype("float32") * w[j, k].astype("float32"), axis=k), name="y")
    def gelu(i, j):
        v = y[i, j] + b[j].astype("float32")
        inner = 0.7978845608028654 * (v + 0.044715 * v * v * v)
        return (0.5 * v * (1.0 + te.tanh(inner))).astype("float16")
    o = te.compute((M, N), gelu, name="gelu")
    return te.create_prim_func([x, w, b, o])
def inputs(rng):
    return [rng.uniform(-1, 1, (M, K)).astype(np.float32), (rng.uniform(-1, 1, (N, K)) / np.sqrt(K) * 2).astype(np.float32),
            rng.uniform(-1, 1, (N,)).astype(np.float32)]
def reference(x, w, b):
    v = x @ w.T + b
    return [0.5 * v * (1 + np.tanh(0.7978845608028654 * (v + 0.044715 * v ** 3)))]
def torch_impl(x, w, b):
    import torch
    return [torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b), approximate="tanh")]
