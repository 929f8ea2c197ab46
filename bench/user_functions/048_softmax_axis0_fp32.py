"""Softmax over a NON-last axis (axis 0, columns), topi.nn.softmax(axis=0), fp32, [2048, 1024]."""
import numpy as np
from tvm import te, topi
R, C = 2048, 1024
SMALL = dict(R=17, C=8)
def make():
    x = te.placeholder((R, C), "float32", name="x")
    return te.create_prim_func([x, topi.nn.softmax(x, axis=0)])
def inputs(rng):
    return [(rng.standard_normal((R, C)) * 3).astype(np.float32)]
def reference(x):
    p = np.exp(x - x.max(0, keepdims=True)); return [p / p.sum(0, keepdims=True)]
def torch_impl(x):
    import torch
    return [torch.softmax(x, 0)]
