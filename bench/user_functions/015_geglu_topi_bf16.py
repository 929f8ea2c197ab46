"""Gated GeGLU dense gelu(x Wg^T) * (x Wu^T), TOPI topi.nn.dense x2 (fp32 out) + erf-gelu, bf16, M=127 K=2048 N=5632 (Gemma-2B-ish)."""
import numpy as np
from tvm import te, topi
M, K, N = 127, 2048, 5632
SMALL = dict(M=7, K=64, N=40)
def make():
    x = te.placeholder((M, K), "bfloat16", name="x")
    wg = te.placeholder((N, K), "bfloat16", name="w_gate")
    wu = te.placeholder((N, K), "bfloat16", name="w_up")
    g = topi.nn.dense(x, wg, out_dtype="float32")
    u = topi.nn.dense(x, wu, out_dtype="float32")
    gelu = topi.multiply(topi.multiply(g, 0.5), topi.add(topi.erf(topi.multiply(g, 0.7071067811865476)), 1.0))
    o = topi.cast(topi.multiply(gelu, u), "bfloat16")
    return te.create_prim_func([x, wg, wu, o])
def inputs(rng):
    s = 2 / np.sqrt(K)
    return [rng.uniform(-1, 1, (M, K)).astype(np.float32), (rng.uniform(-1, 1, (N, K)) * s).astype(np.float32),
            (rng.uniform(-1, 1, (N, K)) * s).astype(np.float32)]
def reference(x, wg, wu):
    from math import erf
    g = x @ wg.T; u = x @ wu.T
    return [0.5 * g * (1 + np.vectorize(erf)(g / np.sqrt(2))) * u]
def torch_impl(x, wg, wu):
    import torch
    return [torch.nn.functional.gelu(x @ wg.T) * (x @ wu.T)]
