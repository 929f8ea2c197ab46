"""GEMM writing its output transposed: kT[n,m] = sum_k Wk[n,k] * x[m,k] (the k_proj producing K^T [N,M] directly for the q @ K^T that follows), fp32 accumulation, TE, fp16, M=2048 K=4096 N=1024 (Llama-3-8B k_proj, 2048-token prefill)."""
import numpy as np
from tvm import te
M, K, N = 2048, 4096, 1024
SMALL = dict(M=19, K=64, N=40)
def make():
    x = te.placeholder((M, K), "float16", name="x")
    w = te.placeholder((N, K), "float16", name="w_k")
    k = te.reduce_axis((0, K), name="k")
    acc = te.compute((N, M), lambda n, m: te.sum(w[n, k].astype("float32") * x[m, k].astype("float32"), axis=k), name="kT_acc")
    return te.create_prim_func([x, w, te.compute((N, M), lambda n, m: acc[n, m].astype("float16"), name="kT")])
def inputs(rng):
    return [rng.uniform(-1, 1, (M, K)).astype(np.float32), (rng.uniform(-1, 1, (N, K)) * 2 / np.sqrt(K)).astype(np.float32)]
def reference(x, w):
    return [w @ x.T]
def torch_impl(x, w):
    import torch
    return [(x @ w.T).T.contiguous()]
