"""MLC-LLM q4f32_1 decode GEMV: W uint32 [N,K/8] (8 nibbles, low first), fp32 group scale [N,K/32], (q - 7) * s, fp32 activations and sum, TE, x [1,1,K], K=14336 N=4096 (Llama-3-8B down_proj, q4f32_1)."""
import numpy as np
from tvm import te
K, N = 14336, 4096
SMALL = dict(K=256, N=40)
def make():
    x = te.placeholder((1, 1, K), "float32", name="x")
    wq = te.placeholder((N, K // 8), "uint32", name="w_packed")
    sc = te.placeholder((N, K // 32), "float32", name="w_scale")
    deq = te.compute((N, K), lambda n, k: ((wq[n, k // 8] >> (k % 8 * 4).astype("uint32")) & te.const(15, "uint32"))
                     .astype("float32") - te.const(7, "float32"), name="decode_q")
    w = te.compute((N, K), lambda n, k: deq[n, k] * sc[n, k // 32], name="decode")
    r = te.reduce_axis((0, K), name="k")
    y = te.compute((1, 1, N), lambda b, s, n: te.sum(x[b, s, r] * w[n, r], axis=r), name="NT_matmul")
    return te.create_prim_func([x, wq, sc, y])
def inputs(rng):
    return [rng.uniform(-1, 1, (1, 1, K)).astype(np.float32),
            rng.integers(0, 2 ** 32, (N, K // 8), dtype=np.uint64).astype(np.uint32),
            (rng.uniform(0.5, 1.5, (N, K // 32)) / np.sqrt(K) / 4).astype(np.float32)]
def _deq(wq, sc):
    nib = (wq[:, :, None].astype(np.uint64) >> (4 * np.arange(8, dtype=np.uint64))) & 15
    return (nib.reshape(wq.shape[0], -1).astype(np.float64) - 7) * np.repeat(sc, 32, axis=1)
def reference(x, wq, sc):
    return [x @ _deq(wq, sc).T]
def torch_impl(x, wq, sc):
    import torch
    sh = torch.arange(8, device=wq.device, dtype=torch.int64) * 4
    q = ((wq.to(torch.int64)[:, :, None] >> sh) & 15).reshape(wq.shape[0], -1).float() - 7
    return [x @ (q * sc.repeat_interleave(32, 1)).T]
