"""MLA prefill (not absorbed): causal attention whose q/k head dim 192 (128 nope + 64 rope) differs from the v head dim 128, [B,H,S,D], scale 1/sqrt(192), mask via te.if_then_else, TE explicit fp32 casts, bf16, B=1 H=16 S=4096 (DeepSeek-V2-Lite)."""
import numpy as np
from tvm import te, topi
B, H, S, DQK, DV = 1, 16, 4096, 192, 128
SMALL = dict(B=1, H=2, S=13, DQK=24, DV=16)
def make():
    q = te.placeholder((B, H, S, DQK), "bfloat16", name="q")
    k = te.placeholder((B, H, S, DQK), "bfloat16", name="k")
    v = te.placeholder((B, H, S, DV), "bfloat16", name="v")
    d = te.reduce_axis((0, DQK), name="d")
    sc = te.compute((B, H, S, S), lambda b, h, i, j: te.sum(q[b, h, i, d].astype("float32") * k[b, h, j, d].astype("float32"), axis=d), name="scores")
    ms = te.compute((B, H, S, S), lambda b, h, i, j: te.if_then_else(j <= i, sc[b, h, i, j] * float(DQK ** -0.5), -1e30), name="masked")
    p = topi.cast(topi.nn.softmax(ms, axis=-1), "bfloat16")
    j = te.reduce_axis((0, S), name="j")
    o = te.compute((B, H, S, DV), lambda b, h, i, c: te.sum(p[b, h, i, j].astype("float32") * v[b, h, j, c].astype("float32"), axis=j), name="o")
    return te.create_prim_func([q, k, v, topi.cast(o, "bfloat16")])
def inputs(rng):
    return [rng.standard_normal((B, H, S, DQK)).astype(np.float32), rng.standard_normal((B, H, S, DQK)).astype(np.float32),
            rng.standard_normal((B, H, S, DV)).astype(np.float32)]
def reference(q, k, v):
    s = q @ k.swapaxes(-1, -2) / np.sqrt(DQK)
    s = np.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [p @ v]
def torch_impl(q, k, v):
    import torch
    return [torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)]
