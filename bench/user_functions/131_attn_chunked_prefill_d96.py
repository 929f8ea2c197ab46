"""Chunked prefill: a 512-token chunk attends to 2048 cached+new keys, bottom-right causal mask j <= i + (Skv - Sq), head dim 96, [B,H,S,D], TE explicit fp32 casts, bf16, B=1 H=32 Sq=512 Skv=2048 D=96 (Phi-3-mini)."""
import numpy as np
from tvm import te, topi
B, H, SQ, SKV, D = 1, 32, 512, 2048, 96
SMALL = dict(B=1, H=2, SQ=8, SKV=20, D=16)
def make():
    q = te.placeholder((B, H, SQ, D), "bfloat16", name="q")
    k = te.placeholder((B, H, SKV, D), "bfloat16", name="k")
    v = te.placeholder((B, H, SKV, D), "bfloat16", name="v")
    d = te.reduce_axis((0, D), name="d")
    sc = te.compute((B, H, SQ, SKV), lambda b, h, i, j: te.sum(q[b, h, i, d].astype("float32") * k[b, h, j, d].astype("float32"), axis=d), name="scores")
    ms = te.compute((B, H, SQ, SKV), lambda b, h, i, j: te.if_then_else(j <= i + (SKV - SQ), sc[b, h, i, j] * float(D ** -0.5), -1e30), name="masked")
    p = topi.cast(topi.nn.softmax(ms, axis=-1), "bfloat16")
    j = te.reduce_axis((0, SKV), name="j")
    o = te.compute((B, H, SQ, D), lambda b, h, i, c: te.sum(p[b, h, i, j].astype("float32") * v[b, h, j, c].astype("float32"), axis=j), name="o")
    return te.create_prim_func([q, k, v, topi.cast(o, "bfloat16")])
def inputs(rng):
    return [rng.standard_normal((B, H, SQ, D)).astype(np.float32), rng.standard_normal((B, H, SKV, D)).astype(np.float32),
            rng.standard_normal((B, H, SKV, D)).astype(np.float32)]
def _mask():
    return np.arange(SKV)[None] <= np.arange(SQ)[:, None] + (SKV - SQ)
def reference(q, k, v):
    s = np.where(_mask(), q @ k.swapaxes(-1, -2) / np.sqrt(D), -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [p @ v]
def torch_impl(q, k, v):
    import torch
    return [torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=torch.from_numpy(_mask()).to(q.device))]
