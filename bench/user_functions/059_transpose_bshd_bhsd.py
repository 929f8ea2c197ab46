"""Transpose [B,S,H,D] -> [B,H,S,D] (HF view+transpose before SDPA), topi.transpose, fp16, B=1 S=2048 H=32 D=128."""
import numpy as np
from tvm import te, topi
B, S, H, D = 1, 2048, 32, 128
SMALL = dict(S=3, H=2, D=8)
def make():
    x = te.placeholder((B, S, H, D), "float16", name="x")
    return te.create_prim_func([x, topi.transpose(x, [0, 2, 1, 3])])
def inputs(rng):
    return [rng.standard_normal((B, S, H, D)).astype(np.float32)]
def reference(x):
    return [x.transpose(0, 2, 1, 3)]
def torch_impl(x):
    return [x.transpose(1, 2).contiguous()]
