"""W8A8 integer GEMM: topi.nn.dense(int8, int8, out_dtype='int32'), W [N,K], M=1000 K=4096 N=14336 (Llama-3-8B up_proj, SmoothQuant-style)."""
import numpy as np
from tvm import te, topi
M, K, N = 1000, 4096, 14336
SMALL = dict(M=33, K=64, N=48)
def make():
    x = te.placeholder((M, K), "int8", name="x")
    w = te.placeholder((N, K), "int8", name="w")
    y = topi.nn.dense(x, w, out_dtype="int32")
    return te.create_prim_func([x, w, y])
def inputs(rng):
    return [rng.integers(-128, 128, (M, K)).astype(np.int8), rng.integers(-128, 128, (N, K)).astype(np.int8)]
def reference(x, w):
    return [x.astype(np.int64) @ w.astype(np.int64).T]
def torch_impl(x, w):
    import torch
    return [torch._int_mm(x, w.t().contiguous())]
