"""x @ W^T via topi.matmul(transp_b=True), fp16 in/out with fp16 accumulation as TOPI writes it, W [N,K], M=4097 K=4096 N=1024 (Llama-3-8B k_proj, 4097-token prefill)."""
import numpy as np
from tvm import te, topi
M, K, N = 4097, 4096, 1024
SMALL = dict(M=33, K=64, N=48)
def make():
    x = te.placeholder((M, K), "float16", name="x")
    w = te.placeholder((N, K), "float16", name="w")
    y = topi.matmul(x, w, transp_b=True)
    return te.create_prim_func([x, w, y])
def inputs(rng):
    return [rng.uniform(-1, 1, (M, K)).astype(np.float32), (rng.uniform(-1, 1, (N, K)) / np.sqrt(K)).astype(np.float32)]
def reference(x, w):
    return [x @ w.T]
def torch_impl(x, w):
    return [x @ w.T]
