"""Greedy sampling: topi.argmax over the vocab axis of fp32 logits [B, 128256] -> int32 token ids [B] (Llama-3 vocab), B=8."""
import numpy as np
from tvm import te, topi
B, V = 8, 128256
SMALL = dict(B=3, V=1001)
def make():
    x = te.placeholder((B, V), "float32", name="logits")
    return te.create_prim_func([x, topi.argmax(x, axis=-1)])
def inputs(rng):
    return [rng.standard_normal((B, V)).astype(np.float32)]
def reference(x):
    return [x.argmax(-1)]
def torch_impl(x):
    import torch
    return [x.argmax(-1).int()]
