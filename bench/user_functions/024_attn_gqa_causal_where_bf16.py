"""GQA causal attention prefill [B,H,S,D], Hq=32 Hkv=8, causal mask as topi.where over a computed boolean, TE+TOPI, bf16, B=1 S=2048 D=128 (Llama-3-8B)."""
import numpy as np
import tvm
from tvm import te, topi
B, HQ, HKV, S, D = 1, 32, 8, 2048, 128
SMALL = dict(B=1, HQ=4, HKV=2, S=16, D=16)
def make():
    G = HQ // HKV
    q = te.placeholder((B, HQ, S, D), "bfloat16", name="q")
    k = te.placeholder((B, HKV, S, D), "bfloat16", name="k")
    v = te.placeholder((B, HKV, S, D), "bfloat16", name="v")
    d = te.reduce_axis((0, D), name="d")
    s0 = te.compute((B, HQ, S, S), lambda b, h, i, j: te.sum(q[b, h, i, d].astype("float32") * k[b, h // G, j, d].astype("float32"), axis=d), name="qk")
    s = topi.multiply(s0, float(D ** -0.5))
    cond = te.compute((S, S), lambda i, j: j <= i, name="causal")
    sm = topi.where(cond, s, topi.full_like(s, -1e30))
    p = topi.cast(topi.nn.softmax(sm, axis=-1), "bfloat16")
    j = te.reduce_axis((0, S), name="j")
    o = te.compute((B, HQ, S, D), lambda b, h, i, c: te.sum(p[b, h, i, j].astype("float32") * v[b, h // G, j, c].astype("float32"), axis=j), name="o")
    out = topi.cast(o, "bfloat16")
    return te.create_prim_func([q, k, v, out])
def inputs(rng):
    return [rng.standard_normal((B, HQ, S, D)).astype(np.float32), rng.standard_normal((B, HKV, S, D)).astype(np.float32),
            rng.standard_normal((B, HKV, S, D)).astype(np.float32)]
def reference(q, k, v):
    G = HQ // HKV
    k = np.repeat(k, G, axis=1); v = np.repeat(v, G, axis=1)
    s = q @ k.swapaxes(-1, -2) / np.sqrt(D)
    s = np.where(np.tril(np.ones((S, S), bool)), s, -1e30)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [p @ v]
def torch_impl(q, k, v):
    import torch
    return [torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)]
