"""Sentence embedding: attention-mask-weighted mean over the sequence (sum x*mask / max(sum mask, 1e-9)) then L2 normalization over H, TE, fp16 hidden -> fp32, int32 mask [B,S], B=64 S=128 H=384 (all-MiniLM-L6-v2)."""
import numpy as np
from tvm import te
B, S, H = 64, 128, 384
SMALL = dict(B=3, S=7, H=16)
def make():
    x = te.placeholder((B, S, H), "float16", name="last_hidden_state")
    m = te.placeholder((B, S), "int32", name="attention_mask")
    s = te.reduce_axis((0, S), name="s")
    num = te.compute((B, H), lambda b, h: te.sum(x[b, s, h].astype("float32") * m[b, s].astype("float32"), axis=s), name="num")
    s2 = te.reduce_axis((0, S), name="s2")
    den = te.compute((B,), lambda b: te.sum(m[b, s2].astype("float32"), axis=s2), name="den")
    emb = te.compute((B, H), lambda b, h: num[b, h] / te.max(den[b], te.const(1e-9, "float32")), name="emb")
    h2 = te.reduce_axis((0, H), name="h2")
    sq = te.compute((B,), lambda b: te.sum(emb[b, h2] * emb[b, h2], axis=h2), name="sq")
    out = te.compute((B, H), lambda b, h: emb[b, h] / te.max(te.sqrt(sq[b]), te.const(1e-12, "float32")), name="out")
    return te.create_prim_func([x, m, out])
def inputs(rng):
    lens = rng.integers(1, S + 1, (B,))
    return [rng.standard_normal((B, S, H)).astype(np.float32), (np.arange(S)[None] < lens[:, None]).astype(np.int32)]
def reference(x, m):
    mf = m.astype(np.float64)[..., None]
    e = (x * mf).sum(1) / np.maximum(mf.sum(1), 1e-9)
    return [e / np.maximum(np.linalg.norm(e, axis=-1, keepdims=True), 1e-12)]
def torch_impl(x, m):
    import torch
    mf = m[..., None].float()
    e = (x.float() * mf).sum(1) / mf.sum(1).clamp(min=1e-9)
    return [torch.nn.functional.normalize(e, dim=-1)]
