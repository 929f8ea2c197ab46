"""MoE decode expert GEMV with the weight chosen per row by an index: y[t,n] = sum_k x[t,k] * W[ids[t],n,k] (the token's two routed copies, each its own expert), fp32 accumulation, TE, fp16, x [2,4096], W [8,14336,4096] (Mixtral-8x7B w1)."""
import numpy as np
from tvm import te
T_, E, K, N = 2, 8, 4096, 14336
SMALL = dict(E=4, K=64, N=48)
def make():
    x = te.placeholder((T_, K), "float16", name="x")
    ids = te.placeholder((T_,), "int32", name="expert_ids")
    w = te.placeholder((E, N, K), "float16", name="w1")
    k = te.reduce_axis((0, K), name="k")
    y = te.compute((T_, N), lambda t, n: te.sum(x[t, k].astype("float32") * w[ids[t], n, k].astype("float32"), axis=k), name="y")
    return te.create_prim_func([x, ids, w, te.compute((T_, N), lambda t, n: y[t, n].astype("float16"), name="o")])
def inputs(rng):
    return [rng.uniform(-1, 1, (T_, K)).astype(np.float32), rng.choice(E, T_, replace=False).astype(np.int32),
            (rng.uniform(-1, 1, (E, N, K)) / np.sqrt(K)).astype(np.float32)]
def reference(x, ids, w):
    return [np.einsum("tk,tnk->tn", x, w[ids])]
def torch_impl(x, ids, w):
    import torch
    return [torch.einsum("tk,tnk->tn", x, w[ids.long()])]
