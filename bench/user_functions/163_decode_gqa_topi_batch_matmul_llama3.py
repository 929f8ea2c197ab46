"""Grouped-query decode attention as TOPI ops: the 4 query heads of each kv head as rows, topi.nn.batch_matmul(q[BHkv,G,D], k_cache[BHkv,L,D]) fp32, * 1/sqrt(D), topi.nn.softmax, cast, topi.nn.batch_matmul(p, v_cache, transpose_b=False), fp16, B=4 Hkv=8 G=4 D=128 L=4096 (Llama-3-8B)."""
import numpy as np
from tvm import te, topi
B, HKV, G, D, L = 4, 8, 4, 128, 4096
SMALL = dict(B=1, HKV=2, G=2, D=16, L=19)
def make():
    q = te.placeholder((B * HKV, G, D), "float16", name="q")
    k = te.placeholder((B * HKV, L, D), "float16", name="k_cache")
    v = te.placeholder((B * HKV, L, D), "float16", name="v_cache")
    s = topi.nn.batch_matmul(q, k, out_dtype="float32")
    s = topi.multiply(s, 1.0 / float(np.sqrt(D)))
    p = topi.cast(topi.nn.softmax(s, axis=-1), "float16")
    o = topi.nn.batch_matmul(p, v, transpose_b=False, out_dtype="float32")
    return te.create_prim_func([q, k, v, topi.cast(o, "float16")])
def inputs(rng):
    return [rng.standard_normal((B * HKV, G, D)).astype(np.float32), rng.standard_normal((B * HKV, L, D)).astype(np.float32),
            rng.standard_normal((B * HKV, L, D)).astype(np.float32)]
def reference(q, k, v):
    s = q @ k.swapaxes(-1, -2) / np.sqrt(D)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [p @ v]
def torch_impl(q, k, v):
    import torch
    return [torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None])[0]]
