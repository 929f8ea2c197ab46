"""Matmul x @ W with W [K,N] + residual, TOPI topi.matmul (fp16 accumulation as written) + topi.add, fp16, M=127 K=2048 N=2048."""
import numpy as np
from tvm import te, topi
M, K, N = 127, 2048, 2048
SMALL = dict(M=13, K=64, N=32)
def make():
    x = te.placeholder((M, K), "float16", name="x")
    w = te.placeholder((K, N), "float16", name="w")
    r = te.placeholder((M, N), "float16", name="res")
    y = topi.matmul(x, w)
    o = topi.add(y, r)
    return te.create_prim_func([x, w, r, o])
def inputs(rng):
    return [rng.uniform(-1, 1, (M, K)).astype(np.float32), (rng.uniform(-1, 1, (K, N)) / np.sqrt(K)).astype(np.float32),
            rng.uniform(-1, 1, (M, N)).astype(np.float32)]
def reference(x, w, r):
    return [x @ w + r]
def torch_impl(x, w, r):
    return [x @ w + r]
