"""Relax R.nn.attention at decode: q [B,1,H,D], k/v [B,L,H,D] (KV cache in BSHD), no mask, LegalizeOps -> PrimFunc, fp16, B=4 L=4096 H=32 D=128 (Llama-2-7B decode step)."""
import numpy as np
import tvm
from tvm import relax, tirx
B, L, H, D = 4, 4096, 32, 128
SMALL = dict(B=2, L=16, H=2, D=16)
def make():
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((B, 1, H, D), "float16"))
    k = relax.Var("k", relax.TensorType((B, L, H, D), "float16"))
    v = relax.Var("v", relax.TensorType((B, L, H, D), "float16"))
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            o = bb.emit_output(relax.op.nn.attention(q, k, v))
        bb.emit_func_output(o)
    mod = relax.transform.LegalizeOps()(bb.get())
    return [f for g, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)][0]
def inputs(rng):
    return [rng.standard_normal((B, 1, H, D)).astype(np.float32), rng.standard_normal((B, L, H, D)).astype(np.float32),
            rng.standard_normal((B, L, H, D)).astype(np.float32)]
def reference(q, k, v):
    q, k, v = [a.transpose(0, 2, 1, 3) for a in (q, k, v)]
    s = q @ k.swapaxes(-1, -2) / np.sqrt(D)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [(p @ v).transpose(0, 2, 1, 3)]
def torch_impl(q, k, v):
    import torch
    t = lambda a: a.transpose(1, 2)
    return [t(torch.nn.functional.scaled_dot_product_attention(t(q), t(k), t(v)))]
