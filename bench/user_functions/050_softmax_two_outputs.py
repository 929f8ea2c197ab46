"""Softmax returning both probabilities and per-row logsumexp (two outputs), TE, fp16 in, fp16 probs + fp32 lse, rows 4096 x 4096."""
import numpy as np
from tvm import te
R, C = 4096, 4096
SMALL = dict(R=3, C=64)
def make():
    x = te.placeholder((R, C), "float16", name="x")
    k = te.reduce_axis((0, C), name="k")
    m = te.compute((R,), lambda i: te.max(x[i, k].astype("float32"), axis=k), name="m")
    k2 = te.reduce_axis((0, C), name="k2")
    s = te.compute((R,), lambda i: te.sum(te.exp(x[i, k2].astype("float32") - m[i]), axis=k2), name="s")
    p = te.compute((R, C), lambda i, j: (te.exp(x[i, j].astype("float32") - m[i]) / s[i]).astype("float16"), name="p")
    lse = te.compute((R,), lambda i: m[i] + te.log(s[i]), name="lse")
    return te.create_prim_func([x, p, lse])
def inputs(rng):
    return [(rng.standard_normal((R, C)) * 3).astype(np.float32)]
def reference(x):
    m = x.max(-1, keepdims=True); e = np.exp(x - m); s = e.sum(-1, keepdims=True)
    return [e / s, (m + np.log(s))[:, 0]]
def torch_impl(x):
    import torch
    return [torch.softmax(x.float(), -1).to(x.dtype), torch.logsumexp(x.float(), -1)]
