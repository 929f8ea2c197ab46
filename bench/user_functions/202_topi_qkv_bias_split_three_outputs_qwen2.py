"""Fused QKV projection with bias split into three outputs: topi.nn.dense(x, W_qkv [Nq+2Nkv, K], out_dtype=fp32) + bias (bf16 cast up) -> bf16 -> topi.strided_slice into q [M,3584], k [M,512], v [M,512], bf16, M=2048 K=3584 (Qwen2-7B q/k/v_proj with bias, 28 q heads and 4 kv heads of 128)."""
import numpy as np
from tvm import te, topi
M, K, NQ, NKV = 2048, 3584, 3584, 512
SMALL = dict(M=7, K=64, NQ=32, NKV=16)
def make():
    n = NQ + 2 * NKV
    x = te.placeholder((M, K), "bfloat16", name="x")
    w = te.placeholder((n, K), "bfloat16", name="w_qkv")
    b = te.placeholder((n,), "bfloat16", name="b_qkv")
    y = topi.cast(topi.add(topi.nn.dense(x, w, out_dtype="float32"), topi.cast(b, "float32")), "bfloat16")
    q = topi.strided_slice(y, [0, 0], [M, NQ])
    k = topi.strided_slice(y, [0, NQ], [M, NQ + NKV])
    v = topi.strided_slice(y, [0, NQ + NKV], [M, n])
    return te.create_prim_func([x, w, b, q, k, v])
def inputs(rng):
    n = NQ + 2 * NKV
    return [rng.uniform(-1, 1, (M, K)).astype(np.float32), (rng.uniform(-1, 1, (n, K)) * 2 / np.sqrt(K)).astype(np.float32),
            rng.uniform(-1, 1, (n,)).astype(np.float32)]
def reference(x, w, b):
    y = x @ w.T + b
    return [y[:, :NQ], y[:, NQ:NQ + NKV], y[:, NQ + NKV:]]
def torch_impl(x, w, b):
    import torch
    y = torch.nn.functional.linear(x, w, b)
    return list(y.split([NQ, NKV, NKV], dim=-1))
