"""FP8 rowwise GEMM with the weight stored [K,N] (x @ W, no transpose): float8_e4m3fn x [M,K] and W [K,N], fp32 sum, * per-token scale [M] * per-channel scale [N] (fp32) -> bf16, TE, M=512 K=8192 N=28672 (Llama-3-70B FP8-dynamic up_proj)."""
import numpy as np
from tvm import te
M, K, N = 512, 8192, 28672
SMALL = dict(M=17, K=64, N=40)
def make():
    x = te.placeholder((M, K), "float8_e4m3fn", name="x")
    w = te.placeholder((K, N), "float8_e4m3fn", name="w")
    sx = te.placeholder((M,), "float32", name="x_scale")
    sw = te.placeholder((N,), "float32", name="w_scale")
    k = te.reduce_axis((0, K), name="k")
    acc = te.compute((M, N), lambda i, j: te.sum(x[i, k].astype("float32") * w[k, j].astype("float32"), axis=k), name="acc")
    return te.create_prim_func([x, w, sx, sw, te.compute((M, N), lambda i, j: (acc[i, j] * sx[i] * sw[j]).astype("bfloat16"), name="y")])
def inputs(rng):
    return [rng.uniform(-8, 8, (M, K)).astype(np.float32), rng.uniform(-8, 8, (K, N)).astype(np.float32),
            rng.uniform(0.005, 0.02, (M,)).astype(np.float32), (rng.uniform(0.5, 1.5, (N,)) / np.sqrt(K) / 8).astype(np.float32)]
def reference(x, w, sx, sw):
    return [(x @ w) * sx[:, None] * sw[None, :]]
def torch_impl(x, w, sx, sw):
    import torch
    return [((x.float() @ w.float()) * sx[:, None] * sw[None, :]).to(torch.bfloat16)]
