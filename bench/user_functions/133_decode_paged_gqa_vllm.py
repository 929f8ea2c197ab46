"""Paged decode attention (vLLM layout): q [B,Hq,D], k/v caches [num_blocks,Hkv,block,D] gathered through block_table [B,max_blocks] int32, masked by context_lens [B] int32, GQA, TE explicit fp32 casts, fp16, B=8 Hq=32 Hkv=8 D=128 block=16 max_blocks=128 (2048 tokens) num_blocks=1024 (Llama-3-8B)."""
import numpy as np
from tvm import te, topi
B, HQ, HKV, D, BS, MB, NB = 8, 32, 8, 128, 16, 128, 1024
SMALL = dict(B=2, HQ=4, HKV=2, D=16, BS=4, MB=4, NB=10)
def make():
    G, L = HQ // HKV, MB * BS
    q = te.placeholder((B, HQ, D), "float16", name="q")
    kc = te.placeholder((NB, HKV, BS, D), "float16", name="k_cache")
    vc = te.placeholder((NB, HKV, BS, D), "float16", name="v_cache")
    bt = te.placeholder((B, MB), "int32", name="block_table")
    cl = te.placeholder((B,), "int32", name="context_lens")
    d = te.reduce_axis((0, D), name="d")
    sc = te.compute((B, HQ, L), lambda b, h, j: te.sum(q[b, h, d].astype("float32") * kc[bt[b, j // BS], h // G, j % BS, d].astype("float32"), axis=d), name="scores")
    ms = te.compute((B, HQ, L), lambda b, h, j: te.if_then_else(j < cl[b], sc[b, h, j] * float(D ** -0.5), -1e30), name="masked")
    p = topi.nn.softmax(ms, axis=-1)
    j = te.reduce_axis((0, L), name="j")
    o = te.compute((B, HQ, D), lambda b, h, c: te.sum(p[b, h, j] * vc[bt[b, j // BS], h // G, j % BS, c].astype("float32"), axis=j), name="o")
    return te.create_prim_func([q, kc, vc, bt, cl, topi.cast(o, "float16")])
def inputs(rng):
    bt = np.stack([rng.permutation(NB)[:MB] for _ in range(B)]).astype(np.int32)
    return [rng.standard_normal((B, HQ, D)).astype(np.float32), rng.standard_normal((NB, HKV, BS, D)).astype(np.float32),
            rng.standard_normal((NB, HKV, BS, D)).astype(np.float32), bt, rng.integers(1, MB * BS + 1, (B,)).astype(np.int32)]
def _gather(c, bt):  # -> [B, Hkv, L, D]
    return c[bt].transpose(0, 2, 1, 3, 4).reshape(bt.shape[0], HKV, MB * BS, D)
def reference(q, kc, vc, bt, cl):
    G = HQ // HKV
    k = np.repeat(_gather(kc, bt), G, 1); v = np.repeat(_gather(vc, bt), G, 1)
    s = np.einsum("bhd,bhjd->bhj", q, k) / np.sqrt(D)
    s = np.where(np.arange(MB * BS)[None, None] < cl[:, None, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [np.einsum("bhj,bhjd->bhd", p, v)]
def torch_impl(q, kc, vc, bt, cl):
    import torch
    G = HQ // HKV
    g = lambda c: c[bt.long()].permute(0, 2, 1, 3, 4).reshape(B, HKV, MB * BS, D).repeat_interleave(G, 1)
    m = torch.arange(MB * BS, device=q.device)[None, None, None, :] < cl[:, None, None, None]
    return [torch.nn.functional.scaled_dot_product_attention(q[:, :, None], g(kc), g(vc), attn_mask=m)[:, :, 0]]
