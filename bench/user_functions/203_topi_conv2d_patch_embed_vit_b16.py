"""ViT patch embedding as a strided convolution: topi.nn.conv2d_nchw(img [B,3,224,224], W [768,3,16,16], stride 16, no padding, out_dtype=fp32) + bias -> fp16 -> flatten(2).transpose(1, 2) as topi.reshape + topi.transpose to tokens [B,196,768], fp16, B=32 (ViT-B/16 at 224px, timm PatchEmbed)."""
import numpy as np
from tvm import te, topi
B, C, IMG, P, E = 32, 3, 224, 16, 768
SMALL = dict(B=2, C=3, IMG=32, P=8, E=24)
def make():
    g = IMG // P
    x = te.placeholder((B, C, IMG, IMG), "float16", name="img")
    w = te.placeholder((E, C, P, P), "float16", name="w")
    b = te.placeholder((E,), "float16", name="b")
    y = topi.nn.conv2d_nchw(x, w, stride=P, padding=0, dilation=1, out_dtype="float32")
    y = topi.cast(topi.add(y, topi.reshape(topi.cast(b, "float32"), (1, E, 1, 1))), "float16")
    t = topi.transpose(topi.reshape(y, (B, E, g * g)), (0, 2, 1))
    return te.create_prim_func([x, w, b, t])
def inputs(rng):
    return [rng.uniform(-1, 1, (B, C, IMG, IMG)).astype(np.float32), (rng.uniform(-1, 1, (E, C, P, P)) * 2 / np.sqrt(C * P * P)).astype(np.float32),
            rng.uniform(-0.5, 0.5, (E,)).astype(np.float32)]
def reference(x, w, b):
    g = IMG // P
    patches = x.reshape(B, C, g, P, g, P).transpose(0, 2, 4, 1, 3, 5).reshape(B, g * g, C * P * P)
    return [patches @ w.reshape(E, -1).T + b]
def torch_impl(x, w, b):
    import torch
    return [torch.nn.functional.conv2d(x, w, b, stride=P).flatten(2).transpose(1, 2)]
