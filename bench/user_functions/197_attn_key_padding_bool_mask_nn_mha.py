"""Bidirectional attention with a [B,S] bool key_padding_mask (nn.MultiheadAttention semantics: True = padded key, right padding on even rows and left padding on odd ones, its score set to float('-inf') by te.if_then_else), [B,H,S,D], TE explicit fp32 casts, 1/sqrt(D) scale, fp16, B=16 H=16 S=512 D=64 (RoBERTa-large / nn.TransformerEncoder padded batch)."""
import numpy as np
from tvm import te, topi
B, H, S, D = 16, 16, 512, 64
SMALL = dict(B=3, H=2, S=13, D=16)
def make():
    q = te.placeholder((B, H, S, D), "float16", name="q")
    k = te.placeholder((B, H, S, D), "float16", name="k")
    v = te.placeholder((B, H, S, D), "float16", name="v")
    kpm = te.placeholder((B, S), "bool", name="key_padding_mask")
    d = te.reduce_axis((0, D), name="d")
    sc = te.compute((B, H, S, S), lambda b, h, i, j: te.sum(q[b, h, i, d].astype("float32") * k[b, h, j, d].astype("float32"), axis=d), name="scores")
    ms = te.compute((B, H, S, S), lambda b, h, i, j: te.if_then_else(kpm[b, j], float("-inf"), sc[b, h, i, j] * float(D ** -0.5)), name="masked")
    p = topi.cast(topi.nn.softmax(ms, axis=-1), "float16")
    j = te.reduce_axis((0, S), name="j")
    o = te.compute((B, H, S, D), lambda b, h, i, c: te.sum(p[b, h, i, j].astype("float32") * v[b, h, j, c].astype("float32"), axis=j), name="o")
    return te.create_prim_func([q, k, v, kpm, topi.cast(o, "float16")])
def inputs(rng):
    lens = rng.integers(1, S + 1, (B,)); lens[0] = S
    pos = np.arange(S)[None, :]
    kpm = np.where((np.arange(B) % 2 == 0)[:, None], pos >= lens[:, None], pos < S - lens[:, None])  # odd rows left-padded
    return [rng.standard_normal((B, H, S, D)).astype(np.float32), rng.standard_normal((B, H, S, D)).astype(np.float32),
            rng.standard_normal((B, H, S, D)).astype(np.float32), kpm]
def reference(q, k, v, kpm):
    s = q @ k.swapaxes(-1, -2) / np.sqrt(D)
    s = np.where(kpm.astype(bool)[:, None, None, :], -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [p @ v]
def torch_impl(q, k, v, kpm):
    import torch
    return [torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=~kpm[:, None, None, :])]
