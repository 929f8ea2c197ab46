"""GPT-J rotary: interleaved pairs (2i, 2i+1) on the first rotary_dim=64 of D=256, the rest passed through, cos/sin cache [max_pos, 32] fp32 gathered by position_ids [B,S] int32, q [B,S,H,D], TE, fp16, B=1 S=2048 H=16 (GPT-J-6B)."""
import numpy as np
import tvm
from tvm import te
B, S, H, D, RD, MAXP = 1, 2048, 16, 256, 64, 2048
SMALL = dict(B=1, S=5, H=2, D=16, RD=8, MAXP=12)
def make():
    x = te.placeholder((B, S, H, D), "float16", name="q")
    cos = te.placeholder((MAXP, RD // 2), "float32", name="cos_cache")
    sin = te.placeholder((MAXP, RD // 2), "float32", name="sin_cache")
    pos = te.placeholder((B, S), "int32", name="position_ids")
    def f(b, s, h, d):
        p = pos[b, s]; i = d // 2
        xe = x[b, s, h, d - d % 2].astype("float32"); xo = x[b, s, h, d - d % 2 + 1].astype("float32")
        rot = te.if_then_else(d % 2 == 0, xe * cos[p, i] - xo * sin[p, i], xo * cos[p, i] + xe * sin[p, i])
        return te.if_then_else(d < RD, rot.astype("float16"), x[b, s, h, d])
    return te.create_prim_func([x, cos, sin, pos, te.compute((B, S, H, D), f, name="rotary")])
def inputs(rng):
    inv = 1.0 / 10000 ** (np.arange(0, RD, 2) / RD)
    ang = np.arange(MAXP)[:, None] * inv[None]
    return [rng.standard_normal((B, S, H, D)).astype(np.float32), np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32),
            rng.integers(0, MAXP, (B, S)).astype(np.int32)]
def reference(x, cos, sin, pos):
    c = cos[pos][:, :, None, :]; s_ = sin[pos][:, :, None, :]
    out = x.copy(); xe = x[..., 0:RD:2]; xo = x[..., 1:RD:2]
    out[..., 0:RD:2] = xe * c - xo * s_; out[..., 1:RD:2] = xo * c + xe * s_
    return [out]
def torch_impl(x, cos, sin, pos):
    c = cos[pos.long()][:, :, None, :]; s_ = sin[pos.long()][:, :, None, :]
    out = x.clone(); xe = x[..., 0:RD:2].float(); xo = x[..., 1:RD:2].float()
    out[..., 0:RD:2] = (xe * c - xo * s_).to(x.dtype); out[..., 1:RD:2] = (xo * c + xe * s_).to(x.dtype)
    return [out]
