"""Dense with 3 rows via topi.nn.dense without out_dtype (fp16 accumulation as TOPI writes it), W [N,K], fp16, M=3 K=2048 N=5632 (TinyLlama-1.1B gate_proj, 3 sequences decoding)."""
import numpy as np
from tvm import te, topi
M, K, N = 3, 2048, 5632
SMALL = dict(K=64, N=48)
def make():
    x = te.placeholder((M, K), "float16", name="x")
    w = te.placeholder((N, K), "float16", name="w")
    return te.create_prim_func([x, w, topi.nn.dense(x, w)])
def inputs(rng):
    return [rng.uniform(-1, 1, (M, K)).astype(np.float32), (rng.uniform(-1, 1, (N, K)) / np.sqrt(K)).astype(np.float32)]
def reference(x, w):
    return [x @ w.T]
def torch_impl(x, w):
    import torch
    return [torch.nn.functional.linear(x, w)]
