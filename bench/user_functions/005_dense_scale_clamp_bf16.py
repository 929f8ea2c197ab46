"""Dense with per-column scale vector then clamp [-4,4], TE, W [N,K], bf16, M=384 K=4096 N=4096."""
import numpy as np
from tvm import te
M, K, N = 384, 4096, 4096
SMALL = dict(M=24, K=64, N=40)
def make():
    x = te.placeholder((M, K), "bfloat16", name="x")
    w = te.placeholder((N, K), "bfloat16", name="w")
    s = te.placeholder((N,), "float32", name="scale")
    k = te.reduce_axis((0, K), name="k")
    y = te.compute((M, N), lambda i, j: te.sum(x[i, k].astype("float32") * w[j, k].astype("float32"), axis=k), name="y")
    o = te.compute((M, N), lambda i, j: te.min(te.max(y[i, j] * s[j], -4.0), 4.0).astype("bfloat16"), name="clamp")
    return te.create_prim_func([x, w, s, o])
def inputs(rng):
    return [rng.uniform(-1, 1, (M, K)).astype(np.float32), (rng.uniform(-1, 1, (N, K)) / np.sqrt(K)).astype(np.float32),
            rng.uniform(0.5, 8, (N,)).astype(np.float32)]
def reference(x, w, s):
    return [np.clip((x @ w.T) * s, -4, 4)]
def torch_impl(x, w, s):
    import torch
    return [torch.clamp((x @ w.T).float() * s, -4, 4).to(x.dtype)]
