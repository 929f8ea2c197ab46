"""Decode attention, one query [B,H,1,D] over a KV cache [B,H,L,D] (MHA), TE, fp16, B=8 H=32 L=1024 D=128 (Llama-2-7B)."""
import numpy as np
from tvm import te
B, H, L, D = 8, 32, 1024, 128
SMALL = dict(B=2, H=2, L=16, D=16)
def make():
    q = te.placeholder((B, H, 1, D), "float16", name="q")
    k = te.placeholder((B, H, L, D), "float16", name="k_cache")
    v = te.placeholder((B, H, L, D), "float16", name="v_cache")
    d = te.reduce_axis((0, D), name="d")
    s0 = te.compute((B, H, 1, L), lambda b, h, i, j: te.sum(q[b, h, i, d].astype("float32") * k[b, h, j, d].astype("float32"), axis=d), name="qk")
    s = te.compute((B, H, 1, L), lambda b, h, i, j: s0[b, h, i, j] * float(D ** -0.5), name="s")
    j1 = te.reduce_axis((0, L), name="j1")
    mx = te.compute((B, H, 1), lambda b, h, i: te.max(s[b, h, i, j1], axis=j1), name="mx")
    e = te.compute((B, H, 1, L), lambda b, h, i, j: te.exp(s[b, h, i, j] - mx[b, h, i]), name="e")
    j2 = te.reduce_axis((0, L), name="j2")
    den = te.compute((B, H, 1), lambda b, h, i: te.sum(e[b, h, i, j2], axis=j2), name="den")
    p = te.compute((B, H, 1, L), lambda b, h, i, j: (e[b, h, i, j] / den[b, h, i]).astype("float16"), name="p")
    j3 = te.reduce_axis((0, L), name="j3")
    o = te.compute((B, H, 1, D), lambda b, h, i, c: te.sum(p[b, h, i, j3].astype("float32") * v[b, h, j3, c].astype("float32"), axis=j3), name="pv")
    out = te.compute((B, H, 1, D), lambda b, h, i, c: o[b, h, i, c].astype("float16"), name="out")
    return te.create_prim_func([q, k, v, out])
def inputs(rng):
    return [rng.standard_normal((B, H, 1, D)).astype(np.float32), rng.standard_normal((B, H, L, D)).astype(np.float32),
            rng.standard_normal((B, H, L, D)).astype(np.float32)]
def reference(q, k, v):
    s = q @ k.swapaxes(-1, -2) / np.sqrt(D)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [p @ v]
def torch_impl(q, k, v):
    import torch
    return [torch.nn.functional.scaled_dot_product_attention(q, k, v)]
