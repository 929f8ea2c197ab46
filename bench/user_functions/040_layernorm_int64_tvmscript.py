"""LayerNorm as Relax legalizes it: TVMScript, T.int64 indices, fp16 in -> fp32 mean/var via sum and sum of squares -> fp16, [1,100,1024] (GPT-NeoX-ish)."""
import numpy as np
from tvm.script import tirx as T
S, Hd = 100, 1024
SMALL = dict(S=5, Hd=64)
def make():
    s, h = T.int64(S), T.int64(Hd)
    inv = 1.0 / Hd
    @T.prim_func(s_tir=True)
    def main(x: T.Buffer((T.int64(1), s, h), "float16"), g: T.Buffer((h,), "float16"), b: T.Buffer((h,), "float16"),
             out: T.Buffer((T.int64(1), s, h), "float16")):
        T.func_attr({"tir.noalias": True})
        red = T.alloc_buffer((T.int64(1), s), "float32")
        red2 = T.alloc_buffer((T.int64(1), s), "float32")
        for a0, a1, k in T.grid(T.int64(1), s, h):
            with T.sblock("x_red"):
                v0, v1, vk = T.axis.remap("SSR", [a0, a1, k])
                with T.init():
                    red[v0, v1] = T.float32(0)
                    red2[v0, v1] = T.float32(0)
                red[v0, v1] = red[v0, v1] + T.Cast("float32", x[v0, v1, vk])
                red2[v0, v1] = red2[v0, v1] + T.Cast("float32", x[v0, v1, vk]) * T.Cast("float32", x[v0, v1, vk])
        for a0, a1, a2 in T.grid(T.int64(1), s, h):
            with T.sblock("ln"):
                v0, v1, v2 = T.axis.remap("SSS", [a0, a1, a2])
                out[v0, v1, v2] = T.Cast("float16", (T.Cast("float32", x[v0, v1, v2]) - red[v0, v1] * T.float32(inv))
                    * T.rsqrt(red2[v0, v1] * T.float32(inv) - red[v0, v1] * T.float32(inv) * (red[v0, v1] * T.float32(inv)) + T.float32(1e-5))
                    * T.Cast("float32", g[v2]) + T.Cast("float32", b[v2]))
    return main
def inputs(rng):
    return [rng.standard_normal((1, S, Hd)).astype(np.float32), rng.uniform(0.5, 1.5, (Hd,)).astype(np.float32),
            rng.uniform(-0.5, 0.5, (Hd,)).astype(np.float32)]
def reference(x, g, b):
    mu = x.mean(-1, keepdims=True); var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return [(x - mu) / np.sqrt(var + 1e-5) * g + b]
def torch_impl(x, g, b):
    import torch
    return [torch.nn.functional.layer_norm(x, (Hd,), g, b, 1e-5)]
