"""MLC-LLM q3f16_1-style decode GEMV: 3-bit codes, 10 to a uint32 (bits 0..29), W [N,ceil(K/10)], fp16 group scale [N,ceil(K/40)], (q - 3) * s, fp16 sum as MLC writes it, TE, x [1,1,K], K=4096 (not a multiple of 10 or 40: the last word holds 6 codes) N=4096 (Llama-3-8B q_proj)."""
import numpy as np
from tvm import te
K, N = 4096, 4096
SMALL = dict(K=96, N=40)
def make():
    kw, ks = (K + 9) // 10, (K + 39) // 40
    x = te.placeholder((1, 1, K), "float16", name="x")
    wq = te.placeholder((N, kw), "uint32", name="w_packed")
    sc = te.placeholder((N, ks), "float16", name="w_scale")
    w = te.compute((N, K), lambda n, k: (((wq[n, k // 10] >> (k % 10 * 3).astype("uint32")) & te.const(7, "uint32"))
                                         .astype("float16") - te.const(3, "float16")) * sc[n, k // 40], name="decode")
    r = te.reduce_axis((0, K), name="k")
    y = te.compute((1, 1, N), lambda b, s, n: te.sum(x[b, s, r] * w[n, r], axis=r), name="NT_matmul")
    return te.create_prim_func([x, wq, sc, y])
def inputs(rng):
    kw, ks = (K + 9) // 10, (K + 39) // 40
    codes = rng.integers(0, 8, (N, kw * 10)).astype(np.uint64)
    words = sum(codes[:, j::10] << np.uint64(3 * j) for j in range(10)).astype(np.uint32)
    return [rng.uniform(-1, 1, (1, 1, K)).astype(np.float32), words,
            (rng.uniform(0.5, 1.5, (N, ks)) / np.sqrt(K) / 2).astype(np.float32)]
def _deq(wq, sc):
    codes = (wq[:, :, None].astype(np.uint64) >> (3 * np.arange(10, dtype=np.uint64))) & 7
    q = codes.reshape(wq.shape[0], -1)[:, :K].astype(np.float64) - 3
    return q * np.repeat(sc, 40, axis=1)[:, :K]
def reference(x, wq, sc):
    return [x @ _deq(wq, sc).T]
def torch_impl(x, wq, sc):
    import torch
    sh = torch.arange(10, device=wq.device, dtype=torch.int64) * 3
    q = ((wq.to(torch.int64)[:, :, None] >> sh) & 7).reshape(wq.shape[0], -1)[:, :K].to(x.dtype) - 3
    return [x @ (q * sc.repeat_interleave(40, 1)[:, :K]).T]
