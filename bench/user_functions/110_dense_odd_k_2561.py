"""Dense with an odd reduction length K=2560+1 (hidden concatenated with one extra feature), topi.nn.dense(out_dtype=fp32) + topi.cast fp16, W [N,K], M=1000 K=2561 N=2560 (Phi-2 width)."""
import numpy as np
from tvm import te, topi
M, K, N = 1000, 2561, 2560
SMALL = dict(M=33, K=65, N=48)
def make():
    x = te.placeholder((M, K), "float16", name="x")
    w = te.placeholder((N, K), "float16", name="w")
    y = topi.cast(topi.nn.dense(x, w, out_dtype="float32"), "float16")
    return te.create_prim_func([x, w, y])
def inputs(rng):
    return [rng.uniform(-1, 1, (M, K)).astype(np.float32), (rng.uniform(-1, 1, (N, K)) / np.sqrt(K)).astype(np.float32)]
def reference(x, w):
    return [x @ w.T]
def torch_impl(x, w):
    import torch
    return [torch.nn.functional.linear(x, w)]
