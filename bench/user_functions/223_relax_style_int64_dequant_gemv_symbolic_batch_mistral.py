"""Fused dequantize + NT matmul as a Relax-lowered module writes it (MLC's fused_fused_decode1_NT_matmul, private, tir.noalias, all indices T.int64): weights first (uint32 [N,K/8] nibbles low first, fp16 scale [N,K/32]), x [b,1,K] with a symbolic batch b = T.int64() bound by T.match_buffer, fp16 sum, K=4096 N=14336 (Mistral-7B gate_proj, b = 1 at decode)."""
import numpy as np
from tvm.script import tirx as T
K, N = 4096, 14336
SMALL = dict(K=128, N=40)
SYMBOLIC = {"b": [1, 4]}
def make():
    k_, n_ = T.int64(K), T.int64(N)
    @T.prim_func(private=True, s_tir=True)
    def fused_fused_decode1_NT_matmul(lv1: T.Buffer((n_, T.int64(K // 8)), "uint32"),
                                      lv2: T.Buffer((n_, T.int64(K // 32)), "float16"),
                                      p_lv3: T.handle, p_output0: T.handle):
        T.func_attr({"tir.noalias": True})
        b = T.int64()
        lv3 = T.match_buffer(p_lv3, (b, T.int64(1), k_), "float16")
        var_NT_matmul_intermediate = T.match_buffer(p_output0, (b, T.int64(1), n_), "float16")
        p_output0_intermediate = T.alloc_buffer((n_, k_), "float16")
        for i, j in T.grid(n_, k_):
            with T.sblock("decode"):
                v_i, v_j = T.axis.remap("SS", [i, j])
                T.reads(lv1[v_i, v_j // T.int64(8)], lv2[v_i, v_j // T.int64(32)])
                T.writes(p_output0_intermediate[v_i, v_j])
                p_output0_intermediate[v_i, v_j] = (T.Cast("float16", T.bitwise_and(T.shift_right(
                    lv1[v_i, v_j // T.int64(8)], T.Cast("uint32", v_j % T.int64(8)) * T.uint32(4)), T.uint32(15)))
                    - T.float16(7)) * lv2[v_i, v_j // T.int64(32)]
        for i0, i1, i2, k in T.grid(b, T.int64(1), n_, k_):
            with T.sblock("NT_matmul"):
                v_i0, v_i1, v_i2, v_k = T.axis.remap("SSSR", [i0, i1, i2, k])
                T.reads(lv3[v_i0, v_i1, v_k], p_output0_intermediate[v_i2, v_k])
                T.writes(var_NT_matmul_intermediate[v_i0, v_i1, v_i2])
                with T.init():
                    var_NT_matmul_intermediate[v_i0, v_i1, v_i2] = T.float16(0)
                var_NT_matmul_intermediate[v_i0, v_i1, v_i2] = (var_NT_matmul_intermediate[v_i0, v_i1, v_i2]
                                                                + lv3[v_i0, v_i1, v_k] * p_output0_intermediate[v_i2, v_k])
    return fused_fused_decode1_NT_matmul
def inputs(rng, b):
    return [rng.integers(0, 2 ** 32, (N, K // 8), dtype=np.uint64).astype(np.uint32),
            (rng.uniform(0.5, 1.5, (N, K // 32)) / np.sqrt(K) / 4).astype(np.float32),
            rng.uniform(-1, 1, (b, 1, K)).astype(np.float32)]
def _deq(wq, sc):
    nib = (wq[:, :, None].astype(np.uint64) >> (4 * np.arange(8, dtype=np.uint64))) & 15
    return (nib.reshape(wq.shape[0], -1).astype(np.float64) - 7) * np.repeat(sc, 32, axis=1)
def reference(wq, sc, x, b):
    return [x @ _deq(wq, sc).T]
def torch_impl(wq, sc, x, b):
    import torch
    sh = torch.arange(8, device=wq.device, dtype=torch.int64) * 4
    q = ((wq.to(torch.int64)[:, :, None] >> sh) & 15).reshape(wq.shape[0], -1).to(x.dtype) - 7
    return [x @ (q * sc.repeat_interleave(32, 1)).T]
