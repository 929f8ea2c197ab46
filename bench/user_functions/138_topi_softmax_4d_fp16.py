"""Standalone attention-probability softmax topi.nn.softmax(axis=-1) on 4-D scores [B,H,S,S], fp16 in/out with TOPI's fp16 internals, B=1 H=32 S=2048 (Llama-2-7B unfused attention)."""
import numpy as np
from tvm import te, topi
B, H, S = 1, 32, 2048
SMALL = dict(B=1, H=2, S=9)
def make():
    s = te.placeholder((B, H, S, S), "float16", name="scores")
    return te.create_prim_func([s, topi.nn.softmax(s, axis=-1)])
def inputs(rng):
    return [rng.standard_normal((B, H, S, S)).astype(np.float32) * 3]
def reference(s):
    p = np.exp(s - s.max(-1, keepdims=True)); return [p / p.sum(-1, keepdims=True)]
def torch_impl(s):
    import torch
    return [torch.softmax(s, -1)]
