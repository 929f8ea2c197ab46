"""Gemma-2 decode: one query per head q [B,Hq,1,D] over cache [B,Hkv,L,D], soft-capped logits 50*tanh(s/50), GQA, head dim 256, TE explicit fp32 casts, bf16, B=4 Hq=16 Hkv=8 L=4096 D=256 (Gemma-2-9B)."""
import numpy as np
from tvm import te, topi
B, HQ, HKV, L, D, CAP = 4, 16, 8, 4096, 256, 50.0
SMALL = dict(B=2, HQ=4, HKV=2, L=24, D=16)
def make():
    G = HQ // HKV
    q = te.placeholder((B, HQ, 1, D), "bfloat16", name="q")
    k = te.placeholder((B, HKV, L, D), "bfloat16", name="k_cache")
    v = te.placeholder((B, HKV, L, D), "bfloat16", name="v_cache")
    d = te.reduce_axis((0, D), name="d")
    sc = te.compute((B, HQ, 1, L), lambda b, h, i, j: te.sum(q[b, h, i, d].astype("float32") * k[b, h // G, j, d].astype("float32"), axis=d), name="scores")
    cap = te.compute((B, HQ, 1, L), lambda b, h, i, j: te.tanh(sc[b, h, i, j] * float(D ** -0.5) / CAP) * CAP, name="softcap")
    p = topi.nn.softmax(cap, axis=-1)
    j = te.reduce_axis((0, L), name="j")
    o = te.compute((B, HQ, 1, D), lambda b, h, i, c: te.sum(p[b, h, i, j] * v[b, h // G, j, c].astype("float32"), axis=j), name="o")
    return te.create_prim_func([q, k, v, topi.cast(o, "bfloat16")])
def inputs(rng):
    return [rng.standard_normal((B, HQ, 1, D)).astype(np.float32) * 4, rng.standard_normal((B, HKV, L, D)).astype(np.float32) * 4,
            rng.standard_normal((B, HKV, L, D)).astype(np.float32)]
def reference(q, k, v):
    G = HQ // HKV; k = np.repeat(k, G, 1); v = np.repeat(v, G, 1)
    s = np.tanh(q @ k.swapaxes(-1, -2) / np.sqrt(D) / CAP) * CAP
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [p @ v]
def torch_impl(q, k, v):
    import torch
    G = HQ // HKV; k = k.repeat_interleave(G, 1).float(); v = v.repeat_interleave(G, 1).float()
    s = torch.tanh(q.float() @ k.transpose(-1, -2) / D ** 0.5 / CAP) * CAP
    return [(torch.softmax(s, -1) @ v).to(q.dtype)]
