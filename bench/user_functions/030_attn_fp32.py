"""Attention prefill in fp32 (no casts), TE, [B,H,S,D], B=1 H=12 S=128 D=64 (BERT-base in fp32)."""
import numpy as np
from tvm import te
B, H, S, D = 1, 12, 128, 64
SMALL = dict(B=1, H=2, S=16, D=16)
def make():
    q = te.placeholder((B, H, S, D), "float32", name="q")
    k = te.placeholder((B, H, S, D), "float32", name="k")
    v = te.placeholder((B, H, S, D), "float32", name="v")
    d = te.reduce_axis((0, D), name="d")
    s0 = te.compute((B, H, S, S), lambda b, h, i, j: te.sum(q[b, h, i, d] * k[b, h, j, d], axis=d), name="qk")
    s = te.compute((B, H, S, S), lambda b, h, i, j: s0[b, h, i, j] / 8.0, name="scaled")
    j1 = te.reduce_axis((0, S), name="j1")
    mx = te.compute((B, H, S), lambda b, h, i: te.max(s[b, h, i, j1], axis=j1), name="mx")
    e = te.compute((B, H, S, S), lambda b, h, i, j: te.exp(s[b, h, i, j] - mx[b, h, i]), name="e")
    j2 = te.reduce_axis((0, S), name="j2")
    den = te.compute((B, H, S), lambda b, h, i: te.sum(e[b, h, i, j2], axis=j2), name="den")
    p = te.compute((B, H, S, S), lambda b, h, i, j: e[b, h, i, j] / den[b, h, i], name="p")
    j3 = te.reduce_axis((0, S), name="j3")
    o = te.compute((B, H, S, D), lambda b, h, i, c: te.sum(p[b, h, i, j3] * v[b, h, j3, c], axis=j3), name="pv")
    return te.create_prim_func([q, k, v, o])
def inputs(rng):
    return [rng.standard_normal((B, H, S, D)).astype(np.float32) for _ in range(3)]
def reference(q, k, v):
    s = q @ k.swapaxes(-1, -2) / 8
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [p @ v]
def torch_impl(q, k, v):
    import torch
    return [torch.nn.functional.scaled_dot_product_attention(q, k, v)]
