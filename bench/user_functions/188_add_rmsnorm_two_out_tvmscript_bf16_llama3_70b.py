"""Fused residual add + RMSNorm writing both outputs (HF order: h = x + residual rounded to bf16, then rmsnorm(h) in fp32 * weight), TVMScript with a sum-of-squares block reading the bf16 output buffer h, bf16, rows 1024 x H=8192 (Llama-3-70B post_attention_layernorm)."""
import numpy as np
from tvm.script import tirx as T
R, H = 1024, 8192
SMALL = dict(R=7, H=96)
EPS = 1e-5
def make():
    r_, h_ = R, H
    @T.prim_func(s_tir=True)
    def main(x: T.Buffer((r_, h_), "bfloat16"), residual: T.Buffer((r_, h_), "bfloat16"), weight: T.Buffer((h_,), "bfloat16"),
             h: T.Buffer((r_, h_), "bfloat16"), y: T.Buffer((r_, h_), "bfloat16")):
        T.func_attr({"tir.noalias": True})
        ss = T.alloc_buffer((r_,), "float32")
        for i, j in T.grid(r_, h_):
            with T.sblock("residual_add"):
                vi, vj = T.axis.remap("SS", [i, j])
                h[vi, vj] = x[vi, vj] + residual[vi, vj]
        for i, j in T.grid(r_, h_):
            with T.sblock("sum_sq"):
                vi, vj = T.axis.remap("SR", [i, j])
                with T.init():
                    ss[vi] = T.float32(0)
                ss[vi] = ss[vi] + T.Cast("float32", h[vi, vj]) * T.Cast("float32", h[vi, vj])
        for i, j in T.grid(r_, h_):
            with T.sblock("norm"):
                vi, vj = T.axis.remap("SS", [i, j])
                y[vi, vj] = T.Cast("bfloat16", T.Cast("float32", h[vi, vj]) * T.rsqrt(ss[vi] / T.float32(h_) + T.float32(EPS)) * T.Cast("float32", weight[vj]))
    return main
def inputs(rng):
    return [rng.standard_normal((R, H)).astype(np.float32), rng.standard_normal((R, H)).astype(np.float32),
            rng.uniform(0.5, 1.5, (H,)).astype(np.float32)]
def reference(x, r, w):
    import ml_dtypes
    h = (x + r).astype(ml_dtypes.bfloat16).astype(np.float64)
    return [h, h / np.sqrt((h * h).mean(-1, keepdims=True) + EPS) * w]
def torch_impl(x, r, w):
    import torch
    h = x + r
    hf = h.float()
    return [h, (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(torch.bfloat16)]
