"""Fused residual add + RMSNorm + static FP8 quantization for an FP8 GEMM input: h = x + r (fp16 out), y = clamp(rmsnorm(h) * w / scale, +-448) as float8_e4m3fn, TE, two outputs, rows 2048 x H=4096 (Llama-3-8B FP8, vLLM fused_add_rms_norm_static_fp8_quant)."""
import numpy as np
from tvm import te
R, H = 2048, 4096
SMALL = dict(R=5, H=64)
SCALE = 0.05
def make():
    x = te.placeholder((R, H), "float16", name="x")
    r = te.placeholder((R, H), "float16", name="residual")
    w = te.placeholder((H,), "float16", name="weight")
    h = te.compute((R, H), lambda i, j: x[i, j] + r[i, j], name="h")
    k = te.reduce_axis((0, H), name="k")
    ss = te.compute((R,), lambda i: te.sum(h[i, k].astype("float32") * h[i, k].astype("float32"), axis=k), name="ss")
    def f(i, j):
        v = h[i, j].astype("float32") * te.rsqrt(ss[i] / H + 1e-5) * w[j].astype("float32") / SCALE
        return te.max(te.min(v, te.const(448.0, "float32")), te.const(-448.0, "float32")).astype("float8_e4m3fn")
    return te.create_prim_func([x, r, w, h, te.compute((R, H), f, name="y_fp8")])
def inputs(rng):
    return [rng.standard_normal((R, H)).astype(np.float32), rng.standard_normal((R, H)).astype(np.float32),
            rng.uniform(0.5, 1.5, (H,)).astype(np.float32)]
def reference(x, r, w):
    h = (x + r).astype(np.float16).astype(np.float64)
    y = h / np.sqrt((h * h).mean(-1, keepdims=True) + 1e-5) * w / SCALE
    import ml_dtypes
    return [h, np.clip(y, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)]
def torch_impl(x, r, w):
    import torch
    h = x + r
    hf = h.float()
    y = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-5) * w.float() / SCALE
    return [h, y.clamp(-448, 448).to(torch.float8_e4m3fn)]
