"""Causal attention prefill, prime length S=1021, q pre-scaled in its own stage, causal via tvm.tirx.Select, TE, fp16, B=1 H=8 D=128 [B,H,S,D]."""
import numpy as np
import tvm
from tvm import te
B, H, S, D = 1, 8, 1021, 128
SMALL = dict(B=1, H=2, S=13, D=16)
def make():
    q = te.placeholder((B, H, S, D), "float16", name="q")
    k = te.placeholder((B, H, S, D), "float16", name="k")
    v = te.placeholder((B, H, S, D), "float16", name="v")
    qs = te.compute((B, H, S, D), lambda b, h, i, c: (q[b, h, i, c].astype("float32") * float(D ** -0.5)).astype("float16"), name="qs")
    d = te.reduce_axis((0, D), name="d")
    s0 = te.compute((B, H, S, S), lambda b, h, i, j: te.sum(qs[b, h, i, d].astype("float32") * k[b, h, j, d].astype("float32"), axis=d), name="qk")
    s = te.compute((B, H, S, S), lambda b, h, i, j: tvm.tirx.Select(j > i, tvm.tirx.const(-float("inf"), "float32"), s0[b, h, i, j]), name="causal")
    j1 = te.reduce_axis((0, S), name="j1")
    mx = te.compute((B, H, S), lambda b, h, i: te.max(s[b, h, i, j1], axis=j1), name="mx")
    e = te.compute((B, H, S, S), lambda b, h, i, j: te.exp(s[b, h, i, j] - mx[b, h, i]), name="e")
    j2 = te.reduce_axis((0, S), name="j2")
    den = te.compute((B, H, S), lambda b, h, i: te.sum(e[b, h, i, j2], axis=j2), name="den")
    p = te.compute((B, H, S, S), lambda b, h, i, j: (e[b, h, i, j] / den[b, h, i]).astype("float16"), name="p")
    j3 = te.reduce_axis((0, S), name="j3")
    o = te.compute((B, H, S, D), lambda b, h, i, c: te.sum(p[b, h, i, j3].astype("float32") * v[b, h, j3, c].astype("float32"), axis=j3), name="pv")
    out = te.compute((B, H, S, D), lambda b, h, i, c: o[b, h, i, c].astype("float16"), name="out")
    return te.create_prim_func([q, k, v, out])
def inputs(rng):
    return [rng.standard_normal((B, H, S, D)).astype(np.float32) for _ in range(3)]
def reference(q, k, v):
    qs = (q / np.sqrt(D)).astype(np.float16).astype(np.float64)
    s = qs @ k.swapaxes(-1, -2)
    s = np.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [p @ v]
def torch_impl(q, k, v):
    import torch
    return [torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)]
