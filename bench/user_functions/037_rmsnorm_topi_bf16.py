"""RMSNorm via topi.nn.rms_norm (computed in the input dtype as TOPI writes it), bf16, rows 127 (prime) x hidden 5120 (Qwen-14B)."""
import numpy as np
from tvm import te, topi
R, Hd = 127, 5120
SMALL = dict(R=5, Hd=64)
def make():
    x = te.placeholder((R, Hd), "bfloat16", name="x")
    w = te.placeholder((Hd,), "bfloat16", name="w")
    return te.create_prim_func([x, w, topi.nn.rms_norm(x, w, axis=[1], epsilon=1e-6)])
def inputs(rng):
    return [rng.standard_normal((R, Hd)).astype(np.float32), rng.uniform(0.5, 1.5, (Hd,)).astype(np.float32)]
def reference(x, w):
    return [x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w]
def torch_impl(x, w):
    import torch
    return [torch.nn.functional.rms_norm(x, (Hd,), w, 1e-6)]
