"""Batched GEMV of decode: one query per head against its cached keys, scores[b,h,j] = sum_d q[b,h,d] * k_cache[b,h,j,d] * 1/sqrt(D), fp32 scores out (the softmax runs in a separate kernel), TE explicit fp32 casts, fp16, B=8 H=32 L=4096 D=128 (Llama-2-7B eager decode attention, the q @ k^T step)."""
import numpy as np
from tvm import te
B, H, L, D = 8, 32, 4096, 128
SMALL = dict(B=2, H=3, L=17, D=16)
def make():
    q = te.placeholder((B, H, D), "float16", name="q")
    k = te.placeholder((B, H, L, D), "float16", name="k_cache")
    d = te.reduce_axis((0, D), name="d")
    dot = te.compute((B, H, L), lambda b, h, j: te.sum(q[b, h, d].astype("float32") * k[b, h, j, d].astype("float32"), axis=d), name="dot")
    sc = te.compute((B, H, L), lambda b, h, j: dot[b, h, j] * float(D ** -0.5), name="scores")
    return te.create_prim_func([q, k, sc])
def inputs(rng):
    return [rng.standard_normal((B, H, D)).astype(np.float32), rng.standard_normal((B, H, L, D)).astype(np.float32)]
def reference(q, k):
    return [np.einsum("bhd,bhjd->bhj", q, k) / np.sqrt(D)]
def torch_impl(q, k):
    import torch
    return [(q[:, :, None].float() @ k.float().transpose(-1, -2))[:, :, 0] * D ** -0.5]
