"""GEMM with N=2: a binary sequence-classification head over every position, topi.nn.dense(h, W [2,K], bias [2]) with its default fp16 accumulation, fp16, M=4096 (B=4 x S=1024) K=4096 (Llama-3-8B LlamaForSequenceClassification score, num_labels=2)."""
import numpy as np
from tvm import te, topi
M, K, NL = 4096, 4096, 2
SMALL = dict(M=37, K=96, NL=2)
def make():
    h = te.placeholder((M, K), "float16", name="hidden")
    w = te.placeholder((NL, K), "float16", name="score_w")
    b = te.placeholder((NL,), "float16", name="score_b")
    return te.create_prim_func([h, w, b, topi.nn.dense(h, w, b)])
def inputs(rng):
    return [rng.uniform(-1, 1, (M, K)).astype(np.float32), (rng.uniform(-1, 1, (NL, K)) * 2 / np.sqrt(K)).astype(np.float32),
            rng.uniform(-0.5, 0.5, (NL,)).astype(np.float32)]
def reference(h, w, b):
    return [h @ w.T + b]
def torch_impl(h, w, b):
    import torch
    return [torch.nn.functional.linear(h, w, b)]
