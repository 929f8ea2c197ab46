"""RMSNorm over the last axis, TE with explicit fp32 casts (sum of squares, rsqrt, weight), fp16, rows 4096 x hidden 4096 (Llama-7B prefill)."""
import numpy as np
from tvm import te
R, Hd = 4096, 4096
EPS = 1e-6
SMALL = dict(R=7, Hd=64)
def make():
    x = te.placeholder((R, Hd), "float16", name="x")
    w = te.placeholder((Hd,), "float16", name="w")
    k = te.reduce_axis((0, Hd), name="k")
    ss = te.compute((R,), lambda i: te.sum(x[i, k].astype("float32") * x[i, k].astype("float32"), axis=k), name="ss")
    o = te.compute((R, Hd), lambda i, j: (x[i, j].astype("float32") * te.rsqrt(ss[i] / Hd + EPS) * w[j].astype("float32")).astype("float16"), name="o")
    return te.create_prim_func([x, w, o])
def inputs(rng):
    return [rng.standard_normal((R, Hd)).astype(np.float32), rng.uniform(0.5, 1.5, (Hd,)).astype(np.float32)]
def reference(x, w):
    return [x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * w]
def torch_impl(x, w):
    import torch
    return [torch.nn.functional.rms_norm(x.float(), (Hd,), w.float(), EPS).to(x.dtype)]
