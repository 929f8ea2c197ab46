"""Dense + bias (GPT-2 c_fc), TOPI topi.nn.dense(out_dtype=fp32) + add + cast, fp16, M=1021 (prime) K=768 N=3072."""
import numpy as np
from tvm import te, topi
M, K, N = 1021, 768, 3072
SMALL = dict(M=37, K=64, N=96)
def make():
    x = te.placeholder((M, K), "float16", name="x")
    w = te.placeholder((N, K), "float16", name="w")
    b = te.placeholder((N,), "float16", name="b")
    y = topi.nn.dense(x, w, out_dtype="float32")
    y = topi.add(y, topi.cast(b, "float32"))
    o = topi.cast(y, "float16")
    return te.create_prim_func([x, w, b, o])
def inputs(rng):
    return [rng.uniform(-1, 1, (M, K)).astype(np.float32), (rng.uniform(-1, 1, (N, K)) / np.sqrt(K)).astype(np.float32),
            rng.uniform(-1, 1, (N,)).astype(np.float32)]
def reference(x, w, b):
    return [x @ w.T + b]
def torch_impl(x, w, b):
    import torch
    return [torch.nn.functional.linear(x, w, b)]
