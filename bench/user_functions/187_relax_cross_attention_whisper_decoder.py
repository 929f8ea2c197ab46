"""Relax R.nn.attention cross-attention with Sq != Skv: decoder queries q [B,Sq,H,D] attend encoder k/v [B,Skv,H,D], no mask, LegalizeOps -> the attention PrimFunc (transposes, fp16 batch_matmul, fp16 softmax as legalize writes it), fp16, B=2 Sq=448 Skv=1500 H=20 D=64 (Whisper-large-v3 decoder encoder_attn)."""
import numpy as np
from tvm import relax, tirx
B, SQ, SKV, H, D = 2, 448, 1500, 20, 64
SMALL = dict(B=1, SQ=5, SKV=11, H=2, D=16)
def make():
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((B, SQ, H, D), "float16"))
    k = relax.Var("k", relax.TensorType((B, SKV, H, D), "float16"))
    v = relax.Var("v", relax.TensorType((B, SKV, H, D), "float16"))
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            o = bb.emit_output(relax.op.nn.attention(q, k, v))
        bb.emit_func_output(o)
    mod = relax.transform.LegalizeOps()(bb.get())
    return [f for g, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)][0]
def inputs(rng):
    return [rng.uniform(-1, 1, (B, SQ, H, D)).astype(np.float32), rng.uniform(-1, 1, (B, SKV, H, D)).astype(np.float32),
            rng.uniform(-1, 1, (B, SKV, H, D)).astype(np.float32)]
def reference(q, k, v):
    q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
    s = q @ k.swapaxes(-1, -2) / np.sqrt(D)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [(p @ v).transpose(0, 2, 1, 3)]
def torch_impl(q, k, v):
    import torch
    o = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return [o.transpose(1, 2)]
