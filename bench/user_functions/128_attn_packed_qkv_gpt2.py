"""GPT-2 attention straight off c_attn's packed output qkv [B,S,3*H*D] (heads sliced by index arithmetic, no transposes), causal, output merged heads [B,S,H*D], TE explicit fp32 casts, fp16, B=4 S=1024 H=12 D=64 (GPT-2 small)."""
import numpy as np
from tvm import te, topi
B, S, H, D = 4, 1024, 12, 64
SMALL = dict(B=1, S=16, H=2, D=16)
def make():
    C = H * D
    qkv = te.placeholder((B, S, 3 * C), "float16", name="qkv")
    d = te.reduce_axis((0, D), name="d")
    sc = te.compute((B, H, S, S), lambda b, h, i, j: te.sum(qkv[b, i, h * D + d].astype("float32") * qkv[b, j, C + h * D + d].astype("float32"), axis=d), name="scores")
    ms = te.compute((B, H, S, S), lambda b, h, i, j: te.if_then_else(j <= i, sc[b, h, i, j] / float(np.sqrt(D)), -1e4), name="masked")
    p = topi.cast(topi.nn.softmax(ms, axis=-1), "float16")
    j = te.reduce_axis((0, S), name="j")
    o = te.compute((B, S, C), lambda b, i, c: te.sum(p[b, c // D, i, j].astype("float32") * qkv[b, j, 2 * C + c].astype("float32"), axis=j), name="o")
    return te.create_prim_func([qkv, topi.cast(o, "float16")])
def inputs(rng):
    return [rng.standard_normal((B, S, 3 * H * D)).astype(np.float32)]
def reference(qkv):
    q, k, v = [a.reshape(B, S, H, D).transpose(0, 2, 1, 3) for a in np.split(qkv, 3, -1)]
    s = np.where(np.tril(np.ones((S, S), bool)), q @ k.swapaxes(-1, -2) / np.sqrt(D), -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [(p @ v).transpose(0, 2, 1, 3).reshape(B, S, H * D)]
def torch_impl(qkv):
    import torch
    q, k, v = [a.view(B, S, H, D).transpose(1, 2) for a in qkv.split(H * D, -1)]
    return [torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, H * D)]
