"""Attention with a relative-position bias tensor [H,S,S] fp32 (T5-like, no scale), TVMScript with T.alloc_buffer intermediates, fp16, B=1 H=8 S=384 D=96."""
import numpy as np
from tvm.script import tirx as T
B, H, S, D = 1, 8, 384, 96
SMALL = dict(B=1, H=2, S=16, D=16)
def make():
    b_, h_, s_, d_ = B, H, S, D
    @T.prim_func(s_tir=True)
    def main(q: T.Buffer((b_, h_, s_, d_), "float16"), k: T.Buffer((b_, h_, s_, d_), "float16"),
             v: T.Buffer((b_, h_, s_, d_), "float16"), bias: T.Buffer((h_, s_, s_), "float32"),
             out: T.Buffer((b_, h_, s_, d_), "float16")):
        sc = T.alloc_buffer((b_, h_, s_, s_), "float32")
        mx = T.alloc_buffer((b_, h_, s_), "float32")
        ex = T.alloc_buffer((b_, h_, s_, s_), "float32")
        sm = T.alloc_buffer((b_, h_, s_), "float32")
        acc = T.alloc_buffer((b_, h_, s_, d_), "float32")
        for b, h, i, j, c in T.grid(b_, h_, s_, s_, d_):
            with T.sblock("qk"):
                vb, vh, vi, vj, vc = T.axis.remap("SSSSR", [b, h, i, j, c])
                with T.init():
                    sc[vb, vh, vi, vj] = bias[vh, vi, vj]
                sc[vb, vh, vi, vj] = sc[vb, vh, vi, vj] + T.Cast("float32", q[vb, vh, vi, vc]) * T.Cast("float32", k[vb, vh, vj, vc])
        for b, h, i, j in T.grid(b_, h_, s_, s_):
            with T.sblock("max"):
                vb, vh, vi, vj = T.axis.remap("SSSR", [b, h, i, j])
                with T.init():
                    mx[vb, vh, vi] = T.float32(-3.4e38)
                mx[vb, vh, vi] = T.max(mx[vb, vh, vi], sc[vb, vh, vi, vj])
        for b, h, i, j in T.grid(b_, h_, s_, s_):
            with T.sblock("exp"):
                vb, vh, vi, vj = T.axis.remap("SSSS", [b, h, i, j])
                ex[vb, vh, vi, vj] = T.exp(sc[vb, vh, vi, vj] - mx[vb, vh, vi])
        for b, h, i, j in T.grid(b_, h_, s_, s_):
            with T.sblock("sum"):
                vb, vh, vi, vj = T.axis.remap("SSSR", [b, h, i, j])
                with T.init():
                    sm[vb, vh, vi] = T.float32(0)
                sm[vb, vh, vi] = sm[vb, vh, vi] + ex[vb, vh, vi, vj]
        for b, h, i, c, j in T.grid(b_, h_, s_, d_, s_):
            with T.sblock("pv"):
                vb, vh, vi, vc, vj = T.axis.remap("SSSSR", [b, h, i, c, j])
                with T.init():
                    acc[vb, vh, vi, vc] = T.float32(0)
                acc[vb, vh, vi, vc] = acc[vb, vh, vi, vc] + ex[vb, vh, vi, vj] * T.Cast("float32", v[vb, vh, vj, vc])
        for b, h, i, c in T.grid(b_, h_, s_, d_):
            with T.sblock("norm"):
                vb, vh, vi, vc = T.axis.remap("SSSS", [b, h, i, c])
                out[vb, vh, vi, vc] = T.Cast("float16", acc[vb, vh, vi, vc] / sm[vb, vh, vi])
    return main
def inputs(rng):
    return [(rng.standard_normal((B, H, S, D)) * 0.2).astype(np.float32) for _ in range(3)] + [rng.standard_normal((H, S, S)).astype(np.float32)]
def reference(q, k, v, bias):
    s = q @ k.swapaxes(-1, -2) + bias[None]
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [p @ v]
def torch_impl(q, k, v, bias):
    import torch
    return [torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype)[None], scale=1.0)]
