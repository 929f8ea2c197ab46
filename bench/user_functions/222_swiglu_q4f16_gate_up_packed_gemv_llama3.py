"""SwiGLU at decode over two q4f16 packed weights: gate and up each uint32 [N,K/8] (8 nibbles, low first) with fp16 group scales [N,K/32], (q - 7) * s, two fp32-accumulated GEMVs meeting in silu(g) * u, fp16 out, TE, x [1,K], K=4096 N=14336 (Llama-3-8B gate_proj/up_proj)."""
import numpy as np
from tvm import te
K, N = 4096, 14336
SMALL = dict(K=128, N=40)
def _decode(wq, sc, name):
    return te.compute((N, K), lambda n, k: (((wq[n, k // 8] >> (k % 8 * 4).astype("uint32")) & te.const(15, "uint32"))
                                            .astype("float16") - te.const(7, "float16")) * sc[n, k // 32], name=name)
def make():
    x = te.placeholder((1, K), "float16", name="x")
    gq = te.placeholder((N, K // 8), "uint32", name="gate_packed")
    gs = te.placeholder((N, K // 32), "float16", name="gate_scale")
    uq = te.placeholder((N, K // 8), "uint32", name="up_packed")
    us = te.placeholder((N, K // 32), "float16", name="up_scale")
    wg, wu = _decode(gq, gs, "decode_gate"), _decode(uq, us, "decode_up")
    r1, r2 = te.reduce_axis((0, K), name="k1"), te.reduce_axis((0, K), name="k2")
    g = te.compute((1, N), lambda i, n: te.sum(x[i, r1].astype("float32") * wg[n, r1].astype("float32"), axis=r1), name="gate")
    u = te.compute((1, N), lambda i, n: te.sum(x[i, r2].astype("float32") * wu[n, r2].astype("float32"), axis=r2), name="up")
    y = te.compute((1, N), lambda i, n: (g[i, n] * te.sigmoid(g[i, n]) * u[i, n]).astype("float16"), name="silu_mul")
    return te.create_prim_func([x, gq, gs, uq, us, y])
def inputs(rng):
    def packed():
        return rng.integers(0, 2 ** 32, (N, K // 8), dtype=np.uint64).astype(np.uint32)
    def scale():
        return (rng.uniform(0.5, 1.5, (N, K // 32)) / np.sqrt(K) / 2).astype(np.float32)
    return [rng.uniform(-1, 1, (1, K)).astype(np.float32), packed(), scale(), packed(), scale()]
def _deq(wq, sc):
    nib = (wq[:, :, None].astype(np.uint64) >> (4 * np.arange(8, dtype=np.uint64))) & 15
    return (nib.reshape(wq.shape[0], -1).astype(np.float64) - 7) * np.repeat(sc, 32, axis=1)
def reference(x, gq, gs, uq, us):
    g, u = x @ _deq(gq, gs).T, x @ _deq(uq, us).T
    return [g / (1 + np.exp(-g)) * u]
def torch_impl(x, gq, gs, uq, us):
    import torch
    sh = torch.arange(8, device=gq.device, dtype=torch.int64) * 4
    def deq(wq, sc):
        q = ((wq.to(torch.int64)[:, :, None] >> sh) & 15).reshape(wq.shape[0], -1).to(x.dtype) - 7
        return q * sc.repeat_interleave(32, 1)
    g, u = (x.float() @ deq(gq, gs).float().T), (x.float() @ deq(uq, us).float().T)
    return [(torch.nn.functional.silu(g) * u).to(x.dtype)]
