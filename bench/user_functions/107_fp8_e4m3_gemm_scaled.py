"""FP8 GEMM: float8_e4m3fn x float8_e4m3fn -> fp32 sum, * scale_x * scale_w (per-tensor [1] fp32), -> bf16, TE, W [N,K], M=2048 K=4096 N=4096 (Llama-3-8B FP8 checkpoint o_proj)."""
import numpy as np
from tvm import te
M, K, N = 2048, 4096, 4096
SMALL = dict(M=33, K=64, N=48)
def make():
    x = te.placeholder((M, K), "float8_e4m3fn", name="x")
    w = te.placeholder((N, K), "float8_e4m3fn", name="w")
    sx = te.placeholder((1,), "float32", name="scale_x")
    sw = te.placeholder((1,), "float32", name="scale_w")
    k = te.reduce_axis((0, K), name="k")
    y = te.compute((M, N), lambda i, j: te.sum(x[i, k].astype("float32") * w[j, k].astype("float32"), axis=k), name="y")
    o = te.compute((M, N), lambda i, j: (y[i, j] * sx[0] * sw[0]).astype("bfloat16"), name="o")
    return te.create_prim_func([x, w, sx, sw, o])
def inputs(rng):
    return [rng.uniform(-4, 4, (M, K)).astype(np.float32), rng.uniform(-4, 4, (N, K)).astype(np.float32),
            np.array([0.05], np.float32), np.array([0.05 / np.sqrt(K)], np.float32)]
def reference(x, w, sx, sw):
    return [(x @ w.T) * sx[0] * sw[0]]
def torch_impl(x, w, sx, sw):
    import torch
    return [torch._scaled_mm(x, w.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)]
