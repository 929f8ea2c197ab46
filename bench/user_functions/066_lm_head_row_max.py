"""LM head followed by a per-row max over the vocab (greedy decoding's max logit), TE, fp16 operands fp32 out, M=16 K=4096 V=32000."""
import numpy as np
from tvm import te
M, K, V = 16, 4096, 32000
SMALL = dict(M=3, K=16, V=40)
def make():
    x = te.placeholder((M, K), "float16", name="x")
    w = te.placeholder((V, K), "float16", name="w")
    k = te.reduce_axis((0, K), name="k")
    y = te.compute((M, V), lambda i, j: te.sum(x[i, k].astype("float32") * w[j, k].astype("float32"), axis=k), name="logits")
    v = te.reduce_axis((0, V), name="v")
    return te.create_prim_func([x, w, te.compute((M,), lambda i: te.max(y[i, v], axis=v), name="maxlogit")])
def inputs(rng):
    return [rng.uniform(-1, 1, (M, K)).astype(np.float32), (rng.uniform(-1, 1, (V, K)) / np.sqrt(K)).astype(np.float32)]
def reference(x, w):
    return [(x @ w.T).max(-1)]
def torch_impl(x, w):
    return [(x @ w.T).float().max(-1).values]
