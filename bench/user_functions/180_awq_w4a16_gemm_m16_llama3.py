"""AWQ W4A16 GEMM at M=16 (batched decode): int32 qweight [K,N/8] packed along N in AWQ's interleaved nibble order (column j of 8 in slot (j%2)*4 + j//2), int32 qzeros [K/128,N/8] same packing, fp16 scales [K/128,N], w = (q - z) * s inline, fp32 accumulation, TE, fp16, M=16 K=4096 N=14336 (Llama-3-8B AWQ up_proj)."""
import numpy as np
from tvm import te, tirx
M, K, N, G = 16, 4096, 14336, 128
SMALL = dict(M=16, K=256, N=48, G=64)
def _nib(word, j):
    return (word >> ((j % 8 % 2 * 4 + j % 8 // 2) * 4).astype("int32")) & 15
def make():
    x = te.placeholder((M, K), "float16", name="x")
    qw = te.placeholder((K, N // 8), "int32", name="qweight")
    qz = te.placeholder((K // G, N // 8), "int32", name="qzeros")
    s = te.placeholder((K // G, N), "float16", name="scales")
    k = te.reduce_axis((0, K), name="k")
    def f(i, j):
        q = _nib(qw[k, j // 8], j).astype("float32")
        z = _nib(qz[k // G, j // 8], j).astype("float32")
        return te.sum(x[i, k].astype("float32") * ((q - z) * s[k // G, j].astype("float32")), axis=k)
    acc = te.compute((M, N), f, name="awq_gemm")
    return te.create_prim_func([x, qw, qz, s, te.compute((M, N), lambda i, j: acc[i, j].astype("float16"), name="y")])
_SLOT = np.array([0, 4, 1, 5, 2, 6, 3, 7])
def _pack(q):
    r, c = q.shape
    words = np.zeros((r, c // 8), np.uint32)
    for j in range(8):
        words |= q[:, j::8].astype(np.uint32) << np.uint32(4 * _SLOT[j])
    return words.view(np.int32)
def _unpack(words):
    w = words.astype(np.int64) & 0xFFFFFFFF
    out = np.stack([(w >> (4 * _SLOT[j])) & 15 for j in range(8)], -1)
    return out.reshape(words.shape[0], -1)
def inputs(rng):
    return [rng.uniform(-1, 1, (M, K)).astype(np.float32), _pack(rng.integers(0, 16, (K, N))),
            _pack(rng.integers(6, 10, (K // G, N))), (rng.uniform(0.5, 1.5, (K // G, N)) / np.sqrt(K) / 4).astype(np.float32)]
def reference(x, qw, qz, s):
    w = (_unpack(qw) - np.repeat(_unpack(qz), G, 0)) * np.repeat(s, G, 0)
    return [x @ w]
def torch_impl(x, qw, qz, s):
    import torch
    shifts = torch.tensor(4 * _SLOT, device=qw.device, dtype=torch.int32)
    def un(t):
        return ((t.unsqueeze(-1) >> shifts) & 15).reshape(t.shape[0], -1)
    w = (un(qw) - un(qz).repeat_interleave(G, 0)).to(x.dtype) * s.repeat_interleave(G, 0)
    return [x @ w]
