"""Weight-gradient GEMM of a linear layer's backward: dW[n,k] = sum over tokens m of dy[m,n] * x[m,k] (both operands reduced along their outer, row axis: dy^T @ x), fp32 accumulation and fp32 dW (the main grad), TVMScript with T.int64 extents, bf16, M=8192 (B=4 x S=2048) N=4096 K=4096 (Llama-3-8B q_proj backward)."""
import numpy as np
from tvm.script import tirx as T
M, N, K = 8192, 4096, 4096
SMALL = dict(M=33, N=24, K=40)
def make():
    m_, n_, k_ = T.int64(M), T.int64(N), T.int64(K)
    @T.prim_func(s_tir=True)
    def main(dy: T.Buffer((m_, n_), "bfloat16"), x: T.Buffer((m_, k_), "bfloat16"), dw: T.Buffer((n_, k_), "float32")):
        T.func_attr({"tir.noalias": True})
        for n, k, m in T.grid(n_, k_, m_):
            with T.sblock("wgrad"):
                vn, vk, vm = T.axis.remap("SSR", [n, k, m])
                T.reads(dy[vm, vn], x[vm, vk])
                T.writes(dw[vn, vk])
                with T.init():
                    dw[vn, vk] = T.float32(0)
                dw[vn, vk] = dw[vn, vk] + T.Cast("float32", dy[vm, vn]) * T.Cast("float32", x[vm, vk])
    return main
def inputs(rng):
    return [(rng.standard_normal((M, N)) * 1e-2).astype(np.float32), rng.standard_normal((M, K)).astype(np.float32)]
def reference(dy, x):
    return [dy.T @ x]
def torch_impl(dy, x):
    import torch
    return [torch.mm(dy.t(), x).float()]
