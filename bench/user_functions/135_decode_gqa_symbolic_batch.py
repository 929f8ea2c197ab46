"""GQA decode with a symbolic batch (continuous batching) B = te.var('batch'), q [B,Hq,1,D], cache [B,Hkv,L,D], TE explicit fp32 casts, fp16, Hq=32 Hkv=8 L=2048 D=128 (Llama-3-8B), batch typically 1..64."""
import numpy as np
from tvm import te, topi
BATCH, HQ, HKV, L, D = 16, 32, 8, 2048, 128
SMALL = dict(BATCH=3, HQ=4, HKV=2, L=24, D=16)
def make():
    G = HQ // HKV
    B = te.var("batch")
    q = te.placeholder((B, HQ, 1, D), "float16", name="q")
    k = te.placeholder((B, HKV, L, D), "float16", name="k_cache")
    v = te.placeholder((B, HKV, L, D), "float16", name="v_cache")
    d = te.reduce_axis((0, D), name="d")
    sc = te.compute((B, HQ, 1, L), lambda b, h, i, j: te.sum(q[b, h, i, d].astype("float32") * float(D ** -0.5) * k[b, h // G, j, d].astype("float32"), axis=d), name="scores")
    p = topi.nn.softmax(sc, axis=-1)
    j = te.reduce_axis((0, L), name="j")
    o = te.compute((B, HQ, 1, D), lambda b, h, i, c: te.sum(p[b, h, i, j] * v[b, h // G, j, c].astype("float32"), axis=j), name="o")
    return te.create_prim_func([q, k, v, topi.cast(o, "float16")])
def inputs(rng):
    return [rng.standard_normal((BATCH, HQ, 1, D)).astype(np.float32), rng.standard_normal((BATCH, HKV, L, D)).astype(np.float32),
            rng.standard_normal((BATCH, HKV, L, D)).astype(np.float32)]
def reference(q, k, v):
    G = HQ // HKV; k = np.repeat(k, G, 1); v = np.repeat(v, G, 1)
    s = q @ k.swapaxes(-1, -2) / np.sqrt(D)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [p @ v]
def torch_impl(q, k, v):
    import torch
    return [torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)]
