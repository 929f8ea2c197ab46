"""Dense with a symbolic row count m = T.int64() bound by T.match_buffer (as a Relax-lowered module's PrimFunc takes it), y = x @ W^T with fp32 accumulation then bf16, TVMScript, bf16, K=4096 N=6144 (Llama-3-8B fused qkv_proj), m typically 1..8192."""
import numpy as np
from tvm.script import tirx as T
K, N = 4096, 6144
SMALL = dict(K=64, N=48)
SYMBOLIC = {"m": [1, 7, 128, 2048]}
def make():
    k_, n_ = T.int64(K), T.int64(N)
    @T.prim_func(s_tir=True)
    def main(var_x: T.handle, w: T.Buffer((n_, k_), "bfloat16"), var_y: T.handle):
        T.func_attr({"tir.noalias": True})
        m = T.int64()
        x = T.match_buffer(var_x, (m, k_), "bfloat16")
        y = T.match_buffer(var_y, (m, n_), "bfloat16")
        acc = T.alloc_buffer((m, n_), "float32")
        for i, j, k in T.grid(m, n_, k_):
            with T.sblock("matmul"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    acc[vi, vj] = T.float32(0)
                acc[vi, vj] = acc[vi, vj] + T.Cast("float32", x[vi, vk]) * T.Cast("float32", w[vj, vk])
        for i, j in T.grid(m, n_):
            with T.sblock("cast"):
                vi, vj = T.axis.remap("SS", [i, j])
                y[vi, vj] = T.Cast("bfloat16", acc[vi, vj])
    return main
def inputs(rng, m):
    return [rng.uniform(-1, 1, (m, K)).astype(np.float32), (rng.uniform(-1, 1, (N, K)) * 2 / np.sqrt(K)).astype(np.float32)]
def reference(x, w, m):
    return [x @ w.T]
def torch_impl(x, w, m):
    import torch
    return [torch.nn.functional.linear(x, w)]
