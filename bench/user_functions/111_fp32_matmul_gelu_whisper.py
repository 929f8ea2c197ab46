"""fp32 x @ W ([K,N] weight) + bias + erf-GELU via topi.matmul/topi.add/topi.erf, M=1500 K=384 N=1536 (Whisper-tiny encoder fc1, 30 s of audio)."""
import numpy as np
from tvm import te, topi
M, K, N = 1500, 384, 1536
SMALL = dict(M=33, K=64, N=48)
def make():
    x = te.placeholder((M, K), "float32", name="x")
    w = te.placeholder((K, N), "float32", name="w")
    b = te.placeholder((N,), "float32", name="b")
    h = topi.add(topi.matmul(x, w), b)
    y = topi.multiply(topi.multiply(h, 0.5), topi.add(topi.erf(topi.multiply(h, float(1 / np.sqrt(2)))), 1.0))
    return te.create_prim_func([x, w, b, y])
def inputs(rng):
    return [rng.standard_normal((M, K)).astype(np.float32), (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32),
            rng.standard_normal((N,)).astype(np.float32) * 0.1]
def reference(x, w, b):
    from scipy.special import erf
    h = x @ w + b
    return [0.5 * h * (1 + erf(h / np.sqrt(2)))]
def torch_impl(x, w, b):
    import torch
    return [torch.nn.functional.gelu(x @ w + b)]
