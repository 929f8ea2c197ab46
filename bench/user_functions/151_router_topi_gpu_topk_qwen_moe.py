"""MoE router with the GPU top-k: topi.nn.softmax over 60 experts then topi.gpu.topk k=4 (built under a CUDA target, values + int32 ids), fp32, tokens 2048 (Qwen1.5-MoE-A2.7B). SMALL swaps in topi.topk (same math) since topi.gpu.topk's IR is thread-bound and cannot run on llvm."""
import numpy as np
import tvm
from tvm import te, topi
T_, E, K = 2048, 60, 4
GPU_TOPK = True
SMALL = dict(T_=5, GPU_TOPK=False)
def make():
    x = te.placeholder((T_, E), "float32", name="router_logits")
    p = topi.nn.softmax(x, axis=-1)
    if GPU_TOPK:
        with tvm.target.Target("cuda"):
            vals, idx = topi.gpu.topk(p, k=K, axis=-1, ret_type="both", dtype="int32")
    else:
        vals, idx = topi.topk(p, k=K, axis=-1, ret_type="both", dtype="int32")
    return te.create_prim_func([x, vals, idx])
def inputs(rng):
    return [rng.standard_normal((T_, E)).astype(np.float32)]
def reference(x):
    p = np.exp(x - x.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    idx = np.argsort(-p, axis=-1, kind="stable")[:, :K]
    return [np.take_along_axis(p, idx, -1), idx]
def torch_impl(x):
    import torch
    v, i = torch.topk(torch.softmax(x, -1), K, -1)
    return [v, i.int()]
