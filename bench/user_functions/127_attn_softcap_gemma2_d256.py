"""Gemma-2 prefill: logit soft-capping cap*tanh(s/cap) (cap=50) after the 1/sqrt(256) scale, causal, GQA, head dim 256, [B,H,S,D], TE explicit fp32 casts, bf16, B=1 Hq=16 Hkv=8 S=2048 D=256 (Gemma-2-9B)."""
import numpy as np
from tvm import te, topi
B, HQ, HKV, S, D, CAP = 1, 16, 8, 2048, 256, 50.0
SMALL = dict(B=1, HQ=4, HKV=2, S=16, D=16)
def make():
    G = HQ // HKV
    q = te.placeholder((B, HQ, S, D), "bfloat16", name="q")
    k = te.placeholder((B, HKV, S, D), "bfloat16", name="k")
    v = te.placeholder((B, HKV, S, D), "bfloat16", name="v")
    d = te.reduce_axis((0, D), name="d")
    sc = te.compute((B, HQ, S, S), lambda b, h, i, j: te.sum(q[b, h, i, d].astype("float32") * k[b, h // G, j, d].astype("float32"), axis=d), name="scores")
    cap = te.compute((B, HQ, S, S), lambda b, h, i, j: te.tanh(sc[b, h, i, j] * float(D ** -0.5) / CAP) * CAP, name="softcap")
    ms = te.compute((B, HQ, S, S), lambda b, h, i, j: te.if_then_else(j <= i, cap[b, h, i, j], -1e30), name="masked")
    p = topi.cast(topi.nn.softmax(ms, axis=-1), "bfloat16")
    j = te.reduce_axis((0, S), name="j")
    o = te.compute((B, HQ, S, D), lambda b, h, i, c: te.sum(p[b, h, i, j].astype("float32") * v[b, h // G, j, c].astype("float32"), axis=j), name="o")
    return te.create_prim_func([q, k, v, topi.cast(o, "bfloat16")])
def inputs(rng):
    return [rng.standard_normal((B, HQ, S, D)).astype(np.float32) * 4, rng.standard_normal((B, HKV, S, D)).astype(np.float32) * 4,
            rng.standard_normal((B, HKV, S, D)).astype(np.float32)]
def reference(q, k, v):
    G = HQ // HKV; k = np.repeat(k, G, 1); v = np.repeat(v, G, 1)
    s = np.tanh(q @ k.swapaxes(-1, -2) / np.sqrt(D) / CAP) * CAP
    s = np.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [p @ v]
def torch_impl(q, k, v):
    import torch
    G = HQ // HKV; k = k.repeat_interleave(G, 1).float(); v = v.repeat_interleave(G, 1).float()
    s = torch.tanh(q.float() @ k.transpose(-1, -2) / D ** 0.5 / CAP) * CAP
    s = s.masked_fill(~torch.ones(S, S, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    return [(torch.softmax(s, -1).to(q.dtype).float() @ v).to(q.dtype)]
