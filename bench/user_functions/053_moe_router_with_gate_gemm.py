"""MoE router incl. the gate GEMM: x @ Wr^T (fp32 accum) -> softmax -> topk 2 in one PrimFunc, TE+TOPI, fp16 x/Wr, tokens 512 x hidden 4096 x 8 experts (Mixtral)."""
import numpy as np
from tvm import te, topi
T_, Hd, E, K = 512, 4096, 8, 2
SMALL = dict(T_=5, Hd=64)
def make():
    x = te.placeholder((T_, Hd), "float16", name="x")
    w = te.placeholder((E, Hd), "float16", name="w_router")
    k = te.reduce_axis((0, Hd), name="k")
    logits = te.compute((T_, E), lambda t, e: te.sum(x[t, k].astype("float32") * w[e, k].astype("float32"), axis=k), name="logits")
    p = topi.nn.softmax(logits, axis=-1)
    vals, idx = topi.topk(p, k=K, axis=-1, ret_type="both", dtype="int32")
    return te.create_prim_func([x, w, vals, idx])
def inputs(rng):
    return [rng.uniform(-1, 1, (T_, Hd)).astype(np.float32), (rng.uniform(-1, 1, (E, Hd)) * 4 / np.sqrt(Hd)).astype(np.float32)]
def reference(x, w):
    l = x @ w.T
    p = np.exp(l - l.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    idx = np.argsort(-p, axis=-1, kind="stable")[:, :K]
    return [np.take_along_axis(p, idx, -1), idx.astype(np.float64)]
def torch_impl(x, w):
    import torch
    v, i = torch.topk(torch.softmax((x @ w.T).float(), -1), K, -1)
    return [v, i.int()]
