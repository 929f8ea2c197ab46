"""W8A16 decode: int8 weight [N,K] dequantized per output channel by an fp16 scale [N] in its own TE stage, then topi.nn.dense(x, w) with its default (fp16) accumulation, x [1,K], K=4096 N=4096 (Mistral-7B o_proj, weight-only int8)."""
import numpy as np
from tvm import te, topi
K, N = 4096, 4096
SMALL = dict(K=128, N=40)
def make():
    x = te.placeholder((1, K), "float16", name="x")
    wq = te.placeholder((N, K), "int8", name="w_int8")
    s = te.placeholder((N,), "float16", name="w_scale")
    w = te.compute((N, K), lambda n, k: wq[n, k].astype("float16") * s[n], name="dequantize")
    return te.create_prim_func([x, wq, s, topi.nn.dense(x, w)])
def inputs(rng):
    return [rng.uniform(-1, 1, (1, K)).astype(np.float32), rng.integers(-127, 128, (N, K)).astype(np.int8),
            (rng.uniform(0.5, 1.5, (N,)) / (127 * np.sqrt(K)) * 4).astype(np.float32)]
def reference(x, wq, s):
    return [x @ (wq.astype(np.float64) * s[:, None]).T]
def torch_impl(x, wq, s):
    import torch
    return [torch.nn.functional.linear(x, wq.to(x.dtype) * s[:, None])]
