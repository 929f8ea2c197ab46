"""Sampling preparation: per-request temperature scaling of fp16 logits (cast to fp32, / temperature[b]) then topi.nn.softmax over the vocab, fp32 probs, B=8 x vocab 151936 (Qwen2-7B, vLLM sampler)."""
import numpy as np
from tvm import te, topi
B, V = 8, 151936
SMALL = dict(B=3, V=101)
def make():
    logits = te.placeholder((B, V), "float16", name="logits")
    temp = te.placeholder((B,), "float32", name="temperature")
    scaled = te.compute((B, V), lambda b, v: logits[b, v].astype("float32") / temp[b], name="scaled")
    return te.create_prim_func([logits, temp, topi.nn.softmax(scaled, axis=-1)])
def inputs(rng):
    return [(rng.standard_normal((B, V)) * 4).astype(np.float32), rng.uniform(0.3, 1.5, (B,)).astype(np.float32)]
def reference(x, t):
    s = x / t[:, None]
    p = np.exp(s - s.max(-1, keepdims=True))
    return [p / p.sum(-1, keepdims=True)]
def torch_impl(x, t):
    import torch
    return [torch.softmax(x.float() / t[:, None], dim=-1)]
