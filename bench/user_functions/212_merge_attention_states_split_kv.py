"""Merging split-KV attention partials (flash-decoding's second pass, FlashInfer merge_states layout): partial outputs v [N,P,H,D] fp16 and their log-sum-exps s [N,P,H] fp32, m = max over P, w = exp(s - m), merged v = sum w v / sum w (fp16) and merged s = m + log(sum w) (fp32), two outputs, reductions over the middle axis P, TE, N=128 tokens P=16 splits H=32 D=128 (Llama-2-7B long-context decode)."""
import numpy as np
from tvm import te
N, P, H, D = 128, 16, 32, 128
SMALL = dict(N=3, P=5, H=2, D=8)
def make():
    v = te.placeholder((N, P, H, D), "float16", name="v")
    s = te.placeholder((N, P, H), "float32", name="s")
    p1 = te.reduce_axis((0, P), name="p1")
    m = te.compute((N, H), lambda n, h: te.max(s[n, p1, h], axis=p1), name="m")
    w = te.compute((N, P, H), lambda n, p, h: te.exp(s[n, p, h] - m[n, h]), name="w")
    p2 = te.reduce_axis((0, P), name="p2")
    den = te.compute((N, H), lambda n, h: te.sum(w[n, p2, h], axis=p2), name="den")
    p3 = te.reduce_axis((0, P), name="p3")
    num = te.compute((N, H, D), lambda n, h, d: te.sum(w[n, p3, h] * v[n, p3, h, d].astype("float32"), axis=p3), name="num")
    vm = te.compute((N, H, D), lambda n, h, d: (num[n, h, d] / den[n, h]).astype("float16"), name="v_merged")
    sm = te.compute((N, H), lambda n, h: m[n, h] + te.log(den[n, h]), name="s_merged")
    return te.create_prim_func([v, s, vm, sm])
def inputs(rng):
    return [rng.standard_normal((N, P, H, D)).astype(np.float32), (rng.standard_normal((N, P, H)) * 3 + 5).astype(np.float32)]
def reference(v, s):
    m = s.max(1, keepdims=True); w = np.exp(s - m); den = w.sum(1)
    return [(w[..., None] * v).sum(1) / den[..., None], m[:, 0] + np.log(den)]
def torch_impl(v, s):
    import torch
    lse = torch.logsumexp(s, 1)
    w = torch.exp(s - lse[:, None])
    return [(w[..., None] * v.float()).sum(1).half(), lse]
