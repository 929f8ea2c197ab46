"""Attention with an additive mask tensor [B,1,S,S] (HF padding/causal mask), head dim 80, TE, fp16, B=2 H=32 S=256 D=80 (Phi-2)."""
import numpy as np
from tvm import te
B, H, S, D = 2, 32, 256, 80
SMALL = dict(B=2, H=2, S=16, D=16)
def make():
    q = te.placeholder((B, H, S, D), "float16", name="q")
    k = te.placeholder((B, H, S, D), "float16", name="k")
    v = te.placeholder((B, H, S, D), "float16", name="v")
    mask = te.placeholder((B, 1, S, S), "float16", name="mask")
    d = te.reduce_axis((0, D), name="d")
    s0 = te.compute((B, H, S, S), lambda b, h, i, j: te.sum(q[b, h, i, d].astype("float32") * k[b, h, j, d].astype("float32"), axis=d), name="qk")
    s = te.compute((B, H, S, S), lambda b, h, i, j: s0[b, h, i, j] / float(np.sqrt(D)) + mask[b, 0, i, j].astype("float32"), name="s")
    j1 = te.reduce_axis((0, S), name="j1")
    mx = te.compute((B, H, S), lambda b, h, i: te.max(s[b, h, i, j1], axis=j1), name="mx")
    e = te.compute((B, H, S, S), lambda b, h, i, j: te.exp(s[b, h, i, j] - mx[b, h, i]), name="e")
    j2 = te.reduce_axis((0, S), name="j2")
    den = te.compute((B, H, S), lambda b, h, i: te.sum(e[b, h, i, j2], axis=j2), name="den")
    p = te.compute((B, H, S, S), lambda b, h, i, j: (e[b, h, i, j] / den[b, h, i]).astype("float16"), name="p")
    j3 = te.reduce_axis((0, S), name="j3")
    o0 = te.compute((B, H, S, D), lambda b, h, i, c: te.sum(p[b, h, i, j3].astype("float32") * v[b, h, j3, c].astype("float32"), axis=j3), name="pv")
    o = te.compute((B, H, S, D), lambda b, h, i, c: o0[b, h, i, c].astype("float16"), name="o")
    return te.create_prim_func([q, k, v, mask, o])
def inputs(rng):
    m = np.zeros((B, 1, S, S), np.float32)
    m[:, :, :, :] = np.where(np.tril(np.ones((S, S), bool)), 0, -65504.0)
    m[1, :, :, S - S // 4:] = -65504.0  # padded tail of the second sequence
    m[1, :, S - S // 4:, :] = 0.0       # padded queries see everything
    return [rng.standard_normal((B, H, S, D)).astype(np.float32) for _ in range(3)] + [m]
def reference(q, k, v, mask):
    s = q @ k.swapaxes(-1, -2) / np.sqrt(D) + mask
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [p @ v]
def torch_impl(q, k, v, mask):
    import torch
    return [torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)]
