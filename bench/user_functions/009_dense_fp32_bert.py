"""Dense + bias + erf-GELU, TOPI topi.nn.dense with bias + topi.fast_erf-free gelu via te, fp32, M=128 K=768 N=3072 (BERT-base, batch 1)."""
import numpy as np
from tvm import te, topi
M, K, N = 128, 768, 3072
SMALL = dict(M=9, K=32, N=24)
def make():
    x = te.placeholder((M, K), "float32", name="x")
    w = te.placeholder((N, K), "float32", name="w")
    b = te.placeholder((N,), "float32", name="b")
    y = topi.nn.dense(x, w, b)
    o = te.compute((M, N), lambda i, j: 0.5 * y[i, j] * (1.0 + te.erf(y[i, j] * 0.7071067811865476)), name="gelu")
    return te.create_prim_func([x, w, b, o])
def inputs(rng):
    return [rng.uniform(-1, 1, (M, K)).astype(np.float32), (rng.uniform(-1, 1, (N, K)) / np.sqrt(K) * 2).astype(np.float32),
            rng.uniform(-1, 1, (N,)).astype(np.float32)]
def reference(x, w, b):
    from math import erf
    y = x @ w.T + b
    return [0.5 * y * (1 + np.vectorize(erf)(y / np.sqrt(2)))]
def torch_impl(x, w, b):
    import torch
    return [torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b))]
