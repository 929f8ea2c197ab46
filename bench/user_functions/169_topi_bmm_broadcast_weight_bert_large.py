"""Batched GEMM with a broadcast batch: topi.nn.batch_matmul(x[8,512,1024], W[1,1024,1024], transpose_b=False, fp32 out) + bias -> fp16, fp16 (BERT-large attention.output.dense written as bmm)."""
import numpy as np
from tvm import te, topi
B, S, K, N = 8, 512, 1024, 1024
SMALL = dict(B=3, S=5, K=64, N=48)
def make():
    x = te.placeholder((B, S, K), "float16", name="x")
    w = te.placeholder((1, K, N), "float16", name="w")
    b = te.placeholder((N,), "float16", name="b")
    y = topi.nn.batch_matmul(x, w, transpose_b=False, out_dtype="float32")
    o = te.compute((B, S, N), lambda i, s, j: (y[i, s, j] + b[j].astype("float32")).astype("float16"), name="o")
    return te.create_prim_func([x, w, b, o])
def inputs(rng):
    return [rng.uniform(-1, 1, (B, S, K)).astype(np.float32), (rng.uniform(-1, 1, (1, K, N)) / np.sqrt(K)).astype(np.float32),
            rng.uniform(-1, 1, (N,)).astype(np.float32)]
def reference(x, w, b):
    return [x @ w + b]
def torch_impl(x, w, b):
    import torch
    return [torch.bmm(x, w.expand(B, K, N)) + b]
