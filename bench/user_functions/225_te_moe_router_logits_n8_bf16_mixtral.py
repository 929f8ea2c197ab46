"""GEMM with N=8: a MoE router's logits for every token of a prefill batch, written as a plain TE te.sum of bf16 operands cast to fp32, fp32 logits [M,8] out, M=16384 (B=4 x S=4096) K=4096 (Mixtral-8x7B block_sparse_moe.gate, 8 experts)."""
import numpy as np
from tvm import te
M, K, E = 16384, 4096, 8
SMALL = dict(M=45, K=64, E=8)
def make():
    h = te.placeholder((M, K), "bfloat16", name="hidden")
    w = te.placeholder((E, K), "bfloat16", name="gate_w")
    k = te.reduce_axis((0, K), name="k")
    logits = te.compute((M, E), lambda t, e: te.sum(h[t, k].astype("float32") * w[e, k].astype("float32"), axis=k),
                        name="router_logits")
    return te.create_prim_func([h, w, logits])
def inputs(rng):
    return [rng.standard_normal((M, K)).astype(np.float32), (rng.uniform(-1, 1, (E, K)) / np.sqrt(K)).astype(np.float32)]
def reference(h, w):
    return [h @ w.T]
def torch_impl(h, w):
    import torch
    return [torch.nn.functional.linear(h.float(), w.float())]
