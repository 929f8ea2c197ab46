"""LayerNorm over the last TWO axes (normalized_shape=(C,W)), topi.nn.layer_norm axis=[1,2], fp32, [32, 64, 512]."""
import numpy as np
from tvm import te, topi
N, C, W = 32, 64, 512
SMALL = dict(N=2, C=3, W=16)
def make():
    x = te.placeholder((N, C, W), "float32", name="x")
    g = te.placeholder((C, W), "float32", name="gamma")
    b = te.placeholder((C, W), "float32", name="beta")
    return te.create_prim_func([x, g, b, topi.nn.layer_norm(x, g, b, axis=[1, 2], epsilon=1e-5)])
def inputs(rng):
    return [rng.standard_normal((N, C, W)).astype(np.float32), rng.uniform(0.5, 1.5, (C, W)).astype(np.float32),
            rng.uniform(-0.5, 0.5, (C, W)).astype(np.float32)]
def reference(x, g, b):
    mu = x.mean((1, 2), keepdims=True); var = ((x - mu) ** 2).mean((1, 2), keepdims=True)
    return [(x - mu) / np.sqrt(var + 1e-5) * g + b]
def torch_impl(x, g, b):
    import torch
    return [torch.nn.functional.layer_norm(x, (C, W), g, b, 1e-5)]
