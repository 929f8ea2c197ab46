"""DeepSeek-V3-style router (no group limit): sigmoid scores, top-8 of 256 chosen on scores + e_score_correction_bias, weights = the unbiased scores gathered at those ids, normalized to sum 1, * 2.5, TE+TOPI, fp32, tokens 512."""
import numpy as np
from tvm import te, topi
T_, E, K, SCALE = 512, 256, 8, 2.5
SMALL = dict(T_=5, E=16)
def make():
    x = te.placeholder((T_, E), "float32", name="router_logits")
    bias = te.placeholder((E,), "float32", name="e_score_correction_bias")
    sc = topi.sigmoid(x)
    choice = topi.add(sc, bias)
    idx = topi.topk(choice, k=K, axis=-1, ret_type="indices", dtype="int32")
    w = te.compute((T_, K), lambda t, k: sc[t, idx[t, k]], name="gathered")
    r = te.reduce_axis((0, K), name="r")
    den = te.compute((T_,), lambda t: te.sum(w[t, r], axis=r), name="den")
    wn = te.compute((T_, K), lambda t, k: w[t, k] / (den[t] + 1e-20) * SCALE, name="weights")
    return te.create_prim_func([x, bias, wn, idx])
def inputs(rng):
    return [rng.standard_normal((T_, E)).astype(np.float32), rng.standard_normal((E,)).astype(np.float32) * 0.1]
def reference(x, bias):
    sc = 1 / (1 + np.exp(-x))
    idx = np.argsort(-(sc + bias), axis=-1, kind="stable")[:, :K]
    w = np.take_along_axis(sc, idx, -1)
    return [w / w.sum(-1, keepdims=True) * SCALE, idx]
def torch_impl(x, bias):
    import torch
    sc = torch.sigmoid(x)
    idx = torch.topk(sc + bias, K, -1).indices
    w = sc.gather(-1, idx)
    return [w / w.sum(-1, keepdim=True) * SCALE, idx.int()]
