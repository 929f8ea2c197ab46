"""RMSNorm with symbolic rows n = te.var (batch*seq), TE explicit casts, fp16, hidden 4096, n in 1..4096."""
import numpy as np
from tvm import te
Hd = 4096
SMALL = dict(Hd=64)
SYMBOLIC = {"n": [1, 7, 1021, 4096]}
def make():
    n = te.var("n")
    x = te.placeholder((n, Hd), "float16", name="x")
    w = te.placeholder((Hd,), "float16", name="w")
    k = te.reduce_axis((0, Hd), name="k")
    ss = te.compute((n,), lambda i: te.sum(te.power(x[i, k].astype("float32"), 2.0), axis=k), name="ss")
    o = te.compute((n, Hd), lambda i, j: (x[i, j].astype("float32") / te.sqrt(ss[i] / Hd + 1e-6)).astype("float16") * w[j], name="o")
    return te.create_prim_func([x, w, o])
def inputs(rng, n):
    return [rng.standard_normal((n, Hd)).astype(np.float32), rng.uniform(0.5, 1.5, (Hd,)).astype(np.float32)]
def reference(x, w, n):
    y = (x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)).astype(np.float16).astype(np.float64)
    return [y * w]
def torch_impl(x, w, n):
    import torch
    return [(x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w]
