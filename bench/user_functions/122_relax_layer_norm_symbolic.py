"""Relax R.nn.layer_norm(x[1,n,H], gamma, beta) with symbolic tokens n (int64), LegalizeOps -> PrimFunc (TVM leaves the preceding residual R.add unfused: FuseOps keeps legalized layer_norm apart), fp16, H=768 (BERT-base post-LN), n typically 128..4096."""
import numpy as np
import tvm
from tvm import relax, tirx
H, SEQ = 768, 1024
SMALL = dict(H=64, SEQ=5)
def make():
    n = tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, n, H), "float16"))
    g = relax.Var("g", relax.TensorType((H,), "float16"))
    b = relax.Var("b", relax.TensorType((H,), "float16"))
    with bb.function("main", [x, g, b]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.layer_norm(x, g, b, axes=[-1], epsilon=1e-12))
        bb.emit_func_output(y)
    mod = relax.transform.LegalizeOps()(bb.get())
    return [f for g_, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)][0]
def inputs(rng):
    return [rng.standard_normal((1, SEQ, H)).astype(np.float32) * 2 + 0.5,
            rng.uniform(0.5, 1.5, (H,)).astype(np.float32), rng.uniform(-0.5, 0.5, (H,)).astype(np.float32)]
def reference(x, g, b):
    m = x.mean(-1, keepdims=True); v = ((x - m) ** 2).mean(-1, keepdims=True)
    return [(x - m) / np.sqrt(v + 1e-12) * g + b]
def torch_impl(x, g, b):
    import torch
    return [torch.nn.functional.layer_norm(x, (H,), g, b, 1e-12)]
