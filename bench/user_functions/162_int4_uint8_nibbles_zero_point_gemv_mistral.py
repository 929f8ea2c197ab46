"""Decode GEMV with GPTQ-style int4 weight: uint8 [N,K/2] holding two nibbles (low = even k), per-group (128) fp16 scale and uint8 zero point [N,K/128], w = (q - z) * s inline in the reduction, fp32 accumulation, TVMScript, fp16, x [1,K] K=14336 N=4096 (Mistral-7B down_proj)."""
import numpy as np
from tvm.script import tirx as T
K, N, G = 14336, 4096, 128
SMALL = dict(K=256, N=48, G=32)
def make():
    k_, n_, g_ = K, N, G
    @T.prim_func(s_tir=True)
    def main(x: T.Buffer((1, k_), "float16"), qw: T.Buffer((n_, k_ // 2), "uint8"),
             scales: T.Buffer((n_, k_ // g_), "float16"), zeros: T.Buffer((n_, k_ // g_), "uint8"),
             y: T.Buffer((1, n_), "float16")):
        acc = T.alloc_buffer((1, n_), "float32")
        for i, j, k in T.grid(1, n_, k_):
            with T.sblock("gemv"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    acc[vi, vj] = T.float32(0)
                acc[vi, vj] = acc[vi, vj] + T.Cast("float32", x[vi, vk]) * (
                    T.Cast("float32", T.bitwise_and(T.shift_right(qw[vj, vk // 2], T.Cast("uint8", vk % 2 * 4)), T.uint8(15)))
                    - T.Cast("float32", zeros[vj, vk // g_])) * T.Cast("float32", scales[vj, vk // g_])
        for i, j in T.grid(1, n_):
            with T.sblock("cast"):
                vi, vj = T.axis.remap("SS", [i, j])
                y[vi, vj] = T.Cast("float16", acc[vi, vj])
    return main
def inputs(rng):
    return [rng.uniform(-1, 1, (1, K)).astype(np.float32), rng.integers(0, 256, (N, K // 2)).astype(np.uint8),
            (rng.uniform(0.5, 1.5, (N, K // G)) / np.sqrt(K) / 4).astype(np.float32), rng.integers(6, 10, (N, K // G)).astype(np.uint8)]
def _deq(qw, s, z):
    q = np.stack([qw & 15, qw >> 4], -1).reshape(qw.shape[0], -1).astype(np.float64)
    return (q - np.repeat(z.astype(np.float64), G, 1)) * np.repeat(s, G, 1)
def reference(x, qw, s, z):
    return [x @ _deq(qw, s, z).T]
def torch_impl(x, qw, s, z):
    import torch
    q = torch.stack([qw & 15, qw >> 4], -1).reshape(qw.shape[0], -1).to(x.dtype)
    w = (q - z.to(x.dtype).repeat_interleave(G, 1)) * s.repeat_interleave(G, 1)
    return [x @ w.T]
