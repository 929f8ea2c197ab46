"""MLC-LLM q4f16_1 decode GEMV with a bias: W uint32 [N,K/8] (8 nibbles, low first), fp16 group scale [N,K/32], (q - 7) * s, fp16 sum as MLC writes it, then + fp16 bias [N] in its own block (MLC's fused_fused_decode_NT_matmul_add), TE, x [1,1,K], K=3584 N=3584 (Qwen2-7B q_proj with bias)."""
import numpy as np
from tvm import te
K, N = 3584, 3584
SMALL = dict(K=128, N=40)
def make():
    x = te.placeholder((1, 1, K), "float16", name="x")
    wq = te.placeholder((N, K // 8), "uint32", name="w_packed")
    sc = te.placeholder((N, K // 32), "float16", name="w_scale")
    bias = te.placeholder((N,), "float16", name="bias")
    w = te.compute((N, K), lambda n, k: (((wq[n, k // 8] >> (k % 8 * 4).astype("uint32")) & te.const(15, "uint32"))
                                         .astype("float16") - te.const(7, "float16")) * sc[n, k // 32], name="decode")
    r = te.reduce_axis((0, K), name="k")
    mm = te.compute((1, 1, N), lambda b, s, n: te.sum(x[b, s, r] * w[n, r], axis=r), name="NT_matmul")
    y = te.compute((1, 1, N), lambda b, s, n: mm[b, s, n] + bias[n], name="T_add")
    return te.create_prim_func([x, wq, sc, bias, y])
def inputs(rng):
    return [rng.uniform(-1, 1, (1, 1, K)).astype(np.float32),
            rng.integers(0, 2 ** 32, (N, K // 8), dtype=np.uint64).astype(np.uint32),
            (rng.uniform(0.5, 1.5, (N, K // 32)) / np.sqrt(K) / 4).astype(np.float32),
            rng.uniform(-0.5, 0.5, (N,)).astype(np.float32)]
def _deq(wq, sc):
    nib = (wq[:, :, None].astype(np.uint64) >> (4 * np.arange(8, dtype=np.uint64))) & 15
    return (nib.reshape(wq.shape[0], -1).astype(np.float64) - 7) * np.repeat(sc, 32, axis=1)
def reference(x, wq, sc, bias):
    return [x @ _deq(wq, sc).T + bias]
def torch_impl(x, wq, sc, bias):
    import torch
    sh = torch.arange(8, device=wq.device, dtype=torch.int64) * 4
    q = ((wq.to(torch.int64)[:, :, None] >> sh) & 15).reshape(wq.shape[0], -1).to(x.dtype) - 7
    return [x @ (q * sc.repeat_interleave(32, 1)).T + bias]
