"""Bidirectional attention with key padding from per-sequence valid lengths (int32 [B], j < len[b] else -inf), [B,H,S,D], TE explicit fp32 casts, fp16, B=8 H=16 S=512 D=64 (BERT-large, padded batch)."""
import numpy as np
from tvm import te, topi
B, H, S, D = 8, 16, 512, 64
SMALL = dict(B=2, H=2, S=16, D=16)
def make():
    q = te.placeholder((B, H, S, D), "float16", name="q")
    k = te.placeholder((B, H, S, D), "float16", name="k")
    v = te.placeholder((B, H, S, D), "float16", name="v")
    ln = te.placeholder((B,), "int32", name="valid_len")
    d = te.reduce_axis((0, D), name="d")
    sc = te.compute((B, H, S, S), lambda b, h, i, j: te.sum(q[b, h, i, d].astype("float32") * k[b, h, j, d].astype("float32"), axis=d), name="scores")
    ms = te.compute((B, H, S, S), lambda b, h, i, j: te.if_then_else(j < ln[b], sc[b, h, i, j] * float(D ** -0.5), -1e30), name="masked")
    p = topi.cast(topi.nn.softmax(ms, axis=-1), "float16")
    j = te.reduce_axis((0, S), name="j")
    o = te.compute((B, H, S, D), lambda b, h, i, c: te.sum(p[b, h, i, j].astype("float32") * v[b, h, j, c].astype("float32"), axis=j), name="o")
    return te.create_prim_func([q, k, v, ln, topi.cast(o, "float16")])
def inputs(rng):
    return [rng.standard_normal((B, H, S, D)).astype(np.float32) for _ in range(3)] + [rng.integers(1, S + 1, (B,)).astype(np.int32)]
def reference(q, k, v, ln):
    m = np.arange(S)[None, None, None, :] < ln[:, None, None, None]
    s = np.where(m, q @ k.swapaxes(-1, -2) / np.sqrt(D), -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [p @ v]
def torch_impl(q, k, v, ln):
    import torch
    m = torch.arange(S, device=q.device)[None, None, None, :] < ln[:, None, None, None]
    return [torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)]
