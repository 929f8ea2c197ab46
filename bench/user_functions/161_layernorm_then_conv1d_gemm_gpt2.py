"""Pre-LN FFN input: topi.nn.layer_norm (fp16, as TOPI computes it) then GPT-2 Conv1D h @ W[K,N] + b with fp32 accumulation, TE, fp16, M=2048 (B=2 x S=1024) K=768 N=3072 (GPT-2 ln_2 + mlp.c_fc)."""
import numpy as np
from tvm import te, topi
M, K, N = 2048, 768, 3072
SMALL = dict(M=9, K=64, N=48)
def make():
    x = te.placeholder((M, K), "float16", name="x")
    g = te.placeholder((K,), "float16", name="ln_weight")
    be = te.placeholder((K,), "float16", name="ln_bias")
    w = te.placeholder((K, N), "float16", name="c_fc_weight")
    b = te.placeholder((N,), "float16", name="c_fc_bias")
    h = topi.nn.layer_norm(x, g, be, axis=[-1], epsilon=1e-5)
    k = te.reduce_axis((0, K), name="k")
    y = te.compute((M, N), lambda i, j: te.sum(h[i, k].astype("float32") * w[k, j].astype("float32"), axis=k), name="y")
    o = te.compute((M, N), lambda i, j: (y[i, j] + b[j].astype("float32")).astype("float16"), name="o")
    return te.create_prim_func([x, g, be, w, b, o])
def inputs(rng):
    return [rng.standard_normal((M, K)).astype(np.float32), rng.uniform(0.5, 1.5, (K,)).astype(np.float32),
            rng.uniform(-0.2, 0.2, (K,)).astype(np.float32), (rng.uniform(-1, 1, (K, N)) / np.sqrt(K)).astype(np.float32),
            rng.uniform(-0.5, 0.5, (N,)).astype(np.float32)]
def reference(x, g, be, w, b):
    h = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * g + be
    return [h @ w + b]
def torch_impl(x, g, be, w, b):
    import torch
    h = torch.nn.functional.layer_norm(x, (K,), g, be, 1e-5)
    return [torch.addmm(b, h, w)]
