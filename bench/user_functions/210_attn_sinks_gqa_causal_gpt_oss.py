"""Attention with learned sinks (gpt-oss): per-head sink logit sinks [Hq] joins each row's softmax (m = max(row max, sink), p = exp(s - m) / (sum exp(s - m) + exp(sink - m)), the sink column dropped), causal, GQA, scale 1/8, TE explicit fp32 casts, bf16, B=1 Hq=64 Hkv=8 S=4096 D=64 (gpt-oss-20b full-attention layers)."""
import numpy as np
from tvm import te, topi
B, HQ, HKV, S, D = 1, 64, 8, 4096, 64
SMALL = dict(B=1, HQ=4, HKV=2, S=13, D=16)
def make():
    G = HQ // HKV
    q = te.placeholder((B, HQ, S, D), "bfloat16", name="q")
    k = te.placeholder((B, HKV, S, D), "bfloat16", name="k")
    v = te.placeholder((B, HKV, S, D), "bfloat16", name="v")
    sink = te.placeholder((HQ,), "bfloat16", name="sinks")
    d = te.reduce_axis((0, D), name="d")
    sc = te.compute((B, HQ, S, S), lambda b, h, i, j: te.sum(q[b, h, i, d].astype("float32") * k[b, h // G, j, d].astype("float32"), axis=d), name="scores")
    ms = te.compute((B, HQ, S, S), lambda b, h, i, j: te.if_then_else(j <= i, sc[b, h, i, j] * float(D ** -0.5), -1e30), name="masked")
    j1 = te.reduce_axis((0, S), name="j1")
    rmax = te.compute((B, HQ, S), lambda b, h, i: te.max(ms[b, h, i, j1], axis=j1), name="row_max")
    m = te.compute((B, HQ, S), lambda b, h, i: te.max(rmax[b, h, i], sink[h].astype("float32")), name="max_with_sink")
    e = te.compute((B, HQ, S, S), lambda b, h, i, j: te.exp(ms[b, h, i, j] - m[b, h, i]), name="e")
    j2 = te.reduce_axis((0, S), name="j2")
    se = te.compute((B, HQ, S), lambda b, h, i: te.sum(e[b, h, i, j2], axis=j2), name="row_sum")
    den = te.compute((B, HQ, S), lambda b, h, i: se[b, h, i] + te.exp(sink[h].astype("float32") - m[b, h, i]), name="den")
    p = te.compute((B, HQ, S, S), lambda b, h, i, j: (e[b, h, i, j] / den[b, h, i]).astype("bfloat16"), name="probs")
    j = te.reduce_axis((0, S), name="j")
    o = te.compute((B, HQ, S, D), lambda b, h, i, c: te.sum(p[b, h, i, j].astype("float32") * v[b, h // G, j, c].astype("float32"), axis=j), name="o")
    return te.create_prim_func([q, k, v, sink, topi.cast(o, "bfloat16")])
def inputs(rng):
    return [rng.standard_normal((B, HQ, S, D)).astype(np.float32) * 2, rng.standard_normal((B, HKV, S, D)).astype(np.float32) * 2,
            rng.standard_normal((B, HKV, S, D)).astype(np.float32), rng.uniform(-1, 4, (HQ,)).astype(np.float32)]
def reference(q, k, v, sink):
    G = HQ // HKV; k = np.repeat(k, G, 1); v = np.repeat(v, G, 1)
    s = q @ k.swapaxes(-1, -2) / np.sqrt(D)
    s = np.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
    sk = np.broadcast_to(sink[None, :, None, None], s.shape[:-1] + (1,))
    c = np.concatenate([s, sk], -1)
    p = np.exp(c - c.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [p[..., :-1] @ v]
def torch_impl(q, k, v, sink):
    import torch
    G = HQ // HKV; k = k.repeat_interleave(G, 1); v = v.repeat_interleave(G, 1)
    s = (q @ k.transpose(-1, -2)).float() * D ** -0.5
    s = s.masked_fill(~torch.ones(S, S, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    c = torch.cat([s, sink.float().reshape(1, -1, 1, 1).expand(B, HQ, S, 1)], -1)
    p = torch.softmax(c - c.max(-1, keepdim=True).values, -1)[..., :-1]
    return [p.to(q.dtype) @ v]
