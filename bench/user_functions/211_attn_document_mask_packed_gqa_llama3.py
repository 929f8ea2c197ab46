"""Packed-sequence pretraining attention with document masking: causal and same document, j <= i and doc_ids[b, i] == doc_ids[b, j] (int32 [B,S] segment ids from the packer) via te.if_then_else, GQA, [B,H,S,D], TE explicit fp32 casts, bf16, B=1 Hq=32 Hkv=8 S=4096 D=128 (Llama-3-8B pretraining with intra-document masking)."""
import numpy as np
from tvm import te, topi
B, HQ, HKV, S, D = 1, 32, 8, 4096, 128
SMALL = dict(B=2, HQ=4, HKV=2, S=17, D=16)
def make():
    G = HQ // HKV
    q = te.placeholder((B, HQ, S, D), "bfloat16", name="q")
    k = te.placeholder((B, HKV, S, D), "bfloat16", name="k")
    v = te.placeholder((B, HKV, S, D), "bfloat16", name="v")
    doc = te.placeholder((B, S), "int32", name="doc_ids")
    d = te.reduce_axis((0, D), name="d")
    sc = te.compute((B, HQ, S, S), lambda b, h, i, j: te.sum(q[b, h, i, d].astype("float32") * k[b, h // G, j, d].astype("float32"), axis=d), name="scores")
    ms = te.compute((B, HQ, S, S), lambda b, h, i, j: te.if_then_else(te.all(j <= i, doc[b, i] == doc[b, j]), sc[b, h, i, j] * float(D ** -0.5), -1e30), name="masked")
    p = topi.cast(topi.nn.softmax(ms, axis=-1), "bfloat16")
    j = te.reduce_axis((0, S), name="j")
    o = te.compute((B, HQ, S, D), lambda b, h, i, c: te.sum(p[b, h, i, j].astype("float32") * v[b, h // G, j, c].astype("float32"), axis=j), name="o")
    return te.create_prim_func([q, k, v, doc, topi.cast(o, "bfloat16")])
def inputs(rng):
    doc = np.zeros((B, S), np.int32)
    for b in range(B):
        cuts = np.sort(rng.choice(np.arange(1, S), size=min(3, S - 1), replace=False))
        for c in cuts:
            doc[b, c:] += 1
    return [rng.standard_normal((B, HQ, S, D)).astype(np.float32), rng.standard_normal((B, HKV, S, D)).astype(np.float32),
            rng.standard_normal((B, HKV, S, D)).astype(np.float32), doc]
def reference(q, k, v, doc):
    G = HQ // HKV; k = np.repeat(k, G, 1); v = np.repeat(v, G, 1)
    s = q @ k.swapaxes(-1, -2) / np.sqrt(D)
    mask = np.tril(np.ones((S, S), bool))[None] & (doc[:, :, None] == doc[:, None, :])
    s = np.where(mask[:, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [p @ v]
def torch_impl(q, k, v, doc):
    import torch
    mask = torch.ones(S, S, dtype=torch.bool, device=q.device).tril()[None] & (doc[:, :, None] == doc[:, None, :])
    return [torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], enable_gqa=True)]
