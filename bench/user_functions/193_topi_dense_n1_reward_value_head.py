"""GEMM with N=1: reward-model / critic value head score = h @ w^T with w [1,K], topi.nn.dense(out_dtype=fp32), bf16 operands, fp32 out [M,1], M=8192 (B=8 x S=1024) K=4096 (Llama-3.1-8B reward model score head)."""
import numpy as np
from tvm import te, topi
M, K = 8192, 4096
SMALL = dict(M=37, K=96)
def make():
    h = te.placeholder((M, K), "bfloat16", name="hidden")
    w = te.placeholder((1, K), "bfloat16", name="score_w")
    return te.create_prim_func([h, w, topi.nn.dense(h, w, out_dtype="float32")])
def inputs(rng):
    return [rng.standard_normal((M, K)).astype(np.float32), (rng.uniform(-1, 1, (1, K)) / np.sqrt(K)).astype(np.float32)]
def reference(h, w):
    return [h @ w.T]
def torch_impl(h, w):
    import torch
    return [torch.nn.functional.linear(h.float(), w.float())]
