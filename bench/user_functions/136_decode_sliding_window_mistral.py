"""Sliding-window decode (Mistral): one query per head over a full cache of L=8192, only the last W=4096 positions attended (j >= L - W via te.if_then_else), GQA, q [B,Hq,1,D], TE explicit fp32 casts, fp16, B=2 Hq=32 Hkv=8 D=128."""
import numpy as np
from tvm import te, topi
B, HQ, HKV, L, W, D = 2, 32, 8, 8192, 4096, 128
SMALL = dict(B=2, HQ=4, HKV=2, L=24, W=7, D=16)
def make():
    G = HQ // HKV
    q = te.placeholder((B, HQ, 1, D), "float16", name="q")
    k = te.placeholder((B, HKV, L, D), "float16", name="k_cache")
    v = te.placeholder((B, HKV, L, D), "float16", name="v_cache")
    d = te.reduce_axis((0, D), name="d")
    sc = te.compute((B, HQ, 1, L), lambda b, h, i, j: te.sum(q[b, h, i, d].astype("float32") * k[b, h // G, j, d].astype("float32"), axis=d), name="scores")
    ms = te.compute((B, HQ, 1, L), lambda b, h, i, j: te.if_then_else(j >= L - W, sc[b, h, i, j] * float(D ** -0.5), -1e30), name="masked")
    p = topi.nn.softmax(ms, axis=-1)
    j = te.reduce_axis((0, L), name="j")
    o = te.compute((B, HQ, 1, D), lambda b, h, i, c: te.sum(p[b, h, i, j] * v[b, h // G, j, c].astype("float32"), axis=j), name="o")
    return te.create_prim_func([q, k, v, topi.cast(o, "float16")])
def inputs(rng):
    return [rng.standard_normal((B, HQ, 1, D)).astype(np.float32), rng.standard_normal((B, HKV, L, D)).astype(np.float32),
            rng.standard_normal((B, HKV, L, D)).astype(np.float32)]
def reference(q, k, v):
    G = HQ // HKV; k = np.repeat(k, G, 1)[:, :, L - W:]; v = np.repeat(v, G, 1)[:, :, L - W:]
    s = q @ k.swapaxes(-1, -2) / np.sqrt(D)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [p @ v]
def torch_impl(q, k, v):
    import torch
    return [torch.nn.functional.scaled_dot_product_attention(q, k[:, :, L - W:], v[:, :, L - W:], enable_gqa=True)]
