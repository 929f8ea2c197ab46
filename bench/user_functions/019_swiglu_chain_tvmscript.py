"""SwiGLU FFN chain (gate, up, silu*mul, down) in TVMScript with T.alloc_buffer intermediates, fp16 (fp32 accum), M=128 H=4096 I=14336 (Mistral-7B)."""
import numpy as np
from tvm.script import tirx as T
M, H, I = 128, 4096, 14336
SMALL = dict(M=16, H=32, I=48)
def make():
    m, h, i_ = M, H, I
    @T.prim_func(s_tir=True)
    def main(x: T.Buffer((m, h), "float16"), wg: T.Buffer((i_, h), "float16"), wu: T.Buffer((i_, h), "float16"),
             wd: T.Buffer((h, i_), "float16"), out: T.Buffer((m, h), "float16")):
        gate = T.alloc_buffer((m, i_), "float32")
        up = T.alloc_buffer((m, i_), "float32")
        act = T.alloc_buffer((m, i_), "float16")
        down = T.alloc_buffer((m, h), "float32")
        for a, b, k in T.grid(m, i_, h):
            with T.sblock("gate"):
                va, vb, vk = T.axis.remap("SSR", [a, b, k])
                with T.init():
                    gate[va, vb] = T.float32(0)
                gate[va, vb] = gate[va, vb] + T.Cast("float32", x[va, vk]) * T.Cast("float32", wg[vb, vk])
        for a, b, k in T.grid(m, i_, h):
            with T.sblock("up"):
                va, vb, vk = T.axis.remap("SSR", [a, b, k])
                with T.init():
                    up[va, vb] = T.float32(0)
                up[va, vb] = up[va, vb] + T.Cast("float32", x[va, vk]) * T.Cast("float32", wu[vb, vk])
        for a, b in T.grid(m, i_):
            with T.sblock("act"):
                va, vb = T.axis.remap("SS", [a, b])
                act[va, vb] = T.Cast("float16", gate[va, vb] * T.sigmoid(gate[va, vb]) * up[va, vb])
        for a, b, k in T.grid(m, h, i_):
            with T.sblock("down"):
                va, vb, vk = T.axis.remap("SSR", [a, b, k])
                with T.init():
                    down[va, vb] = T.float32(0)
                down[va, vb] = down[va, vb] + T.Cast("float32", act[va, vk]) * T.Cast("float32", wd[vb, vk])
        for a, b in T.grid(m, h):
            with T.sblock("out"):
                va, vb = T.axis.remap("SS", [a, b])
                out[va, vb] = T.Cast("float16", down[va, vb])
    return main
def inputs(rng):
    return [rng.uniform(-1, 1, (M, H)).astype(np.float32), (rng.uniform(-1, 1, (I, H)) * 2 / np.sqrt(H)).astype(np.float32),
            (rng.uniform(-1, 1, (I, H)) * 2 / np.sqrt(H)).astype(np.float32), (rng.uniform(-1, 1, (H, I)) * 2 / np.sqrt(I)).astype(np.float32)]
def reference(x, wg, wu, wd):
    g = x @ wg.T; u = x @ wu.T
    a = (g / (1 + np.exp(-g)) * u).astype(np.float16).astype(np.float64)
    return [a @ wd.T]
def torch_impl(x, wg, wu, wd):
    import torch
    return [(torch.nn.functional.silu(x @ wg.T) * (x @ wu.T)) @ wd.T]
