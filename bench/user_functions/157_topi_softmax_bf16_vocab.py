"""Sampling softmax via topi.nn.softmax on bf16 logits (TOPI keeps max/exp/sum in bf16), rows 4 x vocab 128256 (Llama-3)."""
import numpy as np
from tvm import te, topi
R, V = 4, 128256
SMALL = dict(R=3, V=1001)
def make():
    x = te.placeholder((R, V), "bfloat16", name="logits")
    return te.create_prim_func([x, topi.nn.softmax(x, axis=-1)])
def inputs(rng):
    return [rng.standard_normal((R, V)).astype(np.float32) * 4]
def reference(x):
    p = np.exp(x - x.max(-1, keepdims=True)); return [p / p.sum(-1, keepdims=True)]
def torch_impl(x):
    import torch
    return [torch.softmax(x, -1)]
