"""Softmax backward for attention probabilities: dx = y * (dy - sum_j(dy * y)), fp32 row dot then elementwise, TE, fp16 y/dy -> fp16 dx, rows B*H*S = 8*12*512 x S=512 (BERT-base training)."""
import numpy as np
from tvm import te
R, S = 8 * 12 * 512, 512
SMALL = dict(R=6, S=33)
def make():
    y = te.placeholder((R, S), "float16", name="probs")
    dy = te.placeholder((R, S), "float16", name="grad_probs")
    k = te.reduce_axis((0, S), name="k")
    dot = te.compute((R,), lambda i: te.sum(dy[i, k].astype("float32") * y[i, k].astype("float32"), axis=k), name="dot")
    dx = te.compute((R, S), lambda i, j: (y[i, j].astype("float32") * (dy[i, j].astype("float32") - dot[i])).astype("float16"), name="dx")
    return te.create_prim_func([y, dy, dx])
def inputs(rng):
    s = rng.standard_normal((R, S)) * 2
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [p.astype(np.float32), rng.standard_normal((R, S)).astype(np.float32)]
def reference(y, dy):
    return [y * (dy - (dy * y).sum(-1, keepdims=True))]
def torch_impl(y, dy):
    import torch
    return [torch._softmax_backward_data(dy.float(), y.float(), -1, torch.float32).to(y.dtype)]
