"""MoE combine: y[t,h] = sum over the token's 2 routed slots of weight[t,k] * expert_out[slot[t,k], h] (expert outputs in expert-sorted order, int32 slot map, fp32 router weights, reduce axis of 2), TE, fp16, T=2048 H=4096 (Mixtral-8x7B)."""
import numpy as np
from tvm import te
T_, TOPK, H = 2048, 2, 4096
SMALL = dict(T_=5, H=16)
def make():
    eo = te.placeholder((T_ * TOPK, H), "float16", name="expert_out")
    slot = te.placeholder((T_, TOPK), "int32", name="slot")
    wt = te.placeholder((T_, TOPK), "float32", name="routing_weights")
    k = te.reduce_axis((0, TOPK), name="k")
    acc = te.compute((T_, H), lambda t, h: te.sum(wt[t, k] * eo[slot[t, k], h].astype("float32"), axis=k), name="acc")
    return te.create_prim_func([eo, slot, wt, te.compute((T_, H), lambda t, h: acc[t, h].astype("float16"), name="y")])
def inputs(rng):
    w = rng.uniform(0.1, 1, (T_, TOPK)); w /= w.sum(-1, keepdims=True)
    return [rng.standard_normal((T_ * TOPK, H)).astype(np.float32), rng.permutation(T_ * TOPK).reshape(T_, TOPK).astype(np.int32),
            w.astype(np.float32)]
def reference(eo, slot, wt):
    return [(eo[slot.astype(np.int64)] * wt[..., None]).sum(1)]
def torch_impl(eo, slot, wt):
    import torch
    return [(eo[slot.long()].float() * wt[..., None]).sum(1).to(eo.dtype)]
