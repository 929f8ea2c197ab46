"""Projection plus residual with the weight stored [K,N]: topi.nn.matmul(x, W, out_dtype=fp32) + the bf16 residual cast to fp32, rounded to bf16 (topi.cast/topi.add), bf16, M=2048 K=4096 N=4096 (Llama-3-8B o_proj + residual, a JAX-style x @ W layout)."""
import numpy as np
from tvm import te, topi
M, K, N = 2048, 4096, 4096
SMALL = dict(M=7, K=64, N=48)
def make():
    x = te.placeholder((M, K), "bfloat16", name="attn_out")
    w = te.placeholder((K, N), "bfloat16", name="w_o")
    res = te.placeholder((M, N), "bfloat16", name="residual")
    y = topi.cast(topi.add(topi.nn.matmul(x, w, out_dtype="float32"), topi.cast(res, "float32")), "bfloat16")
    return te.create_prim_func([x, w, res, y])
def inputs(rng):
    return [rng.uniform(-1, 1, (M, K)).astype(np.float32), (rng.uniform(-1, 1, (K, N)) * 2 / np.sqrt(K)).astype(np.float32),
            rng.uniform(-1, 1, (M, N)).astype(np.float32)]
def reference(x, w, res):
    return [x @ w + res]
def torch_impl(x, w, res):
    import torch
    return [((x.float() @ w.float()) + res.float()).to(res.dtype)]
