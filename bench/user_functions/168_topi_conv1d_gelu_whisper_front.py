"""Whisper audio front conv1: topi.nn.conv1d(mel [B,80,3000], W [768,80,3], stride 1, padding 1, NCW, fp32 out) + bias then erf GELU -> fp16, B=2 (Whisper-small encoder.conv1)."""
import numpy as np
from tvm import te, topi
B, C, W, O, KW = 2, 80, 3000, 768, 3
SMALL = dict(B=1, C=4, W=11, O=8)
def make():
    x = te.placeholder((B, C, W), "float16", name="mel")
    w = te.placeholder((O, C, KW), "float16", name="conv1_weight")
    b = te.placeholder((O,), "float16", name="conv1_bias")
    y = topi.nn.conv1d(x, w, strides=1, padding=1, dilation=1, data_layout="NCW", out_dtype="float32")
    def f(n, o, t):
        h = y[n, o, t] + b[o].astype("float32")
        return (0.5 * h * (1.0 + te.erf(h * 0.7071067811865476))).astype("float16")
    return te.create_prim_func([x, w, b, te.compute((B, O, W), f, name="gelu")])
def inputs(rng):
    return [rng.standard_normal((B, C, W)).astype(np.float32), (rng.uniform(-1, 1, (O, C, KW)) * 2 / np.sqrt(C * KW)).astype(np.float32),
            rng.uniform(-0.5, 0.5, (O,)).astype(np.float32)]
def reference(x, w, b):
    from math import erf
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1)))
    h = sum(np.einsum("bct,oc->bot", xp[:, :, t:t + W], w[:, :, t]) for t in range(KW)) + b[None, :, None]
    return [0.5 * h * (1 + np.vectorize(erf)(h / np.sqrt(2)))]
def torch_impl(x, w, b):
    import torch
    return [torch.nn.functional.gelu(torch.nn.functional.conv1d(x, w, b, padding=1))]
