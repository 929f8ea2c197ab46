"""Decode attention with a symbolic KV length kv_len = te.var, q [B,H,D], KV [B,H,L,D], TE, fp16, B=1 H=32 D=128, kv_len in 1..4096."""
import numpy as np
from tvm import te
B, H, D = 1, 32, 128
SMALL = dict(H=2, D=16)
SYMBOLIC = {"kv_len": [1, 100, 1021, 4096]}
SMALL_SYM = [{"kv_len": 1}, {"kv_len": 13}]
def make():
    L = te.var("kv_len")
    q = te.placeholder((B, H, D), "float16", name="q")
    k = te.placeholder((B, H, L, D), "float16", name="k_cache")
    v = te.placeholder((B, H, L, D), "float16", name="v_cache")
    d = te.reduce_axis((0, D), name="d")
    s0 = te.compute((B, H, L), lambda b, h, j: te.sum(q[b, h, d].astype("float32") * k[b, h, j, d].astype("float32"), axis=d), name="qk")
    s = te.compute((B, H, L), lambda b, h, j: s0[b, h, j] * float(D ** -0.5), name="s")
    j1 = te.reduce_axis((0, L), name="j1")
    mx = te.compute((B, H), lambda b, h: te.max(s[b, h, j1], axis=j1), name="mx")
    e = te.compute((B, H, L), lambda b, h, j: te.exp(s[b, h, j] - mx[b, h]), name="e")
    j2 = te.reduce_axis((0, L), name="j2")
    den = te.compute((B, H), lambda b, h: te.sum(e[b, h, j2], axis=j2), name="den")
    j3 = te.reduce_axis((0, L), name="j3")
    o = te.compute((B, H, D), lambda b, h, c: te.sum(e[b, h, j3] * v[b, h, j3, c].astype("float32"), axis=j3), name="pv")
    out = te.compute((B, H, D), lambda b, h, c: (o[b, h, c] / den[b, h]).astype("float16"), name="out")
    return te.create_prim_func([q, k, v, out])
def inputs(rng, kv_len):
    return [rng.standard_normal((B, H, D)).astype(np.float32), rng.standard_normal((B, H, kv_len, D)).astype(np.float32),
            rng.standard_normal((B, H, kv_len, D)).astype(np.float32)]
def reference(q, k, v, kv_len):
    s = np.einsum("bhd,bhjd->bhj", q, k) / np.sqrt(D)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [np.einsum("bhj,bhjd->bhd", p, v)]
def torch_impl(q, k, v, kv_len):
    import torch
    return [torch.nn.functional.scaled_dot_product_attention(q[:, :, None], k, v)[:, :, 0]]
