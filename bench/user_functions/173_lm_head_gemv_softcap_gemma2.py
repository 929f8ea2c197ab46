"""Decode LM head GEMV with Gemma-2's final logit soft-capping: logits = 30 * tanh((x @ W^T) / 30), fp32 accumulation and fp32 logits, TE, bf16, x [1,2304] W [256000,2304] (Gemma-2-2B lm_head, tied embedding)."""
import numpy as np
from tvm import te
K, N = 2304, 256000
SMALL = dict(K=64, N=97)
CAP = 30.0
def make():
    x = te.placeholder((1, K), "bfloat16", name="x")
    w = te.placeholder((N, K), "bfloat16", name="embed_tokens")
    k = te.reduce_axis((0, K), name="k")
    y = te.compute((1, N), lambda i, j: te.sum(x[i, k].astype("float32") * w[j, k].astype("float32"), axis=k), name="y")
    o = te.compute((1, N), lambda i, j: te.tanh(y[i, j] * (1.0 / CAP)) * CAP, name="logits")
    return te.create_prim_func([x, w, o])
def inputs(rng):
    return [rng.standard_normal((1, K)).astype(np.float32), (rng.standard_normal((N, K)) * 3 / np.sqrt(K)).astype(np.float32) * 10]
def reference(x, w):
    return [np.tanh((x @ w.T) / CAP) * CAP]
def torch_impl(x, w):
    import torch
    return [torch.tanh((x @ w.T).float() / CAP) * CAP]
