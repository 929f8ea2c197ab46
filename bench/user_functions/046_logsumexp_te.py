"""Row logsumexp (max, sum exp, log) to a [rows] vector, TE, fp32, rows 512 x vocab 32000."""
import numpy as np
from tvm import te
R, V = 512, 32000
SMALL = dict(R=3, V=100)
def make():
    x = te.placeholder((R, V), "float32", name="logits")
    k = te.reduce_axis((0, V), name="k")
    m = te.compute((R,), lambda i: te.max(x[i, k], axis=k), name="m")
    k2 = te.reduce_axis((0, V), name="k2")
    s = te.compute((R,), lambda i: te.sum(te.exp(x[i, k2] - m[i]), axis=k2), name="s")
    o = te.compute((R,), lambda i: te.log(s[i]) + m[i], name="lse")
    return te.create_prim_func([x, o])
def inputs(rng):
    return [(rng.standard_normal((R, V)) * 4).astype(np.float32)]
def reference(x):
    m = x.max(-1); return [np.log(np.exp(x - m[:, None]).sum(-1)) + m]
def torch_impl(x):
    import torch
    return [torch.logsumexp(x, -1)]
