"""Log-softmax via topi.nn.log_softmax over the vocab, fp32, rows 16 x vocab 32000 (Llama-2 sampling)."""
import numpy as np
from tvm import te, topi
R, V = 16, 32000
SMALL = dict(R=3, V=100)
def make():
    x = te.placeholder((R, V), "float32", name="logits")
    return te.create_prim_func([x, topi.nn.log_softmax(x, axis=-1)])
def inputs(rng):
    return [(rng.standard_normal((R, V)) * 4).astype(np.float32)]
def reference(x):
    m = x.max(-1, keepdims=True); return [x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))]
def torch_impl(x):
    import torch
    return [torch.log_softmax(x, -1)]
