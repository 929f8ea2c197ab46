"""W8A8 SmoothQuant GEMM in TVMScript: int8 x[M,K] x int8 W[N,K] -> int32 accumulator block, then a dequant block acc * per-token scale [M] * per-channel scale [N] + fp16 bias -> fp16, M=2048 K=20480 N=5120 (OPT-13B fc2, SmoothQuant W8A8)."""
import numpy as np
from tvm.script import tirx as T
M, K, N = 2048, 20480, 5120
SMALL = dict(M=19, K=96, N=40)
def make():
    m_, k_, n_ = M, K, N
    @T.prim_func(s_tir=True)
    def main(x: T.Buffer((m_, k_), "int8"), w: T.Buffer((n_, k_), "int8"), sx: T.Buffer((m_,), "float32"),
             sw: T.Buffer((n_,), "float32"), bias: T.Buffer((n_,), "float16"), y: T.Buffer((m_, n_), "float16")):
        T.func_attr({"tir.noalias": True})
        acc = T.alloc_buffer((m_, n_), "int32")
        for i, j, k in T.grid(m_, n_, k_):
            with T.sblock("gemm_i32"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    acc[vi, vj] = 0
                acc[vi, vj] = acc[vi, vj] + T.Cast("int32", x[vi, vk]) * T.Cast("int32", w[vj, vk])
        for i, j in T.grid(m_, n_):
            with T.sblock("dequant"):
                vi, vj = T.axis.remap("SS", [i, j])
                y[vi, vj] = T.Cast("float16", T.Cast("float32", acc[vi, vj]) * sx[vi] * sw[vj] + T.Cast("float32", bias[vj]))
    return main
def inputs(rng):
    return [rng.integers(-127, 128, (M, K)).astype(np.int8), rng.integers(-127, 128, (N, K)).astype(np.int8),
            rng.uniform(0.002, 0.02, (M,)).astype(np.float32), (rng.uniform(0.002, 0.02, (N,)) / np.sqrt(K)).astype(np.float32),
            rng.uniform(-0.5, 0.5, (N,)).astype(np.float32)]
def reference(x, w, sx, sw, b):
    return [(x.astype(np.int64) @ w.astype(np.int64).T) * sx[:, None] * sw[None, :] + b]
def torch_impl(x, w, sx, sw, b):
    import torch
    return [(torch._int_mm(x, w.t().contiguous()).float() * sx[:, None] * sw[None, :] + b.float()).half()]
