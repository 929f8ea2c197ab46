"""Mamba causal depthwise conv1d (kernel 4, left padding 3, per-channel weight [D,4] + bias) then SiLU, hand-written TE with te.if_then_else for the causal pad, fp16 with fp32 math, x [B,D,L] B=2 D=1536 L=2048 (Mamba-130m mixer.conv1d, d_inner 1536)."""
import numpy as np
from tvm import te
B, D, L, KW = 2, 1536, 2048, 4
SMALL = dict(B=1, D=3, L=9)
def make():
    x = te.placeholder((B, D, L), "float16", name="x")
    w = te.placeholder((D, KW), "float16", name="conv_weight")
    b = te.placeholder((D,), "float16", name="conv_bias")
    t = te.reduce_axis((0, KW), name="t")
    xp = lambda n, c, l: te.if_then_else(l >= 0, x[n, c, l].astype("float32"), te.const(0, "float32"))
    y = te.compute((B, D, L), lambda n, c, l: te.sum(xp(n, c, l + t - (KW - 1)) * w[c, t].astype("float32"), axis=t), name="conv")
    def f(n, c, l):
        h = y[n, c, l] + b[c].astype("float32")
        return (h * te.sigmoid(h)).astype("float16")
    return te.create_prim_func([x, w, b, te.compute((B, D, L), f, name="silu")])
def inputs(rng):
    return [rng.standard_normal((B, D, L)).astype(np.float32), rng.uniform(-0.5, 0.5, (D, KW)).astype(np.float32),
            rng.uniform(-0.2, 0.2, (D,)).astype(np.float32)]
def reference(x, w, b):
    xp = np.pad(x, ((0, 0), (0, 0), (KW - 1, 0)))
    h = sum(xp[:, :, t:t + L] * w[None, :, t, None] for t in range(KW)) + b[None, :, None]
    return [h / (1 + np.exp(-h))]
def torch_impl(x, w, b):
    import torch
    return [torch.nn.functional.silu(torch.nn.functional.conv1d(x, w[:, None, :], b, padding=KW - 1, groups=D)[..., :L])]
