"""Rotary embedding (rotate-half, NeoX/Llama style) with cos/sin of pos*theta^(-2i/D) computed inline, TE, fp16, q [B,S,H,D] B=1 S=2048 H=32 D=128, position offset 0."""
import numpy as np
from tvm import te
B, S, H, D = 1, 2048, 32, 128
SMALL = dict(S=5, H=2, D=16)
THETA = 10000.0
def make():
    q = te.placeholder((B, S, H, D), "float16", name="q")
    half = D // 2
    def f(b, s, h, d):
        i = d % half
        ang = s.astype("float32") * te.power(THETA, (i * 2).astype("float32") * (-1.0 / D))
        c, sn = te.cos(ang), te.sin(ang)
        x = q[b, s, h, d].astype("float32")
        rot = te.if_then_else(d < half, -q[b, s, h, d + half].astype("float32"), q[b, s, h, d - half].astype("float32"))
        return (x * c + rot * sn).astype("float16")
    return te.create_prim_func([q, te.compute((B, S, H, D), f, name="rope")])
def inputs(rng):
    return [rng.standard_normal((B, S, H, D)).astype(np.float32)]
def reference(q):
    half = D // 2
    inv = THETA ** (-np.arange(0, D, 2) / D)
    ang = np.arange(S)[:, None] * inv[None]
    c = np.concatenate([np.cos(ang)] * 2, -1)[None, :, None]; s = np.concatenate([np.sin(ang)] * 2, -1)[None, :, None]
    rot = np.concatenate([-q[..., half:], q[..., :half]], -1)
    return [q * c + rot * s]
def torch_impl(q):
    import torch
    half = D // 2
    inv = THETA ** (-torch.arange(0, D, 2, device=q.device).float() / D)
    ang = torch.arange(S, device=q.device).float()[:, None] * inv[None]
    c = torch.cat([ang.cos()] * 2, -1)[None, :, None]; s = torch.cat([ang.sin()] * 2, -1)[None, :, None]
    rot = torch.cat([-q[..., half:], q[..., :half]], -1)
    return [(q.float() * c + rot.float() * s).to(q.dtype)]
