"""GroupNorm via topi.nn.group_norm (32 groups, NCHW, stats over C/G x H x W), fp16 as TOPI computes it, [2,320,64,64] (Stable-Diffusion-1.5 UNet first block)."""
import numpy as np
from tvm import te, topi
N, C, HH, WW, G = 2, 320, 64, 64, 32
SMALL = dict(N=1, C=8, HH=4, WW=5, G=2)
def make():
    x = te.placeholder((N, C, HH, WW), "float16", name="x")
    g = te.placeholder((C,), "float16", name="gamma")
    b = te.placeholder((C,), "float16", name="beta")
    y = topi.nn.group_norm(x, g, b, num_groups=G, channel_axis=1, axes=[2, 3], epsilon=1e-5)
    return te.create_prim_func([x, g, b, y])
def inputs(rng):
    return [rng.standard_normal((N, C, HH, WW)).astype(np.float32), rng.uniform(0.5, 1.5, (C,)).astype(np.float32),
            rng.uniform(-0.5, 0.5, (C,)).astype(np.float32)]
def reference(x, g, b):
    xr = x.reshape(N, G, -1); m = xr.mean(-1, keepdims=True); v = xr.var(-1, keepdims=True)
    y = ((xr - m) / np.sqrt(v + 1e-5)).reshape(x.shape)
    return [y * g[None, :, None, None] + b[None, :, None, None]]
def torch_impl(x, g, b):
    import torch
    return [torch.nn.functional.group_norm(x, G, g, b, 1e-5)]
