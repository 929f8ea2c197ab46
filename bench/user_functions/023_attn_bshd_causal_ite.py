"""Causal attention prefill in [B,S,H,D] (HF layout, no transposes), mask via te.if_then_else, TE, fp16, B=1 S=1024 H=32 D=128 (Llama-7B)."""
import numpy as np
import tvm
from tvm import te
B, S, H, D = 1, 1024, 32, 128
SMALL = dict(B=1, S=16, H=2, D=16)
def make():
    q = te.placeholder((B, S, H, D), "float16", name="q")
    k = te.placeholder((B, S, H, D), "float16", name="k")
    v = te.placeholder((B, S, H, D), "float16", name="v")
    scale = float(1.0 / np.sqrt(D))
    d = te.reduce_axis((0, D), name="d")
    raw = te.compute((B, H, S, S), lambda b, h, i, j: te.sum(q[b, i, h, d].astype("float32") * k[b, j, h, d].astype("float32"), axis=d), name="raw")
    neg = tvm.tirx.min_value("float32")
    s = te.compute((B, H, S, S), lambda b, h, i, j: te.if_then_else(j <= i, raw[b, h, i, j] * scale, neg), name="masked")
    j1 = te.reduce_axis((0, S), name="j1")
    mx = te.compute((B, H, S), lambda b, h, i: te.max(s[b, h, i, j1], axis=j1), name="mx")
    e = te.compute((B, H, S, S), lambda b, h, i, j: te.exp(s[b, h, i, j] - mx[b, h, i]), name="e")
    j2 = te.reduce_axis((0, S), name="j2")
    den = te.compute((B, H, S), lambda b, h, i: te.sum(e[b, h, i, j2], axis=j2), name="den")
    j3 = te.reduce_axis((0, S), name="j3")
    o = te.compute((B, S, H, D), lambda b, i, h, c: te.sum(e[b, h, i, j3] * v[b, j3, h, c].astype("float32"), axis=j3), name="pv")
    out = te.compute((B, S, H, D), lambda b, i, h, c: (o[b, i, h, c] / den[b, h, i]).astype("float16"), name="out")
    return te.create_prim_func([q, k, v, out])
def inputs(rng):
    return [rng.standard_normal((B, S, H, D)).astype(np.float32) for _ in range(3)]
def reference(q, k, v):
    qt, kt, vt = (a.transpose(0, 2, 1, 3) for a in (q, k, v))
    s = qt @ kt.swapaxes(-1, -2) / np.sqrt(D)
    s = np.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [(p @ vt).transpose(0, 2, 1, 3)]
def torch_impl(q, k, v):
    import torch
    o = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return [o.transpose(1, 2)]
