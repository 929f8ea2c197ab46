"""Reduction over a NON-last axis: mean pooling over the sequence [B,S,H] -> [B,H] (sentence embeddings), TE fp32 accum, fp16, B=8 S=512 H=768."""
import numpy as np
from tvm import te
B, S, Hd = 8, 512, 768
SMALL = dict(B=2, S=5, Hd=8)
def make():
    x = te.placeholder((B, S, Hd), "float16", name="x")
    s = te.reduce_axis((0, S), name="s")
    acc = te.compute((B, Hd), lambda b, h: te.sum(x[b, s, h].astype("float32"), axis=s), name="acc")
    return te.create_prim_func([x, te.compute((B, Hd), lambda b, h: (acc[b, h] / S).astype("float16"), name="mean")])
def inputs(rng):
    return [rng.standard_normal((B, S, Hd)).astype(np.float32)]
def reference(x):
    return [x.mean(1)]
def torch_impl(x):
    return [x.mean(1)]
