"""MoE grouped GEMM at prefill: rows already sorted by expert (vLLM/MegaBlocks permute), each row's expert from an int32 index [R], y[r,n] = sum_k x[r,k] * W[expert[r],n,k], fp32 accumulation, TE, bf16, R=8192 (2048 tokens x top-4) E=60 K=2048 N=1408 (Qwen1.5-MoE-A2.7B expert gate_proj)."""
import numpy as np
from tvm import te
R, E, K, N = 8192, 60, 2048, 1408
SMALL = dict(R=37, E=5, K=64, N=48)
def make():
    x = te.placeholder((R, K), "bfloat16", name="x_sorted")
    eid = te.placeholder((R,), "int32", name="expert_of_row")
    w = te.placeholder((E, N, K), "bfloat16", name="w_gate")
    k = te.reduce_axis((0, K), name="k")
    y = te.compute((R, N), lambda r, n: te.sum(x[r, k].astype("float32") * w[eid[r], n, k].astype("float32"), axis=k), name="grouped")
    return te.create_prim_func([x, eid, w, te.compute((R, N), lambda r, n: y[r, n].astype("bfloat16"), name="y")])
def inputs(rng):
    eid = np.sort(rng.integers(0, E, R)).astype(np.int32)
    return [rng.uniform(-1, 1, (R, K)).astype(np.float32), eid, (rng.uniform(-1, 1, (E, N, K)) * 2 / np.sqrt(K)).astype(np.float32)]
def reference(x, eid, w):
    e = np.asarray(eid).astype(np.int64)
    out = np.empty((x.shape[0], w.shape[1]))
    for i in np.unique(e):
        out[e == i] = x[e == i] @ w[i].T
    return [out]
def torch_impl(x, eid, w):
    import torch
    return [torch.bmm(x.unsqueeze(1), w[eid.long()].transpose(1, 2)).squeeze(1)]
