"""Softmax with temperature over a large vocab, TE explicit fp32 math, bf16 in/out, rows 128 x vocab 151936 (Qwen2)."""
import numpy as np
from tvm import te
R, V = 128, 151936
SMALL = dict(R=3, V=100)
T_ = 0.7
def make():
    x = te.placeholder((R, V), "bfloat16", name="logits")
    k = te.reduce_axis((0, V), name="k")
    m = te.compute((R,), lambda i: te.max(x[i, k].astype("float32") / T_, axis=k), name="m")
    e = te.compute((R, V), lambda i, j: te.exp(x[i, j].astype("float32") / T_ - m[i]), name="e")
    k2 = te.reduce_axis((0, V), name="k2")
    s = te.compute((R,), lambda i: te.sum(e[i, k2], axis=k2), name="s")
    o = te.compute((R, V), lambda i, j: (e[i, j] / s[i]).astype("bfloat16"), name="p")
    return te.create_prim_func([x, o])
def inputs(rng):
    return [(rng.standard_normal((R, V)) * 3).astype(np.float32)]
def reference(x):
    z = x / T_; p = np.exp(z - z.max(-1, keepdims=True)); return [p / p.sum(-1, keepdims=True)]
def torch_impl(x):
    import torch
    return [torch.softmax(x.float() / T_, -1).to(x.dtype)]
