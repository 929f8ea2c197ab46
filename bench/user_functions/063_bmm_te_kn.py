"""torch.bmm-like [B,M,K] @ [B,K,N] (no transpose), TE explicit casts, fp16, B=64 M=1024 K=64 N=1024."""
import numpy as np
from tvm import te
BT, M, K, N = 64, 1024, 64, 1024
SMALL = dict(BT=2, M=8, K=16, N=8)
def make():
    a = te.placeholder((BT, M, K), "float16", name="a")
    b = te.placeholder((BT, K, N), "float16", name="b")
    k = te.reduce_axis((0, K), name="k")
    c = te.compute((BT, M, N), lambda t, i, j: te.sum(a[t, i, k].astype("float32") * b[t, k, j].astype("float32"), axis=k), name="c")
    return te.create_prim_func([a, b, te.compute((BT, M, N), lambda t, i, j: c[t, i, j].astype("float16"), name="o")])
def inputs(rng):
    return [rng.uniform(-1, 1, (BT, M, K)).astype(np.float32), rng.uniform(-1, 1, (BT, K, N)).astype(np.float32)]
def reference(a, b):
    return [a @ b]
def torch_impl(a, b):
    import torch
    return [torch.bmm(a, b)]
