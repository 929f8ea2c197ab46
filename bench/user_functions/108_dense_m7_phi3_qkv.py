"""Dense with 7 rows (speculative decoding: 7 draft tokens verified at once), TE explicit fp32 casts, W [N,K], fp16, M=7 K=3072 N=9216 (Phi-3-mini fused qkv_proj)."""
import numpy as np
from tvm import te
M, K, N = 7, 3072, 9216
SMALL = dict(K=64, N=48)
def make():
    x = te.placeholder((M, K), "float16", name="x")
    w = te.placeholder((N, K), "float16", name="w")
    k = te.reduce_axis((0, K), name="k")
    y = te.compute((M, N), lambda i, j: te.sum(x[i, k].astype("float32") * w[j, k].astype("float32"), axis=k), name="y")
    o = te.compute((M, N), lambda i, j: y[i, j].astype("float16"), name="o")
    return te.create_prim_func([x, w, o])
def inputs(rng):
    return [rng.uniform(-1, 1, (M, K)).astype(np.float32), (rng.uniform(-1, 1, (N, K)) / np.sqrt(K)).astype(np.float32)]
def reference(x, w):
    return [x @ w.T]
def torch_impl(x, w):
    import torch
    return [torch.nn.functional.linear(x, w)]
