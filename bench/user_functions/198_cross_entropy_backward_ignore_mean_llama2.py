"""Cross-entropy backward for integer targets with ignore_index -100 and reduction='mean' (the valid-token count reduced in-kernel over all rows): dlogits = (softmax(x) - onehot(label)) / n_valid on valid rows, 0 on ignored, TE, bf16 logits -> bf16 grad, int64 labels, rows 4096 (B=2 x S=2048) x vocab 32000 (Llama-2-7B SFT)."""
import numpy as np
from tvm import te, topi
R, V = 4096, 32000
SMALL = dict(R=9, V=50)
def make():
    x = te.placeholder((R, V), "bfloat16", name="logits")
    lab = te.placeholder((R,), "int64", name="labels")
    v1 = te.reduce_axis((0, V), name="v1")
    mx = te.compute((R,), lambda r: te.max(x[r, v1].astype("float32"), axis=v1), name="row_max")
    v2 = te.reduce_axis((0, V), name="v2")
    se = te.compute((R,), lambda r: te.sum(te.exp(x[r, v2].astype("float32") - mx[r]), axis=v2), name="row_sum")
    r1 = te.reduce_axis((0, R), name="r1")
    nv = te.compute((1,), lambda z: te.sum(te.if_then_else(lab[r1] != -100, 1.0, 0.0), axis=r1), name="n_valid")
    g = te.compute((R, V), lambda r, v: te.if_then_else(
        lab[r] != -100,
        (te.exp(x[r, v].astype("float32") - mx[r]) / se[r] - te.if_then_else(lab[r] == v.astype("int64"), 1.0, 0.0)) / nv[0],
        0.0), name="dlogits")
    return te.create_prim_func([x, lab, topi.cast(g, "bfloat16")])
def inputs(rng):
    lab = rng.integers(0, V, (R,)).astype(np.int64)
    lab[rng.random(R) < 0.1] = -100; lab[0] = 1
    return [(rng.standard_normal((R, V)) * 2).astype(np.float32), lab]
def reference(x, lab):
    lab = lab.astype(np.int64)
    p = np.exp(x - x.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    valid = lab != -100
    p[np.arange(R)[valid], lab[valid]] -= 1
    return [np.where(valid[:, None], p, 0.0) / valid.sum()]
def torch_impl(x, lab):
    import torch
    p = torch.softmax(x.float(), -1)
    valid = lab != -100
    g = p - torch.nn.functional.one_hot(lab.clamp(min=0), V).float()
    return [(g * valid[:, None] / valid.sum()).to(x.dtype)]
