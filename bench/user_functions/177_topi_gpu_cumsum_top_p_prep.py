"""Top-p (nucleus) sampling preparation on already-sorted probabilities: topi.gpu.cumsum over the vocab (a scan, the CUDA form Relax DispatchSortScan picks) then the keep mask probs where cumsum - p < top_p else 0, fp32, B=8 x vocab 32000 (Llama-2 sampler)."""
import numpy as np
import tvm
from tvm import te, topi
B, V = 8, 32000
SMALL = dict(B=3, V=37)
TOP_P = 0.9
def make():
    p = te.placeholder((B, V), "float32", name="sorted_probs")
    with tvm.target.Target("cuda"):
        c = topi.gpu.cumsum(p, axis=1)
    keep = te.compute((B, V), lambda b, v: te.if_then_else(c[b, v] - p[b, v] < TOP_P, p[b, v], te.const(0, "float32")), name="keep")
    return te.create_prim_func([p, keep])
def inputs(rng):
    s = rng.standard_normal((B, V)) * 3
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [-np.sort(-p, axis=-1).astype(np.float32)]
def reference(p):
    c = np.cumsum(p, -1)
    return [np.where(c - p < TOP_P, p, 0.0)]
def torch_impl(p):
    import torch
    c = torch.cumsum(p, -1)
    return [torch.where(c - p < TOP_P, p, torch.zeros_like(p))]
