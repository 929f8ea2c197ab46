"""MQA decode (Hkv=1), int64 shapes/indices as Relax legalization emits, q [B,Hq,1,D], KV [B,1,L,D], TE, fp16, B=16 Hq=16 L=2048 D=64 (GPT-BigCode/Falcon-like)."""
import numpy as np
import tvm
from tvm import te
B, HQ, L, D = 16, 16, 2048, 64
SMALL = dict(B=2, HQ=2, L=16, D=16)
def make():
    i64 = lambda n: tvm.tirx.IntImm("int64", n)
    q = te.placeholder((i64(B), i64(HQ), i64(1), i64(D)), "float16", name="q")
    k = te.placeholder((i64(B), i64(1), i64(L), i64(D)), "float16", name="k_cache")
    v = te.placeholder((i64(B), i64(1), i64(L), i64(D)), "float16", name="v_cache")
    z = i64(0)
    d = te.reduce_axis((i64(0), i64(D)), name="d")
    s0 = te.compute((i64(B), i64(HQ), i64(1), i64(L)), lambda b, h, i, j: te.sum(q[b, h, i, d].astype("float32") * k[b, z, j, d].astype("float32"), axis=d), name="qk")
    s = te.compute(s0.shape, lambda b, h, i, j: s0[b, h, i, j] * 0.125, name="s")
    j1 = te.reduce_axis((i64(0), i64(L)), name="j1")
    mx = te.compute((i64(B), i64(HQ), i64(1)), lambda b, h, i: te.max(s[b, h, i, j1], axis=j1), name="mx")
    e = te.compute(s0.shape, lambda b, h, i, j: te.exp(s[b, h, i, j] - mx[b, h, i]), name="e")
    j2 = te.reduce_axis((i64(0), i64(L)), name="j2")
    den = te.compute((i64(B), i64(HQ), i64(1)), lambda b, h, i: te.sum(e[b, h, i, j2], axis=j2), name="den")
    p = te.compute(s0.shape, lambda b, h, i, j: (e[b, h, i, j] / den[b, h, i]).astype("float16"), name="p")
    j3 = te.reduce_axis((i64(0), i64(L)), name="j3")
    o = te.compute(q.shape, lambda b, h, i, c: te.sum(p[b, h, i, j3].astype("float32") * v[b, z, j3, c].astype("float32"), axis=j3), name="pv")
    out = te.compute(q.shape, lambda b, h, i, c: o[b, h, i, c].astype("float16"), name="out")
    return te.create_prim_func([q, k, v, out])
def inputs(rng):
    return [rng.standard_normal((B, HQ, 1, D)).astype(np.float32), rng.standard_normal((B, 1, L, D)).astype(np.float32),
            rng.standard_normal((B, 1, L, D)).astype(np.float32)]
def reference(q, k, v):
    s = q @ k.swapaxes(-1, -2) * 0.125
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [p @ v]
def torch_impl(q, k, v):
    import torch
    return [torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.125)]
