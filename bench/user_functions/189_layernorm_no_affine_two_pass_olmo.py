"""Non-parametric LayerNorm (no weight, no bias: OLMo-7B), two-pass as written in a textbook: fp32 row sum, centered x - sum/H, then the sum of squared deviations, (x - mean) * rsqrt(var + 1e-5), TE, bf16 in/out, rows 4096 (B=2 x S=2048) x H=4096."""
import numpy as np
from tvm import te
R, H = 4096, 4096
SMALL = dict(R=6, H=80)
def make():
    x = te.placeholder((R, H), "bfloat16", name="x")
    k1 = te.reduce_axis((0, H), name="k1")
    k2 = te.reduce_axis((0, H), name="k2")
    total = te.compute((R,), lambda i: te.sum(x[i, k1].astype("float32"), axis=k1), name="total")
    dev = te.compute((R, H), lambda i, j: x[i, j].astype("float32") - total[i] / H, name="centered")
    sq = te.compute((R,), lambda i: te.sum(dev[i, k2] * dev[i, k2], axis=k2), name="sq_dev")
    y = te.compute((R, H), lambda i, j: (dev[i, j] * te.rsqrt(sq[i] / H + 1e-5)).astype("bfloat16"), name="y")
    return te.create_prim_func([x, y])
def inputs(rng):
    return [(rng.standard_normal((R, H)) * 2 + 0.5).astype(np.float32)]
def reference(x):
    d = x - x.mean(-1, keepdims=True)
    return [d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5)]
def torch_impl(x):
    import torch
    return [torch.nn.functional.layer_norm(x.float(), (H,), eps=1e-5).to(torch.bfloat16)]
