"""W8A8 GEMM with dequant epilogue: int8 x int8 -> int32 sum, then * per-token scale [M] * per-channel scale [N] (fp32) -> fp16, TE, M=128 K=4096 N=4096 (Llama-2-7B SmoothQuant q_proj)."""
import numpy as np
from tvm import te
M, K, N = 128, 4096, 4096
SMALL = dict(M=33, K=64, N=48)
def make():
    x = te.placeholder((M, K), "int8", name="x")
    w = te.placeholder((N, K), "int8", name="w")
    sx = te.placeholder((M,), "float32", name="sx")
    sw = te.placeholder((N,), "float32", name="sw")
    k = te.reduce_axis((0, K), name="k")
    acc = te.compute((M, N), lambda i, j: te.sum(x[i, k].astype("int32") * w[j, k].astype("int32"), axis=k), name="acc")
    out = te.compute((M, N), lambda i, j: (acc[i, j].astype("float32") * sx[i] * sw[j]).astype("float16"), name="out")
    return te.create_prim_func([x, w, sx, sw, out])
def inputs(rng):
    return [rng.integers(-128, 128, (M, K)).astype(np.int8), rng.integers(-128, 128, (N, K)).astype(np.int8),
            rng.uniform(0.001, 0.01, (M,)).astype(np.float32), rng.uniform(0.001, 0.01, (N,)).astype(np.float32) / np.sqrt(K)]
def reference(x, w, sx, sw):
    return [(x.astype(np.int64) @ w.astype(np.int64).T) * sx[:, None] * sw[None, :]]
def torch_impl(x, w, sx, sw):
    import torch
    return [(torch._int_mm(x, w.t().contiguous()).float() * sx[:, None] * sw[None, :]).half()]
