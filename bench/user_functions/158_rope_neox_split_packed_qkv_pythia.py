"""GPT-NeoX split of the packed qkv projection [B,S,H*3*D] (per head q|k|v) into q,k,v [B,H,S,D] with partial rotate-half RoPE (rotary_pct 0.25: first 32 of 128 dims) on q and k from fp32 cos/sin tables [S,32], TE, fp16, B=2 S=2048 H=16 D=128 (Pythia-1.4B)."""
import numpy as np
from tvm import te
B, S, H, D, RD = 2, 2048, 16, 128, 32
SMALL = dict(B=1, S=5, H=2, D=16, RD=8)
def make():
    qkv = te.placeholder((B, S, H * 3 * D), "float16", name="qkv")
    cos = te.placeholder((S, RD), "float32", name="cos")
    sin = te.placeholder((S, RD), "float32", name="sin")
    half = RD // 2
    def rope(which):
        def f(b, h, s, d):
            base = h * 3 * D + which * D
            x = qkv[b, s, base + d].astype("float32")
            rot = te.if_then_else(d < half, -qkv[b, s, base + d + half].astype("float32"),
                                  qkv[b, s, base + d - half].astype("float32"))
            return te.if_then_else(d < RD, x * cos[s, d] + rot * sin[s, d], x).astype("float16")
        return f
    q = te.compute((B, H, S, D), rope(0), name="q_rot")
    k = te.compute((B, H, S, D), rope(1), name="k_rot")
    v = te.compute((B, H, S, D), lambda b, h, s, d: qkv[b, s, h * 3 * D + 2 * D + d], name="v")
    return te.create_prim_func([qkv, cos, sin, q, k, v])
def _tables():
    inv = 10000.0 ** (-np.arange(0, RD, 2) / RD)
    ang = np.arange(S)[:, None] * inv[None]
    ang = np.concatenate([ang, ang], -1)
    return np.cos(ang), np.sin(ang)
def inputs(rng):
    c, s = _tables()
    return [rng.standard_normal((B, S, H * 3 * D)).astype(np.float32), c.astype(np.float32), s.astype(np.float32)]
def reference(qkv, cos, sin):
    x = qkv.reshape(B, S, H, 3 * D).transpose(0, 2, 1, 3)
    q, k, v = x[..., :D], x[..., D:2 * D], x[..., 2 * D:]
    def rot(t):
        r, p = t[..., :RD], t[..., RD:]
        rh = np.concatenate([-r[..., RD // 2:], r[..., :RD // 2]], -1)
        return np.concatenate([r * cos + rh * sin, p], -1)
    return [rot(q), rot(k), v]
def torch_impl(qkv, cos, sin):
    import torch
    x = qkv.view(B, S, H, 3 * D).permute(0, 2, 1, 3)
    q, k, v = x.split(D, dim=-1)
    def rot(t):
        r, p = t[..., :RD].float(), t[..., RD:]
        rh = torch.cat([-r[..., RD // 2:], r[..., :RD // 2]], -1)
        return torch.cat([(r * cos + rh * sin).to(t.dtype), p], -1)
    return [rot(q), rot(k), v.contiguous()]
