"""Elementwise SwiGLU activation on a fused [M,2N] gate_up output: silu(first half) * second half, TOPI split + sigmoid + multiply, fp16, M=1021 N=11008."""
import numpy as np
from tvm import te, topi
M, N = 1021, 11008
SMALL = dict(M=3, N=16)
def make():
    y = te.placeholder((M, 2 * N), "float16", name="gate_up")
    g, u = topi.split(y, 2, axis=1)
    return te.create_prim_func([y, topi.multiply(topi.multiply(g, topi.sigmoid(g)), u)])
def inputs(rng):
    return [(rng.standard_normal((M, 2 * N)) * 2).astype(np.float32)]
def reference(y):
    g, u = y[:, :N], y[:, N:]
    return [g / (1 + np.exp(-g)) * u]
def torch_impl(y):
    import torch
    g, u = y.chunk(2, -1)
    return [torch.nn.functional.silu(g) * u]
