"""Per-token dynamic int8 quantization (SmoothQuant / vLLM scaled_int8_quant): scale = max|x| / 127 per row, q = clamp(round(x / scale), -128, 127) as int8, two outputs (q, fp32 scale), TE, fp16 input, rows 4096 x H=4096 (Llama-2-7B activations)."""
import numpy as np
from tvm import te
R, H = 4096, 4096
SMALL = dict(R=5, H=64)
def make():
    x = te.placeholder((R, H), "float16", name="x")
    k = te.reduce_axis((0, H), name="k")
    amax = te.compute((R,), lambda i: te.max(te.abs(x[i, k].astype("float32")), axis=k), name="amax")
    scale = te.compute((R,), lambda i: te.max(amax[i], te.const(1e-8, "float32")) / 127.0, name="scale")
    q = te.compute((R, H), lambda i, j: te.max(te.min(te.round(x[i, j].astype("float32") / scale[i]), te.const(127.0, "float32")),
                                               te.const(-128.0, "float32")).astype("int8"), name="q")
    return te.create_prim_func([x, q, scale])
def inputs(rng):
    return [(rng.standard_normal((R, H)) * rng.uniform(0.1, 5, (R, 1))).astype(np.float32)]
def reference(x):
    # q in fp32 as the kernel divides (an int8 output must match exactly: a float64 quotient
    # could round the other way at a half), the scale in float64
    s = np.maximum(np.abs(x).max(-1), 1e-8) / 127.0
    x32, s32 = x.astype(np.float32), s.astype(np.float32)
    return [np.clip(np.round(x32 / s32[:, None]), -128, 127), s]
def torch_impl(x):
    import torch
    s = x.float().abs().amax(-1).clamp(min=1e-8) / 127.0
    return [torch.round(x.float() / s[:, None]).clamp(-128, 127).to(torch.int8), s]
