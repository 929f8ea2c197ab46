"""FFN chain x W1^T + b1 -> GELU(erf) -> W2^T + b2 in one PrimFunc, TE explicit casts, fp16, M=1024 H=768 I=3072 (BERT-base)."""
import numpy as np
from tvm import te
M, H, I = 1024, 768, 3072
SMALL = dict(M=16, H=32, I=48)
def make():
    x = te.placeholder((M, H), "float16", name="x")
    w1 = te.placeholder((I, H), "float16", name="w1")
    b1 = te.placeholder((I,), "float16", name="b1")
    w2 = te.placeholder((H, I), "float16", name="w2")
    b2 = te.placeholder((H,), "float16", name="b2")
    k = te.reduce_axis((0, H), name="k")
    h = te.compute((M, I), lambda i, j: te.sum(x[i, k].astype("float32") * w1[j, k].astype("float32"), axis=k), name="h")
    def g(i, j):
        v = h[i, j] + b1[j].astype("float32")
        return (0.5 * v * (1.0 + te.erf(v * 0.7071067811865476))).astype("float16")
    a = te.compute((M, I), g, name="act")
    k2 = te.reduce_axis((0, I), name="k2")
    y = te.compute((M, H), lambda i, j: te.sum(a[i, k2].astype("float32") * w2[j, k2].astype("float32"), axis=k2), name="y")
    o = te.compute((M, H), lambda i, j: (y[i, j] + b2[j].astype("float32")).astype("float16"), name="o")
    return te.create_prim_func([x, w1, b1, w2, b2, o])
def inputs(rng):
    return [rng.uniform(-1, 1, (M, H)).astype(np.float32), (rng.uniform(-1, 1, (I, H)) * 2 / np.sqrt(H)).astype(np.float32),
            rng.uniform(-1, 1, (I,)).astype(np.float32), (rng.uniform(-1, 1, (H, I)) * 2 / np.sqrt(I)).astype(np.float32),
            rng.uniform(-1, 1, (H,)).astype(np.float32)]
def reference(x, w1, b1, w2, b2):
    from math import erf
    v = x @ w1.T + b1
    a = (0.5 * v * (1 + np.vectorize(erf)(v / np.sqrt(2)))).astype(np.float16).astype(np.float64)
    return [a @ w2.T + b2]
def torch_impl(x, w1, b1, w2, b2):
    import torch
    F = torch.nn.functional
    return [F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)]
