"""ConvNeXt LayerNorm(data_format='channels_first') as its Python class writes it: u = x.mean(1), s = (x - u)^2.mean(1), (x - u) / sqrt(s + 1e-6) * w[:, None, None] + b[:, None, None], the reduction over the channel axis of NCHW (not the last), TE fp32 math, fp16 in/out, [B,C,H,W] = [32,96,56,56] (ConvNeXt-T stem)."""
import numpy as np
from tvm import te, topi
B, C, H, W = 32, 96, 56, 56
SMALL = dict(B=2, C=12, H=5, W=7)
def make():
    x = te.placeholder((B, C, H, W), "float16", name="x")
    w = te.placeholder((C,), "float16", name="w")
    b = te.placeholder((C,), "float16", name="b")
    c1 = te.reduce_axis((0, C), name="c1")
    su = te.compute((B, H, W), lambda n, i, j: te.sum(x[n, c1, i, j].astype("float32"), axis=c1), name="sum")
    u = te.compute((B, H, W), lambda n, i, j: su[n, i, j] / C, name="mean")
    c2 = te.reduce_axis((0, C), name="c2")
    ss = te.compute((B, H, W), lambda n, i, j: te.sum(te.power(x[n, c2, i, j].astype("float32") - u[n, i, j], 2.0), axis=c2), name="sum_sq")
    s = te.compute((B, H, W), lambda n, i, j: ss[n, i, j] / C, name="var")
    y = te.compute((B, C, H, W), lambda n, c, i, j: ((x[n, c, i, j].astype("float32") - u[n, i, j]) / te.sqrt(s[n, i, j] + 1e-6)
                                                    * w[c].astype("float32") + b[c].astype("float32")).astype("float16"), name="y")
    return te.create_prim_func([x, w, b, y])
def inputs(rng):
    return [(rng.standard_normal((B, C, H, W)) * 3 + 1).astype(np.float32), rng.uniform(0.5, 1.5, (C,)).astype(np.float32),
            rng.uniform(-0.5, 0.5, (C,)).astype(np.float32)]
def reference(x, w, b):
    u = x.mean(1, keepdims=True); s = ((x - u) ** 2).mean(1, keepdims=True)
    return [(x - u) / np.sqrt(s + 1e-6) * w[:, None, None] + b[:, None, None]]
def torch_impl(x, w, b):
    import torch
    u = x.mean(1, keepdim=True); s = (x - u).pow(2).mean(1, keepdim=True)
    return [((x - u) / torch.sqrt(s + 1e-6)) * w[:, None, None] + b[:, None, None]]
