"""Per-token cross-entropy loss: logsumexp(logits) - logits[label], int32 labels gathered, TE, fp16 logits -> fp32 loss, rows 1021 x vocab 50257 (GPT-2)."""
import numpy as np
from tvm import te
R, V = 1021, 50257
SMALL = dict(R=5, V=97)
def make():
    x = te.placeholder((R, V), "float16", name="logits")
    y = te.placeholder((R,), "int32", name="labels")
    k = te.reduce_axis((0, V), name="k")
    m = te.compute((R,), lambda i: te.max(x[i, k].astype("float32"), axis=k), name="m")
    k2 = te.reduce_axis((0, V), name="k2")
    s = te.compute((R,), lambda i: te.sum(te.exp(x[i, k2].astype("float32") - m[i]), axis=k2), name="s")
    o = te.compute((R,), lambda i: te.log(s[i]) + m[i] - x[i, y[i]].astype("float32"), name="loss")
    return te.create_prim_func([x, y, o])
def inputs(rng):
    return [(rng.standard_normal((R, V)) * 3).astype(np.float32), rng.integers(0, V, (R,)).astype(np.int32)]
def reference(x, y):
    m = x.max(-1)
    lse = np.log(np.exp(x - m[:, None]).sum(-1)) + m
    return [lse - x[np.arange(R), y.astype(np.int64)]]
def torch_impl(x, y):
    import torch
    return [torch.nn.functional.cross_entropy(x.float(), y.long(), reduction="none")]
