"""Meta-reference rotary (view_as_complex: pairs (2i, 2i+1) interleaved over the whole head) on q and k, two outputs, fp32 cos/sin tables [S, D/2], T.if_then_else on d % 2 picking the pair's real/imag formula, TVMScript, bf16, q [B,S,Hq,D] k [B,S,Hkv,D], B=1 S=2048 Hq=64 Hkv=8 D=128 (Llama-3-70B, Meta's llama repo)."""
import numpy as np
from tvm.script import tirx as T
B, S, HQ, HKV, D = 1, 2048, 64, 8, 128
SMALL = dict(S=5, HQ=4, HKV=2, D=16)
def make():
    b_, s_, hq, hkv, d_ = B, S, HQ, HKV, D
    @T.prim_func(s_tir=True)
    def main(xq: T.Buffer((b_, s_, hq, d_), "bfloat16"), xk: T.Buffer((b_, s_, hkv, d_), "bfloat16"),
             cos: T.Buffer((s_, d_ // 2), "float32"), sin: T.Buffer((s_, d_ // 2), "float32"),
             q_out: T.Buffer((b_, s_, hq, d_), "bfloat16"), k_out: T.Buffer((b_, s_, hkv, d_), "bfloat16")):
        T.func_attr({"tir.noalias": True})
        for b, s, h, d in T.grid(b_, s_, hq, d_):
            with T.sblock("rope_q"):
                vb, vs, vh, vd = T.axis.remap("SSSS", [b, s, h, d])
                q_out[vb, vs, vh, vd] = T.Cast("bfloat16", T.if_then_else(
                    vd % 2 == 0,
                    T.Cast("float32", xq[vb, vs, vh, vd]) * cos[vs, vd // 2] - T.Cast("float32", xq[vb, vs, vh, vd + 1]) * sin[vs, vd // 2],
                    T.Cast("float32", xq[vb, vs, vh, vd - 1]) * sin[vs, vd // 2] + T.Cast("float32", xq[vb, vs, vh, vd]) * cos[vs, vd // 2]))
        for b, s, h, d in T.grid(b_, s_, hkv, d_):
            with T.sblock("rope_k"):
                vb, vs, vh, vd = T.axis.remap("SSSS", [b, s, h, d])
                k_out[vb, vs, vh, vd] = T.Cast("bfloat16", T.if_then_else(
                    vd % 2 == 0,
                    T.Cast("float32", xk[vb, vs, vh, vd]) * cos[vs, vd // 2] - T.Cast("float32", xk[vb, vs, vh, vd + 1]) * sin[vs, vd // 2],
                    T.Cast("float32", xk[vb, vs, vh, vd - 1]) * sin[vs, vd // 2] + T.Cast("float32", xk[vb, vs, vh, vd]) * cos[vs, vd // 2]))
    return main
def _tables():
    inv = 500000.0 ** (-np.arange(0, D, 2) / D)
    ang = np.arange(S)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
def inputs(rng):
    c, s = _tables()
    return [rng.standard_normal((B, S, HQ, D)).astype(np.float32), rng.standard_normal((B, S, HKV, D)).astype(np.float32), c, s]
def _rot(x, c, s):
    re, im = x[..., 0::2], x[..., 1::2]
    c, s = c[None, :, None, :], s[None, :, None, :]
    return np.stack([re * c - im * s, re * s + im * c], -1).reshape(x.shape)
def reference(xq, xk, c, s):
    return [_rot(xq, c, s), _rot(xk, c, s)]
def torch_impl(xq, xk, c, s):
    import torch
    f = torch.complex(c, s)[None, :, None, :]
    def rot(x):
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * f).flatten(3).type_as(x)
    return [rot(xq), rot(xk)]
