"""QK-norm (Qwen3/OLMo-2): topi.nn.rms_norm over the head dim (axis=3) of q [B,S,H,D] with weight [D], bf16 (TOPI computes in the input dtype), B=1 S=2048 H=32 D=128 (Qwen3-8B)."""
import numpy as np
from tvm import te, topi
B, S, H, D = 1, 2048, 32, 128
SMALL = dict(B=1, S=5, H=3, D=16)
def make():
    q = te.placeholder((B, S, H, D), "bfloat16", name="q")
    w = te.placeholder((D,), "bfloat16", name="w")
    y = topi.nn.rms_norm(q, w, axis=[3], epsilon=1e-6)
    return te.create_prim_func([q, w, y])
def inputs(rng):
    return [rng.standard_normal((B, S, H, D)).astype(np.float32), rng.uniform(0.5, 1.5, (D,)).astype(np.float32)]
def reference(q, w):
    return [q / np.sqrt((q * q).mean(-1, keepdims=True) + 1e-6) * w]
def torch_impl(q, w):
    import torch
    return [torch.nn.functional.rms_norm(q, (D,), w, 1e-6)]
