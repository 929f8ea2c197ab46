"""Dense + bias + ReLU, TE with explicit fp32 casts, W [N,K], fp16, M=512 K=4096 N=4096 (Llama-7B o_proj-ish)."""
import numpy as np
from tvm import te
M, K, N = 512, 4096, 4096
SMALL = dict(M=33, K=64, N=48)
def make():
    x = te.placeholder((M, K), "float16", name="x")
    w = te.placeholder((N, K), "float16", name="w")
    b = te.placeholder((N,), "float16", name="b")
    k = te.reduce_axis((0, K), name="k")
    y = te.compute((M, N), lambda i, j: te.sum(x[i, k].astype("float32") * w[j, k].astype("float32"), axis=k), name="y")
    o = te.compute((M, N), lambda i, j: te.max(y[i, j] + b[j].astype("float32"), te.const(0, "float32")).astype("float16"), name="o")
    return te.create_prim_func([x, w, b, o])
def inputs(rng):
    return [rng.uniform(-1, 1, (M, K)).astype(np.float32), (rng.uniform(-1, 1, (N, K)) / np.sqrt(K)).astype(np.float32),
            rng.uniform(-1, 1, (N,)).astype(np.float32)]
def reference(x, w, b):
    return [np.maximum(x @ w.T + b, 0)]
def torch_impl(x, w, b):
    import torch
    return [torch.relu(torch.nn.functional.linear(x, w, b))]
