"""Decode GEMV over a GPTQ weight in its native layout: signed int32 qweight [K/8,N] packed along K (8 nibbles, low first, shifts on int32 then & 15), int32 qzeros [K/G,N/8] packed along N, fp16 scales [K/G,N], w = (q - (z + 1)) * s inline, fp32 accumulation, TE, fp16, x [1,K] K=14336 N=4096 G=128 (Mixtral-8x7B expert w2)."""
import numpy as np
from tvm import te
K, N, G = 14336, 4096, 128
SMALL = dict(K=256, N=48, G=64)
def make():
    x = te.placeholder((1, K), "float16", name="x")
    qw = te.placeholder((K // 8, N), "int32", name="qweight")
    qz = te.placeholder((K // G, N // 8), "int32", name="qzeros")
    s = te.placeholder((K // G, N), "float16", name="scales")
    k = te.reduce_axis((0, K), name="k")
    def f(i, j):
        q = ((qw[k // 8, j] >> (k % 8 * 4)) & 15).astype("float32")
        z = ((qz[k // G, j // 8] >> (j % 8 * 4)) & 15).astype("float32")
        return te.sum(x[i, k].astype("float32") * ((q - (z + 1.0)) * s[k // G, j].astype("float32")), axis=k)
    acc = te.compute((1, N), f, name="gptq_gemv")
    return te.create_prim_func([x, qw, qz, s, te.compute((1, N), lambda i, j: acc[i, j].astype("float16"), name="y")])
def _pack_rows(q):  # [R, C] -> [R/8, C]
    words = np.zeros((q.shape[0] // 8, q.shape[1]), np.uint32)
    for j in range(8):
        words |= q[j::8].astype(np.uint32) << np.uint32(4 * j)
    return words.view(np.int32)
def _unpack(words, axis):
    w = words.astype(np.int64) & 0xFFFFFFFF
    out = np.stack([(w >> (4 * j)) & 15 for j in range(8)], axis + 1)
    shape = list(words.shape)
    shape[axis] *= 8
    return out.reshape(shape)
def inputs(rng):
    return [rng.uniform(-1, 1, (1, K)).astype(np.float32), _pack_rows(rng.integers(0, 16, (K, N))),
            _pack_rows(rng.integers(5, 9, (K // G, N)).T).T.copy(),
            (rng.uniform(0.5, 1.5, (K // G, N)) / np.sqrt(K) / 4).astype(np.float32)]
def reference(x, qw, qz, s):
    w = (_unpack(qw, 0) - np.repeat(_unpack(qz, 1) + 1, G, 0)) * np.repeat(s, G, 0)
    return [x @ w]
def torch_impl(x, qw, qz, s):
    import torch
    sh = torch.arange(8, device=qw.device, dtype=torch.int32) * 4
    q = ((qw.unsqueeze(1) >> sh[None, :, None]) & 15).reshape(-1, qw.shape[1])
    z = ((qz.unsqueeze(-1) >> sh) & 15).reshape(qz.shape[0], -1)
    w = (q - (z + 1).repeat_interleave(G, 0)).to(x.dtype) * s.repeat_interleave(G, 0)
    return [x @ w]
