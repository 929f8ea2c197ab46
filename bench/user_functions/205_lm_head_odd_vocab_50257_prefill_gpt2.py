"""LM head at prefill over an odd vocab N=50257 (= 29 x 1733, the tied wte [V,K] as weight): logits = h @ wte^T in fp32 accumulation and fp32 logits (HF .float() before the loss), TE explicit casts, bf16 operands, M=4096 (B=4 x S=1024) K=768 (GPT-2 small lm_head)."""
import numpy as np
from tvm import te
M, K, V = 4096, 768, 50257
SMALL = dict(M=9, K=64, V=97)
def make():
    h = te.placeholder((M, K), "bfloat16", name="h")
    wte = te.placeholder((V, K), "bfloat16", name="wte")
    k = te.reduce_axis((0, K), name="k")
    logits = te.compute((M, V), lambda m, v: te.sum(h[m, k].astype("float32") * wte[v, k].astype("float32"), axis=k), name="logits")
    return te.create_prim_func([h, wte, logits])
def inputs(rng):
    return [rng.standard_normal((M, K)).astype(np.float32), (rng.standard_normal((V, K)) * 0.02).astype(np.float32)]
def reference(h, wte):
    return [h @ wte.T]
def torch_impl(h, wte):
    import torch
    return [torch.nn.functional.linear(h, wte).float()]
