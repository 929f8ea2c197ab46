"""GEMM with N=1 written as a matrix-vector product: a PPO critic's value head v[m] = h[m,:] . w + b[0] with w a vector [K] and the output [M] (no unit axis), fp32 accumulation, TVMScript, bf16 in, fp32 out, M=16384 (B=16 x S=1024) K=3584 (Qwen2-7B value head)."""
import numpy as np
from tvm.script import tirx as T
M, K = 16384, 3584
SMALL = dict(M=37, K=96)
def make():
    m_, k_ = M, K
    @T.prim_func(s_tir=True)
    def main(h: T.Buffer((m_, k_), "bfloat16"), w: T.Buffer((k_,), "bfloat16"), b: T.Buffer((1,), "float32"),
             v: T.Buffer((m_,), "float32")):
        acc = T.alloc_buffer((m_,), "float32")
        for i, k in T.grid(m_, k_):
            with T.sblock("dot"):
                vi, vk = T.axis.remap("SR", [i, k])
                with T.init():
                    acc[vi] = T.float32(0)
                acc[vi] = acc[vi] + T.Cast("float32", h[vi, vk]) * T.Cast("float32", w[vk])
        for i in range(m_):
            with T.sblock("bias"):
                vi = T.axis.spatial(m_, i)
                v[vi] = acc[vi] + b[0]
    return main
def inputs(rng):
    return [rng.standard_normal((M, K)).astype(np.float32), (rng.uniform(-1, 1, (K,)) / np.sqrt(K)).astype(np.float32),
            rng.uniform(-1, 1, (1,)).astype(np.float32)]
def reference(h, w, b):
    return [h @ w + b[0]]
def torch_impl(h, w, b):
    import torch
    return [h.float() @ w.float() + b]
