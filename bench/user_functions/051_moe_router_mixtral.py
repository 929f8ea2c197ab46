"""MoE router: topi.nn.softmax over 8 experts then topi.topk k=2 (values + int32 indices), fp32, tokens 1021 (prime) x 8 experts (Mixtral-8x7B)."""
import numpy as np
from tvm import te, topi
T_, E, K = 1021, 8, 2
SMALL = dict(T_=5)
def make():
    x = te.placeholder((T_, E), "float32", name="router_logits")
    p = topi.nn.softmax(x, axis=-1)
    vals, idx = topi.topk(p, k=K, axis=-1, ret_type="both", dtype="int32")
    return te.create_prim_func([x, vals, idx])
def inputs(rng):
    return [rng.standard_normal((T_, E)).astype(np.float32)]
def reference(x):
    p = np.exp(x - x.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    idx = np.argsort(-p, axis=-1, kind="stable")[:, :K]
    return [np.take_along_axis(p, idx, -1), idx.astype(np.float64)]
def torch_impl(x):
    import torch
    v, i = torch.topk(torch.softmax(x, -1), K, -1)
    return [v, i.int()]
