"""Attention prefill with symbolic sequence length s = te.var, [B,H,S,D], TE, fp16, B=1 H=12 D=64, s in 128..1024."""
import numpy as np
from tvm import te
B, H, D = 1, 12, 64
SMALL = dict(H=2, D=16)
SYMBOLIC = {"s": [128, 257, 1024]}
SMALL_SYM = [{"s": 5}, {"s": 17}]
def make():
    S = te.var("s")
    q = te.placeholder((B, H, S, D), "float16", name="q")
    k = te.placeholder((B, H, S, D), "float16", name="k")
    v = te.placeholder((B, H, S, D), "float16", name="v")
    d = te.reduce_axis((0, D), name="d")
    s0 = te.compute((B, H, S, S), lambda b, h, i, j: te.sum(q[b, h, i, d].astype("float32") * k[b, h, j, d].astype("float32"), axis=d), name="qk")
    j1 = te.reduce_axis((0, S), name="j1")
    mx = te.compute((B, H, S), lambda b, h, i: te.max(s0[b, h, i, j1], axis=j1), name="mx")
    e = te.compute((B, H, S, S), lambda b, h, i, j: te.exp((s0[b, h, i, j] - mx[b, h, i]) * 0.125), name="e")
    j2 = te.reduce_axis((0, S), name="j2")
    den = te.compute((B, H, S), lambda b, h, i: te.sum(e[b, h, i, j2], axis=j2), name="den")
    p = te.compute((B, H, S, S), lambda b, h, i, j: (e[b, h, i, j] / den[b, h, i]).astype("float16"), name="p")
    j3 = te.reduce_axis((0, S), name="j3")
    o = te.compute((B, H, S, D), lambda b, h, i, c: te.sum(p[b, h, i, j3].astype("float32") * v[b, h, j3, c].astype("float32"), axis=j3), name="pv")
    out = te.compute((B, H, S, D), lambda b, h, i, c: o[b, h, i, c].astype("float16"), name="out")
    return te.create_prim_func([q, k, v, out])
def inputs(rng, s):
    return [rng.standard_normal((B, H, s, D)).astype(np.float32) for _ in range(3)]
def reference(q, k, v, s):
    sc = q @ k.swapaxes(-1, -2) * 0.125
    p = np.exp(sc - sc.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [p @ v]
def torch_impl(q, k, v, s):
    import torch
    return [torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.125)]
