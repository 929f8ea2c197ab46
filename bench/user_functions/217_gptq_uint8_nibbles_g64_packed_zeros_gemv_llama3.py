"""Decode GEMV over a GPTQ-style int4 weight: uint8 [N,K/2] two nibbles (low = even k), group 64, fp16 scales [N,K/64], zero points packed two a byte too (uint8 [N,K/128], low = even group) stored minus one as GPTQ v1 does, w = (q - (z + 1)) * s inline, fp32 accumulation, TVMScript, fp16, x [1,K] K=4096 N=4096 (Llama-3-8B o_proj)."""
import numpy as np
from tvm.script import tirx as T
K, N, G = 4096, 4096, 64
SMALL = dict(K=256, N=48, G=64)
def make():
    k_, n_, g_ = K, N, G
    @T.prim_func(s_tir=True)
    def main(x: T.Buffer((1, k_), "float16"), qw: T.Buffer((n_, k_ // 2), "uint8"),
             scales: T.Buffer((n_, k_ // g_), "float16"), qzeros: T.Buffer((n_, k_ // g_ // 2), "uint8"),
             y: T.Buffer((1, n_), "float16")):
        acc = T.alloc_buffer((1, n_), "float32")
        for i, j, k in T.grid(1, n_, k_):
            with T.sblock("gemv"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    acc[vi, vj] = T.float32(0)
                acc[vi, vj] = acc[vi, vj] + T.Cast("float32", x[vi, vk]) * ((
                    T.Cast("float32", T.bitwise_and(T.shift_right(qw[vj, vk // 2], T.Cast("uint8", vk % 2 * 4)), T.uint8(15)))
                    - (T.Cast("float32", T.bitwise_and(T.shift_right(qzeros[vj, vk // (2 * g_)], T.Cast("uint8", vk // g_ % 2 * 4)),
                                                        T.uint8(15))) + T.float32(1))) * T.Cast("float32", scales[vj, vk // g_]))
        for i, j in T.grid(1, n_):
            with T.sblock("cast"):
                vi, vj = T.axis.remap("SS", [i, j])
                y[vi, vj] = T.Cast("float16", acc[vi, vj])
    return main
def _pack2(q):
    return (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
def inputs(rng):
    return [rng.uniform(-1, 1, (1, K)).astype(np.float32), _pack2(rng.integers(0, 16, (N, K))),
            (rng.uniform(0.5, 1.5, (N, K // G)) / np.sqrt(K) / 4).astype(np.float32), _pack2(rng.integers(5, 9, (N, K // G)))]
def _unpack2(p):
    return np.stack([p & 15, p >> 4], -1).reshape(p.shape[0], -1).astype(np.float64)
def reference(x, qw, s, qz):
    w = (_unpack2(qw) - np.repeat(_unpack2(qz) + 1, G, 1)) * np.repeat(s, G, 1)
    return [x @ w.T]
def torch_impl(x, qw, s, qz):
    import torch
    def un(p):
        return torch.stack([p & 15, p >> 4], -1).reshape(p.shape[0], -1).to(x.dtype)
    w = (un(qw) - (un(qz) + 1).repeat_interleave(G, 1)) * s.repeat_interleave(G, 1)
    return [x @ w.T]
