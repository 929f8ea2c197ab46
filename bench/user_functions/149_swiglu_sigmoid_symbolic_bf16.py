"""SwiGLU activation written as g * sigmoid(g) * u (no silu op) on separate gate/up outputs with symbolic rows n = te.var, TE, bf16, width 14336 (Llama-3-8B), n typically 1..8192."""
import numpy as np
from tvm import te
W, NTOK = 14336, 2048
SMALL = dict(W=64, NTOK=5)
def make():
    n = te.var("n")
    g = te.placeholder((n, W), "bfloat16", name="gate")
    u = te.placeholder((n, W), "bfloat16", name="up")
    def f(i, j):
        x = g[i, j].astype("float32")
        return (x * te.sigmoid(x) * u[i, j].astype("float32")).astype("bfloat16")
    return te.create_prim_func([g, u, te.compute((n, W), f, name="swiglu")])
def inputs(rng):
    return [rng.standard_normal((NTOK, W)).astype(np.float32) * 3, rng.standard_normal((NTOK, W)).astype(np.float32)]
def reference(g, u):
    return [g / (1 + np.exp(-g)) * u]
def torch_impl(g, u):
    import torch
    return [torch.nn.functional.silu(g) * u]
