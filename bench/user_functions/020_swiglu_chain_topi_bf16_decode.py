"""SwiGLU FFN chain, TOPI (topi.nn.dense fp32 out, topi.sigmoid, topi.multiply, casts), bf16, M=16 decode batch, H=896 I=4864 (Qwen2-0.5B)."""
import numpy as np
from tvm import te, topi
M, H, I = 16, 896, 4864
SMALL = dict(M=4, H=32, I=48)
def make():
    x = te.placeholder((M, H), "bfloat16", name="x")
    wg = te.placeholder((I, H), "bfloat16", name="wg")
    wu = te.placeholder((I, H), "bfloat16", name="wu")
    wd = te.placeholder((H, I), "bfloat16", name="wd")
    g = topi.nn.dense(x, wg, out_dtype="float32")
    u = topi.nn.dense(x, wu, out_dtype="float32")
    a = topi.cast(topi.multiply(topi.multiply(g, topi.sigmoid(g)), u), "bfloat16")
    o = topi.cast(topi.nn.dense(a, wd, out_dtype="float32"), "bfloat16")
    return te.create_prim_func([x, wg, wu, wd, o])
def inputs(rng):
    return [rng.uniform(-1, 1, (M, H)).astype(np.float32), (rng.uniform(-1, 1, (I, H)) * 2 / np.sqrt(H)).astype(np.float32),
            (rng.uniform(-1, 1, (I, H)) * 2 / np.sqrt(H)).astype(np.float32), (rng.uniform(-1, 1, (H, I)) * 2 / np.sqrt(I)).astype(np.float32)]
def _bf16(a):
    f = a.astype(np.float32); u = f.view(np.uint32)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return u.view(np.float32).astype(np.float64)
def reference(x, wg, wu, wd):
    g = x @ wg.T; u = x @ wu.T
    return [_bf16(g / (1 + np.exp(-g)) * u) @ wd.T]
def torch_impl(x, wg, wu, wd):
    import torch
    return [(torch.nn.functional.silu(x @ wg.T) * (x @ wu.T)) @ wd.T]
