"""Relax-legalized matmul x[1,S,K] @ W[K,N] + bias, TVMScript with T.int64 indices, fp16 accumulation as legalize emits, S=100 K=4096 N=4096."""
import numpy as np
import tvm
from tvm.script import tirx as T
S, K, N = 100, 4096, 4096
SMALL = dict(S=7, K=64, N=32)
def make():
    s, k_, n = T.int64(S), T.int64(K), T.int64(N)
    @T.prim_func(s_tir=True)
    def main(x: T.Buffer((T.int64(1), s, k_), "float16"), w: T.Buffer((k_, n), "float16"),
             b: T.Buffer((n,), "float16"), o: T.Buffer((T.int64(1), s, n), "float16")):
        T.func_attr({"tir.noalias": True})
        mm = T.alloc_buffer((T.int64(1), s, n), "float16")
        for i0, i1, i2, kk in T.grid(T.int64(1), s, n, k_):
            with T.sblock("matmul"):
                v0, v1, v2, vk = T.axis.remap("SSSR", [i0, i1, i2, kk])
                T.reads(x[v0, v1, vk], w[vk, v2])
                T.writes(mm[v0, v1, v2])
                with T.init():
                    mm[v0, v1, v2] = T.float16(0)
                mm[v0, v1, v2] = mm[v0, v1, v2] + x[v0, v1, vk] * w[vk, v2]
        for i0, i1, i2 in T.grid(T.int64(1), s, n):
            with T.sblock("add"):
                v0, v1, v2 = T.axis.remap("SSS", [i0, i1, i2])
                o[v0, v1, v2] = mm[v0, v1, v2] + b[v2]
    return main
def inputs(rng):
    return [rng.uniform(-1, 1, (1, S, K)).astype(np.float32), (rng.uniform(-1, 1, (K, N)) / np.sqrt(K)).astype(np.float32),
            rng.uniform(-1, 1, (N,)).astype(np.float32)]
def reference(x, w, b):
    return [x @ w + b]
def torch_impl(x, w, b):
    return [x @ w + b]
