"""Gemma RMSNorm: bf16 activations, fp32 weight, x * rsqrt(mean(x^2) + 1e-6) * (1 + w) all in fp32 then cast to bf16, TVMScript, rows 4096 (B=2 x S=2048) x H=2048 (Gemma-2B)."""
import numpy as np
from tvm.script import tirx as T
R, H = 4096, 2048
SMALL = dict(R=5, H=64)
def make():
    r_, h_ = R, H
    @T.prim_func(s_tir=True)
    def main(x: T.Buffer((r_, h_), "bfloat16"), w: T.Buffer((h_,), "float32"), y: T.Buffer((r_, h_), "bfloat16")):
        ss = T.alloc_buffer((r_,), "float32")
        for i, j in T.grid(r_, h_):
            with T.sblock("sum_sq"):
                vi, vj = T.axis.remap("SR", [i, j])
                with T.init():
                    ss[vi] = T.float32(0)
                ss[vi] = ss[vi] + T.Cast("float32", x[vi, vj]) * T.Cast("float32", x[vi, vj])
        for i, j in T.grid(r_, h_):
            with T.sblock("norm"):
                vi, vj = T.axis.remap("SS", [i, j])
                y[vi, vj] = T.Cast("bfloat16", T.Cast("float32", x[vi, vj]) * T.rsqrt(ss[vi] / T.float32(h_) + T.float32(1e-6))
                                   * (T.float32(1) + w[vj]))
    return main
def inputs(rng):
    return [rng.standard_normal((R, H)).astype(np.float32) * 2, rng.uniform(-0.5, 0.5, (H,)).astype(np.float32)]
def reference(x, w):
    return [x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * (1 + w)]
def torch_impl(x, w):
    import torch
    xf = x.float()
    return [(xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + w)).to(x.dtype)]
