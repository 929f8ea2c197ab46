"""Rotary embedding applied to q and k (two outputs) from cos/sin tables [S,D] (HF apply_rotary_pos_emb), TE, bf16, q [B,H,S,D] H=32, k Hkv=8, B=1 S=4096 D=128."""
import numpy as np
from tvm import te
B, H, HKV, S, D = 1, 32, 8, 4096, 128
SMALL = dict(H=2, HKV=1, S=5, D=16)
def make():
    q = te.placeholder((B, H, S, D), "bfloat16", name="q")
    k = te.placeholder((B, HKV, S, D), "bfloat16", name="k")
    cos = te.placeholder((S, D), "bfloat16", name="cos")
    sin = te.placeholder((S, D), "bfloat16", name="sin")
    half = D // 2
    def rope(t):
        def f(b, h, s, d):
            rot = te.if_then_else(d < half, -t[b, h, s, d + half], t[b, h, s, d - half])
            return t[b, h, s, d] * cos[s, d] + rot * sin[s, d]
        return f
    qo = te.compute((B, H, S, D), rope(q), name="q_rot")
    ko = te.compute((B, HKV, S, D), rope(k), name="k_rot")
    return te.create_prim_func([q, k, cos, sin, qo, ko])
def inputs(rng):
    inv = 10000.0 ** (-np.arange(0, D, 2) / D)
    ang = np.arange(S)[:, None] * inv[None]
    emb = np.concatenate([ang, ang], -1)
    return [rng.standard_normal((B, H, S, D)).astype(np.float32), rng.standard_normal((B, HKV, S, D)).astype(np.float32),
            np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)]
def _bf16(a):
    f = np.asarray(a, np.float32); u = f.view(np.uint32)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return u.view(np.float32).astype(np.float64)
def reference(q, k, cos, sin):
    half = D // 2
    def r(t):
        rot = np.concatenate([-t[..., half:], t[..., :half]], -1)
        return _bf16(t * cos) + _bf16(rot * sin)  # bf16 arithmetic as written: each product rounded
    return [r(q), r(k)]
def torch_impl(q, k, cos, sin):
    import torch
    half = D // 2
    rh = lambda t: torch.cat([-t[..., half:], t[..., :half]], -1)
    return [q * cos + rh(q) * sin, k * cos + rh(k) * sin]
