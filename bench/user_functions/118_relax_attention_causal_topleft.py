"""Relax R.nn.attention(q, k, v, causal_mask='TopLeft') in [B,S,H,D], LegalizeOps -> PrimFunc (trilu mask, fp16 softmax), fp16, B=1 S=2048 H=32 D=128 (Mistral-7B prefill)."""
import numpy as np
import tvm
from tvm import relax, tirx
B, S, H, D = 1, 2048, 32, 128
SMALL = dict(B=1, S=16, H=2, D=16)
def make():
    bb = relax.BlockBuilder()
    q, k, v = [relax.Var(nm, relax.TensorType((B, S, H, D), "float16")) for nm in "qkv"]
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            o = bb.emit_output(relax.op.nn.attention(q, k, v, causal_mask="TopLeft"))
        bb.emit_func_output(o)
    mod = relax.transform.LegalizeOps()(bb.get())
    return [f for g, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)][0]
def inputs(rng):
    return [rng.standard_normal((B, S, H, D)).astype(np.float32) for _ in range(3)]
def reference(q, k, v):
    q, k, v = [a.transpose(0, 2, 1, 3) for a in (q, k, v)]
    s = q @ k.swapaxes(-1, -2) / np.sqrt(D)
    s = np.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [(p @ v).transpose(0, 2, 1, 3)]
def torch_impl(q, k, v):
    import torch
    t = lambda a: a.transpose(1, 2)
    return [t(torch.nn.functional.scaled_dot_product_attention(t(q), t(k), t(v), is_causal=True))]
