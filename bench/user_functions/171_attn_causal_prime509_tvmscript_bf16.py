"""Causal attention prefill at prime length S=509, [B,H,S,D], TVMScript: scores block * 1/8, a masking block T.Select(j <= i, s, min_value), max / exp / sum / PV blocks, bf16, B=2 H=16 D=64 (GPT-2-medium heads)."""
import numpy as np
from tvm.script import tirx as T
B, H, S, D = 2, 16, 509, 64
SMALL = dict(B=1, H=2, S=13, D=16)
def make():
    b_, h_, s_, d_ = B, H, S, D
    @T.prim_func(s_tir=True)
    def main(q: T.Buffer((b_, h_, s_, d_), "bfloat16"), k: T.Buffer((b_, h_, s_, d_), "bfloat16"),
             v: T.Buffer((b_, h_, s_, d_), "bfloat16"), out: T.Buffer((b_, h_, s_, d_), "bfloat16")):
        sc = T.alloc_buffer((b_, h_, s_, s_), "float32")
        ms = T.alloc_buffer((b_, h_, s_, s_), "float32")
        mx = T.alloc_buffer((b_, h_, s_), "float32")
        ex = T.alloc_buffer((b_, h_, s_, s_), "float32")
        sm = T.alloc_buffer((b_, h_, s_), "float32")
        acc = T.alloc_buffer((b_, h_, s_, d_), "float32")
        for b, h, i, j, c in T.grid(b_, h_, s_, s_, d_):
            with T.sblock("qk"):
                vb, vh, vi, vj, vc = T.axis.remap("SSSSR", [b, h, i, j, c])
                with T.init():
                    sc[vb, vh, vi, vj] = T.float32(0)
                sc[vb, vh, vi, vj] = sc[vb, vh, vi, vj] + T.Cast("float32", q[vb, vh, vi, vc]) * T.Cast("float32", k[vb, vh, vj, vc])
        for b, h, i, j in T.grid(b_, h_, s_, s_):
            with T.sblock("mask"):
                vb, vh, vi, vj = T.axis.remap("SSSS", [b, h, i, j])
                ms[vb, vh, vi, vj] = T.Select(vj <= vi, sc[vb, vh, vi, vj] * T.float32(0.125), T.min_value("float32"))
        for b, h, i, j in T.grid(b_, h_, s_, s_):
            with T.sblock("max"):
                vb, vh, vi, vj = T.axis.remap("SSSR", [b, h, i, j])
                with T.init():
                    mx[vb, vh, vi] = T.min_value("float32")
                mx[vb, vh, vi] = T.max(mx[vb, vh, vi], ms[vb, vh, vi, vj])
        for b, h, i, j in T.grid(b_, h_, s_, s_):
            with T.sblock("exp"):
                vb, vh, vi, vj = T.axis.remap("SSSS", [b, h, i, j])
                ex[vb, vh, vi, vj] = T.exp(ms[vb, vh, vi, vj] - mx[vb, vh, vi])
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
            with T.sblock("out"):
                vb, vh, vi, vc = T.axis.remap("SSSS", [b, h, i, c])
                out[vb, vh, vi, vc] = T.Cast("bfloat16", acc[vb, vh, vi, vc] / sm[vb, vh, vi])
    return main
def inputs(rng):
    return [rng.standard_normal((B, H, S, D)).astype(np.float32) for _ in range(3)]
def reference(q, k, v):
    s = q @ k.swapaxes(-1, -2) * 0.125
    s = np.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [p @ v]
def torch_impl(q, k, v):
    import torch
    return [torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.125)]
