"""W8A16 weight-only int8 GEMM: dequant written inside the product x * (w.astype(fp16) * s[n]) with fp32 accumulation, W int8 [N,K], per-channel fp16 scale, TE, M=256 K=3584 N=18944 (Qwen2-7B up_proj)."""
import numpy as np
from tvm import te
M, K, N = 256, 3584, 18944
SMALL = dict(M=33, K=64, N=48)
def make():
    x = te.placeholder((M, K), "float16", name="x")
    w = te.placeholder((N, K), "int8", name="w")
    s = te.placeholder((N,), "float16", name="scale")
    k = te.reduce_axis((0, K), name="k")
    y = te.compute((M, N), lambda i, j: te.sum(x[i, k].astype("float32") * (w[j, k].astype("float16") * s[j]).astype("float32"), axis=k), name="y")
    o = te.compute((M, N), lambda i, j: y[i, j].astype("float16"), name="o")
    return te.create_prim_func([x, w, s, o])
def inputs(rng):
    return [rng.uniform(-1, 1, (M, K)).astype(np.float32), rng.integers(-127, 128, (N, K)).astype(np.int8),
            (rng.uniform(0.5, 1.5, (N,)) / 127 / np.sqrt(K)).astype(np.float32)]
def reference(x, w, s):
    return [x @ (w.astype(np.float64) * s[:, None]).T]
def torch_impl(x, w, s):
    return [x @ (w.half() * s[:, None]).T]
