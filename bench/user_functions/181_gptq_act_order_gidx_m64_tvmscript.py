"""GPTQ act-order (desc_act) int4 GEMM at M=64: int32 qweight [K/8,N] packed along K, int32 qzeros [ngroups,N/8] (v1 format, stored zero - 1), fp16 scales [ngroups,N], int32 g_idx [K] picking each row's group (permuted, not k//128), fp32 accumulation, TVMScript, fp16, M=64 K=4096 N=11008 (Llama-2-7B GPTQ gate_proj)."""
import numpy as np
from tvm.script import tirx as T
M, K, N, G = 64, 4096, 11008, 128
SMALL = dict(M=9, K=128, N=40, G=32)
def make():
    m_, k_, n_, ng = M, K, N, K // G
    @T.prim_func(s_tir=True)
    def main(x: T.Buffer((m_, k_), "float16"), qweight: T.Buffer((k_ // 8, n_), "int32"),
             qzeros: T.Buffer((ng, n_ // 8), "int32"), scales: T.Buffer((ng, n_), "float16"),
             g_idx: T.Buffer((k_,), "int32"), y: T.Buffer((m_, n_), "float16")):
        T.func_attr({"tir.noalias": True})
        acc = T.alloc_buffer((m_, n_), "float32")
        for i, j, k in T.grid(m_, n_, k_):
            with T.sblock("gptq_gemm"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    acc[vi, vj] = T.float32(0)
                acc[vi, vj] = acc[vi, vj] + T.Cast("float32", x[vi, vk]) * (
                    T.Cast("float32", T.bitwise_and(T.shift_right(qweight[vk // 8, vj], vk % 8 * 4), 15))
                    - T.Cast("float32", T.bitwise_and(T.shift_right(qzeros[g_idx[vk], vj // 8], vj % 8 * 4), 15) + 1)
                ) * T.Cast("float32", scales[g_idx[vk], vj])
        for i, j in T.grid(m_, n_):
            with T.sblock("cast"):
                vi, vj = T.axis.remap("SS", [i, j])
                y[vi, vj] = T.Cast("float16", acc[vi, vj])
    return main
def _pack_rows(q):  # [K, N] nibbles -> [K/8, N] int32, row 8r+t in bits 4t
    words = np.zeros((q.shape[0] // 8, q.shape[1]), np.uint32)
    for t in range(8):
        words |= q[t::8].astype(np.uint32) << np.uint32(4 * t)
    return words.view(np.int32)
def _pack_cols(q):  # [R, N] nibbles -> [R, N/8] int32, column 8c+t in bits 4t
    words = np.zeros((q.shape[0], q.shape[1] // 8), np.uint32)
    for t in range(8):
        words |= q[:, t::8].astype(np.uint32) << np.uint32(4 * t)
    return words.view(np.int32)
def inputs(rng):
    g_idx = rng.permutation(np.arange(K) // G).astype(np.int32)
    return [rng.uniform(-1, 1, (M, K)).astype(np.float32), _pack_rows(rng.integers(0, 16, (K, N))),
            _pack_cols(rng.integers(6, 10, (K // G, N)) - 1), (rng.uniform(0.5, 1.5, (K // G, N)) / np.sqrt(K) / 4).astype(np.float32), g_idx]
def _unpack_rows(words):
    w = words.astype(np.int64) & 0xFFFFFFFF
    return np.stack([(w >> (4 * t)) & 15 for t in range(8)], 1).reshape(-1, words.shape[1])
def _unpack_cols(words):
    w = words.astype(np.int64) & 0xFFFFFFFF
    return np.stack([(w >> (4 * t)) & 15 for t in range(8)], -1).reshape(words.shape[0], -1)
def reference(x, qw, qz, s, g_idx):
    g = np.asarray(g_idx).astype(np.int64)
    w = (_unpack_rows(qw) - (_unpack_cols(qz)[g] + 1)) * s[g]
    return [x @ w]
def torch_impl(x, qw, qz, s, g_idx):
    import torch
    sh = torch.arange(0, 32, 4, device=qw.device, dtype=torch.int32)
    q = ((qw.unsqueeze(1) >> sh[None, :, None]) & 15).reshape(-1, qw.shape[1])
    z = ((qz.unsqueeze(-1) >> sh) & 15).reshape(qz.shape[0], -1) + 1
    g = g_idx.long()
    w = (q - z[g]).to(x.dtype) * s[g]
    return [x @ w]
