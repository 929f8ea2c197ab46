"""Sliding-window causal GQA prefill (Mistral): mask j <= i and i - j < W via te.if_then_else, [B,H,S,D], TE explicit fp32 casts, fp16, Hq=32 Hkv=8 S=8192 W=4096 D=128 (Mistral-7B-v0.1)."""
import numpy as np
from tvm import te, topi
B, HQ, HKV, S, D, W = 1, 32, 8, 8192, 128, 4096
SMALL = dict(B=1, HQ=4, HKV=2, S=24, D=16, W=5)
def make():
    G = HQ // HKV
    q = te.placeholder((B, HQ, S, D), "float16", name="q")
    k = te.placeholder((B, HKV, S, D), "float16", name="k")
    v = te.placeholder((B, HKV, S, D), "float16", name="v")
    d = te.reduce_axis((0, D), name="d")
    sc = te.compute((B, HQ, S, S), lambda b, h, i, j: te.sum(q[b, h, i, d].astype("float32") * k[b, h // G, j, d].astype("float32"), axis=d), name="scores")
    ms = te.compute((B, HQ, S, S), lambda b, h, i, j: te.if_then_else(te.all(j <= i, i - j < W), sc[b, h, i, j] * float(D ** -0.5), -1e30), name="masked")
    p = topi.cast(topi.nn.softmax(ms, axis=-1), "float16")
    j = te.reduce_axis((0, S), name="j")
    o = te.compute((B, HQ, S, D), lambda b, h, i, c: te.sum(p[b, h, i, j].astype("float32") * v[b, h // G, j, c].astype("float32"), axis=j), name="o")
    return te.create_prim_func([q, k, v, topi.cast(o, "float16")])
def inputs(rng):
    return [rng.standard_normal((B, HQ, S, D)).astype(np.float32), rng.standard_normal((B, HKV, S, D)).astype(np.float32),
            rng.standard_normal((B, HKV, S, D)).astype(np.float32)]
def _mask():
    i = np.arange(S)[:, None]; j = np.arange(S)[None]
    return (j <= i) & (i - j < W)
def reference(q, k, v):
    G = HQ // HKV; k = np.repeat(k, G, 1); v = np.repeat(v, G, 1)
    s = np.where(_mask(), q @ k.swapaxes(-1, -2) / np.sqrt(D), -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [p @ v]
def torch_impl(q, k, v):
    import torch
    m = torch.from_numpy(_mask()).to(q.device)
    return [torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)]
