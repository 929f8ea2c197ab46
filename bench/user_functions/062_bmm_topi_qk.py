"""Batched matmul q @ k^T as topi.nn.batch_matmul (transpose_b default, out_dtype fp32) then cast, fp16, batch 32 (heads) x 512 x 512 x D=128."""
import numpy as np
from tvm import te, topi
BT, M, N, K = 32, 512, 512, 128
SMALL = dict(BT=2, M=8, N=8, K=16)
def make():
    a = te.placeholder((BT, M, K), "float16", name="q")
    b = te.placeholder((BT, N, K), "float16", name="k")
    return te.create_prim_func([a, b, topi.cast(topi.nn.batch_matmul(a, b, out_dtype="float32"), "float16")])
def inputs(rng):
    return [rng.uniform(-1, 1, (BT, M, K)).astype(np.float32), rng.uniform(-1, 1, (BT, N, K)).astype(np.float32)]
def reference(a, b):
    return [a @ b.swapaxes(-1, -2)]
def torch_impl(a, b):
    import torch
    return [torch.bmm(a, b.transpose(1, 2))]
