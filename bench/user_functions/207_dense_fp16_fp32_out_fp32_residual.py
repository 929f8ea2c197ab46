"""Dense writing fp32 with an fp32 residual added: out = residual + x @ W^T, fp16 operands, fp32 accumulation, fp32 residual stream in and out (mixed-precision training keeping the residual in fp32), TE, W [N,K], M=4096 (B=2 x S=2048) K=4096 N=4096 (Llama-2-7B o_proj + residual)."""
import numpy as np
from tvm import te
M, K, N = 4096, 4096, 4096
SMALL = dict(M=9, K=64, N=40)
def make():
    x = te.placeholder((M, K), "float16", name="x")
    w = te.placeholder((N, K), "float16", name="w")
    r = te.placeholder((M, N), "float32", name="residual")
    k = te.reduce_axis((0, K), name="k")
    y = te.compute((M, N), lambda m, n: te.sum(x[m, k].astype("float32") * w[n, k].astype("float32"), axis=k), name="y")
    out = te.compute((M, N), lambda m, n: r[m, n] + y[m, n], name="out")
    return te.create_prim_func([x, w, r, out])
def inputs(rng):
    return [rng.uniform(-1, 1, (M, K)).astype(np.float32), (rng.uniform(-1, 1, (N, K)) * 2 / np.sqrt(K)).astype(np.float32),
            rng.standard_normal((M, N)).astype(np.float32)]
def reference(x, w, r):
    return [r + x @ w.T]
def torch_impl(x, w, r):
    import torch
    return [torch.addmm(r, x.float(), w.float().t())]
