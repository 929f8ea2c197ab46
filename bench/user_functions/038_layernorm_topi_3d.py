"""LayerNorm via topi.nn.layer_norm over the last axis of [B,S,H], fp16 in/out (TOPI's own internal precision), B=8 S=128 H=768 (BERT-base)."""
import numpy as np
from tvm import te, topi
B, S, Hd = 8, 128, 768
SMALL = dict(B=2, S=3, Hd=64)
def make():
    x = te.placeholder((B, S, Hd), "float16", name="x")
    g = te.placeholder((Hd,), "float16", name="gamma")
    b = te.placeholder((Hd,), "float16", name="beta")
    return te.create_prim_func([x, g, b, topi.nn.layer_norm(x, g, b, axis=[2], epsilon=1e-12)])
def inputs(rng):
    return [rng.standard_normal((B, S, Hd)).astype(np.float32), rng.uniform(0.5, 1.5, (Hd,)).astype(np.float32),
            rng.uniform(-0.5, 0.5, (Hd,)).astype(np.float32)]
def reference(x, g, b):
    mu = x.mean(-1, keepdims=True); var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return [(x - mu) / np.sqrt(var + 1e-12) * g + b]
def torch_impl(x, g, b):
    import torch
    return [torch.nn.functional.layer_norm(x, (Hd,), g, b, 1e-12)]
