"""Decode GEMV over 4-bit codes in bf16 throughout (an MLC q4bf16-style build): W uint32 [N,K/8] (8 nibbles, low first), codes cast to bf16, (q - 8) * s with a bf16 group scale [N,K/32], a bf16 sum as TE writes te.sum of bf16 products, TE, x [1,1,K] bf16, K=18944 N=3584 (Qwen2-7B down_proj)."""
import numpy as np
from tvm import te
K, N = 18944, 3584
SMALL = dict(K=128, N=40)
def make():
    x = te.placeholder((1, 1, K), "bfloat16", name="x")
    wq = te.placeholder((N, K // 8), "uint32", name="w_packed")
    sc = te.placeholder((N, K // 32), "bfloat16", name="w_scale")
    w = te.compute((N, K), lambda n, k: (((wq[n, k // 8] >> (k % 8 * 4).astype("uint32")) & te.const(15, "uint32"))
                                         .astype("bfloat16") - te.const(8, "bfloat16")) * sc[n, k // 32], name="decode")
    r = te.reduce_axis((0, K), name="k")
    y = te.compute((1, 1, N), lambda b, s, n: te.sum(x[b, s, r] * w[n, r], axis=r), name="NT_matmul")
    return te.create_prim_func([x, wq, sc, y])
def inputs(rng):
    return [rng.uniform(-1, 1, (1, 1, K)).astype(np.float32),
            rng.integers(0, 2 ** 32, (N, K // 8), dtype=np.uint64).astype(np.uint32),
            (rng.uniform(0.5, 1.5, (N, K // 32)) / np.sqrt(K) / 4).astype(np.float32)]
def _deq(wq, sc):
    nib = (wq[:, :, None].astype(np.uint64) >> (4 * np.arange(8, dtype=np.uint64))) & 15
    return (nib.reshape(wq.shape[0], -1).astype(np.float64) - 8) * np.repeat(sc, 32, axis=1)
def reference(x, wq, sc):
    return [x @ _deq(wq, sc).T]
def torch_impl(x, wq, sc):
    import torch
    sh = torch.arange(8, device=wq.device, dtype=torch.int64) * 4
    q = ((wq.to(torch.int64)[:, :, None] >> sh) & 15).reshape(wq.shape[0], -1).to(x.dtype) - 8
    return [x @ (q * sc.repeat_interleave(32, 1)).T]
