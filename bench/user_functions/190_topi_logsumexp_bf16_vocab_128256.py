"""Row logsumexp over the Llama-3 vocab (z-loss / log-prob normalizer) from TOPI ops: topi.cast to fp32, topi.max(keepdims), topi.exp of the difference, topi.sum, topi.log + the max, bf16 logits -> fp32 [rows], rows 512 x vocab 128256 (Llama-3-8B)."""
import numpy as np
from tvm import te, topi
ROWS, V = 512, 128256
SMALL = dict(ROWS=3, V=1000)
def make():
    x = te.placeholder((ROWS, V), "bfloat16", name="logits")
    xf = topi.cast(x, "float32")
    m = topi.max(xf, axis=-1, keepdims=True)
    s = topi.sum(topi.exp(topi.subtract(xf, m)), axis=-1)
    lse = topi.add(topi.log(s), topi.reshape(m, (ROWS,)))
    return te.create_prim_func([x, lse])
def inputs(rng):
    return [(rng.standard_normal((ROWS, V)) * 3).astype(np.float32)]
def reference(x):
    m = x.max(-1, keepdims=True)
    return [np.log(np.exp(x - m).sum(-1)) + m[:, 0]]
def torch_impl(x):
    import torch
    return [torch.logsumexp(x.float(), dim=-1)]
