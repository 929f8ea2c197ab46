"""Decode GEMV over 2-bit codes, 16 to a uint32 (low first), W [N,K/16], codes converted with T.Cast to bf16, w = (q - 2) * s in bf16 with a bf16 group scale [N,K/64], the product cast to fp32 and summed in fp32, then bf16, TVMScript, x [1,K] bf16, K=4096 N=14336 (Llama-3-8B gate_proj, 2-bit)."""
import numpy as np
from tvm.script import tirx as T
K, N, G = 4096, 14336, 64
SMALL = dict(K=256, N=40, G=64)
def make():
    k_, n_, g_ = K, N, G
    @T.prim_func(s_tir=True)
    def main(x: T.Buffer((1, k_), "bfloat16"), qw: T.Buffer((n_, k_ // 16), "uint32"),
             scales: T.Buffer((n_, k_ // g_), "bfloat16"), y: T.Buffer((1, n_), "bfloat16")):
        acc = T.alloc_buffer((1, n_), "float32")
        for i, j, k in T.grid(1, n_, k_):
            with T.sblock("gemv"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    acc[vi, vj] = T.float32(0)
                acc[vi, vj] = acc[vi, vj] + T.Cast("float32", x[vi, vk] * ((T.Cast("bfloat16", T.bitwise_and(
                    T.shift_right(qw[vj, vk // 16], T.Cast("uint32", vk % 16 * 2)), T.uint32(3))) - T.bfloat16(2)) * scales[vj, vk // g_]))
        for i, j in T.grid(1, n_):
            with T.sblock("cast"):
                vi, vj = T.axis.remap("SS", [i, j])
                y[vi, vj] = T.Cast("bfloat16", acc[vi, vj])
    return main
def inputs(rng):
    codes = rng.integers(0, 4, (N, K)).astype(np.uint64)
    words = sum(codes[:, j::16] << np.uint64(2 * j) for j in range(16)).astype(np.uint32)
    return [rng.uniform(-1, 1, (1, K)).astype(np.float32), words,
            (rng.uniform(0.5, 1.5, (N, K // G)) / np.sqrt(K)).astype(np.float32)]
def _deq(qw, s):
    codes = (qw[:, :, None].astype(np.uint64) >> (2 * np.arange(16, dtype=np.uint64))) & 3
    return (codes.reshape(qw.shape[0], -1).astype(np.float64) - 2) * np.repeat(s, G, 1)
def reference(x, qw, s):
    return [x @ _deq(qw, s).T]
def torch_impl(x, qw, s):
    import torch
    sh = torch.arange(16, device=qw.device, dtype=torch.int64) * 2
    q = ((qw.to(torch.int64)[:, :, None] >> sh) & 3).reshape(qw.shape[0], -1).to(x.dtype) - 2
    return [(x.float() @ (q * s.repeat_interleave(G, 1)).float().T).to(x.dtype)]
