"""Paged multi-query decode attention in TVMScript: q [B,71,D] over one shared KV head whose pages k/v_cache [num_blocks,block,D] are gathered through block_table [B,max_blocks] int32 (k_cache[block_table[b, j // 16], j % 16, d]), masked by seq_lens [B] int32, T.sblock qk / mask / max / exp / sum / pv / normalize, fp16 (fp32 inside), B=16 Hq=71 D=64 block=16 max_blocks=128 (2048 tokens) num_blocks=2048 (Falcon-7B served by vLLM)."""
import numpy as np
from tvm.script import tirx as T
B, HQ, D, BS, MB, NB = 16, 71, 64, 16, 128, 2048
SMALL = dict(B=3, HQ=5, D=16, BS=4, MB=3, NB=11)
def make():
    b_, hq, d_, bs, mb, nb = B, HQ, D, BS, MB, NB
    L = MB * BS
    scale = float(D) ** -0.5
    @T.prim_func(s_tir=True)
    def main(q: T.Buffer((b_, hq, d_), "float16"), k_cache: T.Buffer((nb, bs, d_), "float16"),
             v_cache: T.Buffer((nb, bs, d_), "float16"), block_table: T.Buffer((b_, mb), "int32"),
             seq_lens: T.Buffer((b_,), "int32"), out: T.Buffer((b_, hq, d_), "float16")):
        T.func_attr({"tir.noalias": True})
        sc = T.alloc_buffer((b_, hq, L), "float32")
        ms = T.alloc_buffer((b_, hq, L), "float32")
        mx = T.alloc_buffer((b_, hq), "float32")
        ex = T.alloc_buffer((b_, hq, L), "float32")
        sm = T.alloc_buffer((b_, hq), "float32")
        acc = T.alloc_buffer((b_, hq, d_), "float32")
        for b, h, j, c in T.grid(b_, hq, L, d_):
            with T.sblock("qk"):
                vb, vh, vj, vc = T.axis.remap("SSSR", [b, h, j, c])
                with T.init():
                    sc[vb, vh, vj] = T.float32(0)
                sc[vb, vh, vj] = sc[vb, vh, vj] + T.Cast("float32", q[vb, vh, vc]) * T.Cast("float32", k_cache[block_table[vb, vj // bs], vj % bs, vc])
        for b, h, j in T.grid(b_, hq, L):
            with T.sblock("mask"):
                vb, vh, vj = T.axis.remap("SSS", [b, h, j])
                ms[vb, vh, vj] = T.if_then_else(vj < seq_lens[vb], sc[vb, vh, vj] * T.float32(scale), T.float32(-3.0e38))
        for b, h, j in T.grid(b_, hq, L):
            with T.sblock("max"):
                vb, vh, vj = T.axis.remap("SSR", [b, h, j])
                with T.init():
                    mx[vb, vh] = T.float32(-3.4e38)
                mx[vb, vh] = T.max(mx[vb, vh], ms[vb, vh, vj])
        for b, h, j in T.grid(b_, hq, L):
            with T.sblock("exp"):
                vb, vh, vj = T.axis.remap("SSS", [b, h, j])
                ex[vb, vh, vj] = T.exp(ms[vb, vh, vj] - mx[vb, vh])
        for b, h, j in T.grid(b_, hq, L):
            with T.sblock("sum"):
                vb, vh, vj = T.axis.remap("SSR", [b, h, j])
                with T.init():
                    sm[vb, vh] = T.float32(0)
                sm[vb, vh] = sm[vb, vh] + ex[vb, vh, vj]
        for b, h, c, j in T.grid(b_, hq, d_, L):
            with T.sblock("pv"):
                vb, vh, vc, vj = T.axis.remap("SSSR", [b, h, c, j])
                with T.init():
                    acc[vb, vh, vc] = T.float32(0)
                acc[vb, vh, vc] = acc[vb, vh, vc] + ex[vb, vh, vj] * T.Cast("float32", v_cache[block_table[vb, vj // bs], vj % bs, vc])
        for b, h, c in T.grid(b_, hq, d_):
            with T.sblock("normalize"):
                vb, vh, vc = T.axis.remap("SSS", [b, h, c])
                out[vb, vh, vc] = T.Cast("float16", acc[vb, vh, vc] / sm[vb, vh])
    return main
def inputs(rng):
    bt = np.stack([rng.permutation(NB)[:MB] for _ in range(B)]).astype(np.int32)
    lens = rng.integers(1, MB * BS + 1, (B,)).astype(np.int32); lens[0] = MB * BS
    return [rng.standard_normal((B, HQ, D)).astype(np.float32), rng.standard_normal((NB, BS, D)).astype(np.float32),
            rng.standard_normal((NB, BS, D)).astype(np.float32), bt, lens]
def reference(q, kc, vc, bt, lens):
    bt = bt.astype(np.int64)
    k = kc[bt].reshape(B, MB * BS, D); v = vc[bt].reshape(B, MB * BS, D)
    s = np.einsum("bhd,bjd->bhj", q, k) / np.sqrt(D)
    s = np.where(np.arange(MB * BS)[None, None] < lens[:, None, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [np.einsum("bhj,bjd->bhd", p, v)]
def torch_impl(q, kc, vc, bt, lens):
    import torch
    k = kc[bt.long()].reshape(B, 1, MB * BS, D); v = vc[bt.long()].reshape(B, 1, MB * BS, D)
    m = torch.arange(MB * BS, device=q.device)[None, None, None, :] < lens[:, None, None, None]
    return [torch.nn.functional.scaled_dot_product_attention(q[:, :, None], k.expand(B, HQ, MB * BS, D), v.expand(B, HQ, MB * BS, D), attn_mask=m)[:, :, 0]]
