"""Sliding-window causal GQA prefill (Gemma-3 local layers, window 1024): TVMScript blocks qk (q head h reads kv head h//2), a mask block T.if_then_else(j <= i and i - j < 1024, s * 1/16, -inf), max / exp / sum / PV / normalize, bf16, B=1 Hq=8 Hkv=4 S=4096 D=256 (Gemma-3-4B)."""
import numpy as np
from tvm.script import tirx as T
B, HQ, HKV, S, D, WIN = 1, 8, 4, 4096, 256, 1024
SMALL = dict(HQ=4, HKV=2, S=19, D=16, WIN=6)
def make():
    b_, hq, hkv, s_, d_, win = B, HQ, HKV, S, D, WIN
    grp = hq // hkv
    scale = float(D) ** -0.5
    @T.prim_func(s_tir=True)
    def main(q: T.Buffer((b_, hq, s_, d_), "bfloat16"), k: T.Buffer((b_, hkv, s_, d_), "bfloat16"),
             v: T.Buffer((b_, hkv, s_, d_), "bfloat16"), out: T.Buffer((b_, hq, s_, d_), "bfloat16")):
        T.func_attr({"tir.noalias": True})
        sc = T.alloc_buffer((b_, hq, s_, s_), "float32")
        ms = T.alloc_buffer((b_, hq, s_, s_), "float32")
        mx = T.alloc_buffer((b_, hq, s_), "float32")
        ex = T.alloc_buffer((b_, hq, s_, s_), "float32")
        sm = T.alloc_buffer((b_, hq, s_), "float32")
        acc = T.alloc_buffer((b_, hq, s_, d_), "float32")
        for b, h, i, j, c in T.grid(b_, hq, s_, s_, d_):
            with T.sblock("qk"):
                vb, vh, vi, vj, vc = T.axis.remap("SSSSR", [b, h, i, j, c])
                with T.init():
                    sc[vb, vh, vi, vj] = T.float32(0)
                sc[vb, vh, vi, vj] = sc[vb, vh, vi, vj] + T.Cast("float32", q[vb, vh, vi, vc]) * T.Cast("float32", k[vb, vh // grp, vj, vc])
        for b, h, i, j in T.grid(b_, hq, s_, s_):
            with T.sblock("window_mask"):
                vb, vh, vi, vj = T.axis.remap("SSSS", [b, h, i, j])
                ms[vb, vh, vi, vj] = T.if_then_else(T.And(vj <= vi, vi - vj < win), sc[vb, vh, vi, vj] * T.float32(scale), T.float32("-inf"))
        for b, h, i, j in T.grid(b_, hq, s_, s_):
            with T.sblock("row_max"):
                vb, vh, vi, vj = T.axis.remap("SSSR", [b, h, i, j])
                with T.init():
                    mx[vb, vh, vi] = T.float32("-inf")
                mx[vb, vh, vi] = T.max(mx[vb, vh, vi], ms[vb, vh, vi, vj])
        for b, h, i, j in T.grid(b_, hq, s_, s_):
            with T.sblock("exp"):
                vb, vh, vi, vj = T.axis.remap("SSSS", [b, h, i, j])
                ex[vb, vh, vi, vj] = T.exp(ms[vb, vh, vi, vj] - mx[vb, vh, vi])
        for b, h, i, j in T.grid(b_, hq, s_, s_):
            with T.sblock("row_sum"):
                vb, vh, vi, vj = T.axis.remap("SSSR", [b, h, i, j])
                with T.init():
                    sm[vb, vh, vi] = T.float32(0)
                sm[vb, vh, vi] = sm[vb, vh, vi] + ex[vb, vh, vi, vj]
        for b, h, i, c, j in T.grid(b_, hq, s_, d_, s_):
            with T.sblock("pv"):
                vb, vh, vi, vc, vj = T.axis.remap("SSSSR", [b, h, i, c, j])
                with T.init():
                    acc[vb, vh, vi, vc] = T.float32(0)
                acc[vb, vh, vi, vc] = acc[vb, vh, vi, vc] + ex[vb, vh, vi, vj] * T.Cast("float32", v[vb, vh // grp, vj, vc])
        for b, h, i, c in T.grid(b_, hq, s_, d_):
            with T.sblock("normalize"):
                vb, vh, vi, vc = T.axis.remap("SSSS", [b, h, i, c])
                out[vb, vh, vi, vc] = T.Cast("bfloat16", acc[vb, vh, vi, vc] / sm[vb, vh, vi])
    return main
def inputs(rng):
    return [rng.standard_normal((B, HQ, S, D)).astype(np.float32), rng.standard_normal((B, HKV, S, D)).astype(np.float32),
            rng.standard_normal((B, HKV, S, D)).astype(np.float32)]
def reference(q, k, v):
    g = HQ // HKV
    k, v = np.repeat(k, g, 1), np.repeat(v, g, 1)
    s = q @ k.swapaxes(-1, -2) * float(D) ** -0.5
    i, j = np.arange(S)[:, None], np.arange(S)[None, :]
    s = np.where((j <= i) & (i - j < WIN), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [p @ v]
def torch_impl(q, k, v):
    import torch
    i = torch.arange(S, device=q.device)
    mask = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < WIN)
    return [torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=float(D) ** -0.5, enable_gqa=True)]
