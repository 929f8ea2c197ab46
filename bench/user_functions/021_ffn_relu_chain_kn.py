"""FFN chain relu(x @ W1) @ W2 with [K,N] weights (x @ W), TE explicit casts, fp16, M=1021 (prime) H=1024 I=4096."""
import numpy as np
from tvm import te
M, H, I = 1021, 1024, 4096
SMALL = dict(M=13, H=32, I=48)
def make():
    x = te.placeholder((M, H), "float16", name="x")
    w1 = te.placeholder((H, I), "float16", name="w1")
    w2 = te.placeholder((I, H), "float16", name="w2")
    k = te.reduce_axis((0, H), name="k")
    h = te.compute((M, I), lambda i, j: te.sum(x[i, k].astype("float32") * w1[k, j].astype("float32"), axis=k), name="h")
    a = te.compute((M, I), lambda i, j: te.max(h[i, j], 0.0).astype("float16"), name="relu")
    k2 = te.reduce_axis((0, I), name="k2")
    y = te.compute((M, H), lambda i, j: te.sum(a[i, k2].astype("float32") * w2[k2, j].astype("float32"), axis=k2), name="y")
    o = te.compute((M, H), lambda i, j: y[i, j].astype("float16"), name="o")
    return te.create_prim_func([x, w1, w2, o])
def inputs(rng):
    return [rng.uniform(-1, 1, (M, H)).astype(np.float32), (rng.uniform(-1, 1, (H, I)) * 2 / np.sqrt(H)).astype(np.float32),
            (rng.uniform(-1, 1, (I, H)) * 2 / np.sqrt(I)).astype(np.float32)]
def reference(x, w1, w2):
    a = np.maximum(x @ w1, 0).astype(np.float16).astype(np.float64)
    return [a @ w2]
def torch_impl(x, w1, w2):
    import torch
    return [torch.relu(x @ w1) @ w2]
