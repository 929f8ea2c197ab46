"""ALiBi causal attention (MPT/BLOOM): score*scale + slope[h] * (j - i), causal via te.if_then_else, slopes an fp32 [H] input, [B,H,S,D], TE explicit fp32 casts, fp16, B=1 H=32 S=2048 D=128 (MPT-7B)."""
import numpy as np
from tvm import te, topi
B, H, S, D = 1, 32, 2048, 128
SMALL = dict(B=1, H=2, S=16, D=16)
def make():
    q = te.placeholder((B, H, S, D), "float16", name="q")
    k = te.placeholder((B, H, S, D), "float16", name="k")
    v = te.placeholder((B, H, S, D), "float16", name="v")
    sl = te.placeholder((H,), "float32", name="alibi_slopes")
    d = te.reduce_axis((0, D), name="d")
    sc = te.compute((B, H, S, S), lambda b, h, i, j: te.sum(q[b, h, i, d].astype("float32") * k[b, h, j, d].astype("float32"), axis=d), name="scores")
    bi = te.compute((B, H, S, S), lambda b, h, i, j: te.if_then_else(j <= i, sc[b, h, i, j] * float(D ** -0.5) + sl[h] * (j - i).astype("float32"), -1e30), name="biased")
    p = topi.cast(topi.nn.softmax(bi, axis=-1), "float16")
    j = te.reduce_axis((0, S), name="j")
    o = te.compute((B, H, S, D), lambda b, h, i, c: te.sum(p[b, h, i, j].astype("float32") * v[b, h, j, c].astype("float32"), axis=j), name="o")
    return te.create_prim_func([q, k, v, sl, topi.cast(o, "float16")])
def inputs(rng):
    slopes = 2.0 ** (-8.0 * np.arange(1, H + 1) / H)
    return [rng.standard_normal((B, H, S, D)).astype(np.float32) for _ in range(3)] + [slopes.astype(np.float32)]
def _bias(sl):
    i = np.arange(S)[:, None]; j = np.arange(S)[None]
    return np.where(j <= i, sl[:, None, None] * (j - i), -np.inf)
def reference(q, k, v, sl):
    s = q @ k.swapaxes(-1, -2) / np.sqrt(D) + _bias(sl)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [p @ v]
def torch_impl(q, k, v, sl):
    import torch
    i = torch.arange(S, device=q.device)[:, None]; j = torch.arange(S, device=q.device)[None]
    bias = torch.where(j <= i, sl[:, None, None] * (j - i), float("-inf")).to(q.dtype)
    return [torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)]
