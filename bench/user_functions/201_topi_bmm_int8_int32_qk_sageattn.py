"""Integer batched GEMM: topi.nn.batch_matmul(q int8 [B,M,K], k int8 [B,N,K], out_dtype='int32') (transpose_b, torch.bmm of per-head quantized q and k), exact int32, B=32 (heads) M=N=1024 K=128 (SageAttention-style int8 QK^T, Llama-2-7B at 1024 tokens)."""
import numpy as np
from tvm import te, topi
B, M, N, K = 32, 1024, 1024, 128
SMALL = dict(B=3, M=9, N=11, K=32)
def make():
    q = te.placeholder((B, M, K), "int8", name="q")
    k = te.placeholder((B, N, K), "int8", name="k")
    return te.create_prim_func([q, k, topi.nn.batch_matmul(q, k, out_dtype="int32")])
def inputs(rng):
    return [rng.integers(-128, 128, (B, M, K)).astype(np.int8), rng.integers(-128, 128, (B, N, K)).astype(np.int8)]
def reference(q, k):
    return [(q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2)).astype(np.int64)]
def torch_impl(q, k):
    import torch
    return [torch.stack([torch._int_mm(q[b], k[b].t().contiguous()) for b in range(B)])]
