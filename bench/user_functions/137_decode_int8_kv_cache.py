"""Decode over an int8-quantized KV cache with per-KV-head fp32 scales (k = k_int8 * k_scale[h]), GQA, q [B,Hq,1,D] fp16, cache [B,Hkv,L,D] int8, TE, fp16 out, B=8 Hq=32 Hkv=8 L=4096 D=128 (Llama-3-8B, KV int8)."""
import numpy as np
from tvm import te, topi
B, HQ, HKV, L, D = 8, 32, 8, 4096, 128
SMALL = dict(B=2, HQ=4, HKV=2, L=24, D=16)
def make():
    G = HQ // HKV
    q = te.placeholder((B, HQ, 1, D), "float16", name="q")
    k = te.placeholder((B, HKV, L, D), "int8", name="k_cache")
    v = te.placeholder((B, HKV, L, D), "int8", name="v_cache")
    ks = te.placeholder((HKV,), "float32", name="k_scale")
    vs = te.placeholder((HKV,), "float32", name="v_scale")
    d = te.reduce_axis((0, D), name="d")
    sc = te.compute((B, HQ, 1, L), lambda b, h, i, j: te.sum(q[b, h, i, d].astype("float32") * float(D ** -0.5) * (k[b, h // G, j, d].astype("float32") * ks[h // G]), axis=d), name="scores")
    p = topi.nn.softmax(sc, axis=-1)
    j = te.reduce_axis((0, L), name="j")
    o = te.compute((B, HQ, 1, D), lambda b, h, i, c: te.sum(p[b, h, i, j] * (v[b, h // G, j, c].astype("float32") * vs[h // G]), axis=j), name="o")
    return te.create_prim_func([q, k, v, ks, vs, topi.cast(o, "float16")])
def inputs(rng):
    return [rng.standard_normal((B, HQ, 1, D)).astype(np.float32), rng.integers(-127, 128, (B, HKV, L, D)).astype(np.int8),
            rng.integers(-127, 128, (B, HKV, L, D)).astype(np.int8), rng.uniform(0.01, 0.03, (HKV,)).astype(np.float32),
            rng.uniform(0.01, 0.03, (HKV,)).astype(np.float32)]
def reference(q, k, v, ks, vs):
    G = HQ // HKV
    k = np.repeat(k * ks[None, :, None, None], G, 1); v = np.repeat(v * vs[None, :, None, None], G, 1)
    s = q @ k.swapaxes(-1, -2) / np.sqrt(D)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [p @ v]
def torch_impl(q, k, v, ks, vs):
    import torch
    kf = (k.float() * ks[None, :, None, None]).half(); vf = (v.float() * vs[None, :, None, None]).half()
    return [torch.nn.functional.scaled_dot_product_attention(q, kf, vf, enable_gqa=True)]
