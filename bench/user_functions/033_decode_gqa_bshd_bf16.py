"""GQA decode attention, q [B,1,Hq,D], KV cache in HF layout [B,L,Hkv,D], Hq=28 Hkv=4 (group 7), TE, bf16, B=4 L=4096 D=128 (Qwen2-7B)."""
import numpy as np
from tvm import te
B, HQ, HKV, L, D = 4, 28, 4, 4096, 128
SMALL = dict(B=1, HQ=4, HKV=2, L=16, D=16)
def make():
    G = HQ // HKV
    q = te.placeholder((B, 1, HQ, D), "bfloat16", name="q")
    k = te.placeholder((B, L, HKV, D), "bfloat16", name="k_cache")
    v = te.placeholder((B, L, HKV, D), "bfloat16", name="v_cache")
    d = te.reduce_axis((0, D), name="d")
    s0 = te.compute((B, HQ, L), lambda b, h, j: te.sum(q[b, 0, h, d].astype("float32") * k[b, j, h // G, d].astype("float32"), axis=d), name="qk")
    j1 = te.reduce_axis((0, L), name="j1")
    mx = te.compute((B, HQ), lambda b, h: te.max(s0[b, h, j1], axis=j1), name="mx")
    e = te.compute((B, HQ, L), lambda b, h, j: te.exp((s0[b, h, j] - mx[b, h]) * float(D ** -0.5)), name="e")
    j2 = te.reduce_axis((0, L), name="j2")
    den = te.compute((B, HQ), lambda b, h: te.sum(e[b, h, j2], axis=j2), name="den")
    j3 = te.reduce_axis((0, L), name="j3")
    o = te.compute((B, 1, HQ, D), lambda b, i, h, c: te.sum(e[b, h, j3] * v[b, j3, h // G, c].astype("float32"), axis=j3), name="pv")
    out = te.compute((B, 1, HQ, D), lambda b, i, h, c: (o[b, i, h, c] / den[b, h]).astype("bfloat16"), name="out")
    return te.create_prim_func([q, k, v, out])
def inputs(rng):
    return [rng.standard_normal((B, 1, HQ, D)).astype(np.float32), rng.standard_normal((B, L, HKV, D)).astype(np.float32),
            rng.standard_normal((B, L, HKV, D)).astype(np.float32)]
def reference(q, k, v):
    G = HQ // HKV
    qt = q.transpose(0, 2, 1, 3)                       # B,HQ,1,D
    kt = np.repeat(k.transpose(0, 2, 1, 3), G, 1)      # B,HQ,L,D
    vt = np.repeat(v.transpose(0, 2, 1, 3), G, 1)
    s = qt @ kt.swapaxes(-1, -2) / np.sqrt(D)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [(p @ vt).transpose(0, 2, 1, 3)]
def torch_impl(q, k, v):
    import torch
    o = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True)
    return [o.transpose(1, 2)]
