"""Plain cast fp32 -> bf16, topi.cast, [4096, 4096]."""
import numpy as np
from tvm import te, topi
R, C = 4096, 4096
SMALL = dict(R=3, C=16)
def make():
    x = te.placeholder((R, C), "float32", name="x")
    return te.create_prim_func([x, topi.cast(x, "bfloat16")])
def inputs(rng):
    return [rng.standard_normal((R, C)).astype(np.float32)]
def reference(x):
    return [x]
def torch_impl(x):
    import torch
    return [x.to(torch.bfloat16)]
