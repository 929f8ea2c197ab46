"""MoE router: fp16 logits -> fp32 softmax -> topi.topk k=6 -> renormalize the k weights (sum to 1), int64 indices, TE+TOPI, tokens 4096 x 64 experts (DeepSeek-MoE-16B)."""
import numpy as np
from tvm import te, topi
T_, E, K = 4096, 64, 6
SMALL = dict(T_=5)
def make():
    x = te.placeholder((T_, E), "float16", name="router_logits")
    p = topi.nn.softmax(topi.cast(x, "float32"), axis=-1)
    vals, idx = topi.topk(p, k=K, axis=-1, ret_type="both", dtype="int64")
    kk = te.reduce_axis((0, K), name="kk")
    tot = te.compute((T_,), lambda t: te.sum(vals[t, kk], axis=kk), name="tot")
    w = te.compute((T_, K), lambda t, j: vals[t, j] / tot[t], name="weights")
    return te.create_prim_func([x, w, idx])
def inputs(rng):
    return [(rng.standard_normal((T_, E)) * 2).astype(np.float32)]
def reference(x):
    p = np.exp(x - x.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    idx = np.argsort(-p, axis=-1, kind="stable")[:, :K]
    v = np.take_along_axis(p, idx, -1)
    return [v / v.sum(-1, keepdims=True), idx.astype(np.float64)]
def torch_impl(x):
    import torch
    v, i = torch.topk(torch.softmax(x.float(), -1), K, -1)
    return [v / v.sum(-1, keepdim=True), i]
