"""GEMM with K=1: HF LlamaRotaryEmbedding.forward's inv_freq[B,64,1] @ positions[B,1,S] as topi.nn.batch_matmul(transpose_b=False), fp32, then emb = cat(freqs, freqs) transposed to [B,S,128] and cos / sin as bf16 (two outputs), TE+TOPI, B=1 S=8192 (Llama-3-8B, theta 500000)."""
import numpy as np
from tvm import te, topi
B, S, HALF = 1, 8192, 64
SMALL = dict(S=13, HALF=8)
def make():
    inv = te.placeholder((B, HALF, 1), "float32", name="inv_freq_expanded")
    pos = te.placeholder((B, 1, S), "float32", name="position_ids_expanded")
    freqs = topi.nn.batch_matmul(inv, pos, transpose_b=False)
    emb = te.compute((B, S, 2 * HALF), lambda b, s, d: freqs[b, d % HALF, s], name="emb")
    cos = te.compute((B, S, 2 * HALF), lambda b, s, d: te.cos(emb[b, s, d]).astype("bfloat16"), name="cos")
    sin = te.compute((B, S, 2 * HALF), lambda b, s, d: te.sin(emb[b, s, d]).astype("bfloat16"), name="sin")
    return te.create_prim_func([inv, pos, cos, sin])
def inputs(rng):
    inv = (500000.0 ** (-np.arange(0, 2 * HALF, 2) / (2 * HALF))).astype(np.float32)
    return [np.broadcast_to(inv[None, :, None], (B, HALF, 1)).copy(), np.broadcast_to(np.arange(S, dtype=np.float32)[None, None, :], (B, 1, S)).copy()]
def reference(inv, pos):
    f = (inv @ pos).swapaxes(1, 2)
    emb = np.concatenate([f, f], -1)
    return [np.cos(emb), np.sin(emb)]
def torch_impl(inv, pos):
    import torch
    f = (inv.float() @ pos.float()).transpose(1, 2)
    emb = torch.cat((f, f), dim=-1)
    return [emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)]
