"""MQA causal prefill with 71 query heads and one KV head (Falcon-7B): k/v [B,1,S,D] indexed k[b,0,j,d], [B,H,S,D], TE explicit fp32 casts, fp16, B=1 Hq=71 S=2048 D=64."""
import numpy as np
from tvm import te, topi
B, HQ, S, D = 1, 71, 2048, 64
SMALL = dict(B=1, HQ=3, S=16, D=16)
def make():
    q = te.placeholder((B, HQ, S, D), "float16", name="q")
    k = te.placeholder((B, 1, S, D), "float16", name="k")
    v = te.placeholder((B, 1, S, D), "float16", name="v")
    d = te.reduce_axis((0, D), name="d")
    sc = te.compute((B, HQ, S, S), lambda b, h, i, j: te.sum(q[b, h, i, d].astype("float32") * k[b, 0, j, d].astype("float32"), axis=d), name="scores")
    ms = te.compute((B, HQ, S, S), lambda b, h, i, j: te.if_then_else(j <= i, sc[b, h, i, j] * float(D ** -0.5), -1e30), name="masked")
    p = topi.cast(topi.nn.softmax(ms, axis=-1), "float16")
    j = te.reduce_axis((0, S), name="j")
    o = te.compute((B, HQ, S, D), lambda b, h, i, c: te.sum(p[b, h, i, j].astype("float32") * v[b, 0, j, c].astype("float32"), axis=j), name="o")
    return te.create_prim_func([q, k, v, topi.cast(o, "float16")])
def inputs(rng):
    return [rng.standard_normal((B, HQ, S, D)).astype(np.float32), rng.standard_normal((B, 1, S, D)).astype(np.float32),
            rng.standard_normal((B, 1, S, D)).astype(np.float32)]
def reference(q, k, v):
    s = np.where(np.tril(np.ones((S, S), bool)), q @ k.swapaxes(-1, -2) / np.sqrt(D), -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [p @ v]
def torch_impl(q, k, v):
    import torch
    return [torch.nn.functional.scaled_dot_product_attention(q, k.expand(-1, HQ, -1, -1), v.expand(-1, HQ, -1, -1), is_causal=True)]
