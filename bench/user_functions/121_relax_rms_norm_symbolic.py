"""Relax R.nn.rms_norm(x[1,n,H], w[H]) with a symbolic sequence n (int64), LegalizeOps -> PrimFunc (fp32 inside, as legalize writes it), fp16, H=4096 (Llama-3-8B input_layernorm), n typically 1..8192."""
import numpy as np
import tvm
from tvm import relax, tirx
H, SEQ = 4096, 2048
SMALL = dict(H=64, SEQ=5)
def make():
    n = tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, n, H), "float16"))
    w = relax.Var("w", relax.TensorType((H,), "float16"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.rms_norm(x, w, axes=[-1], epsilon=1e-5))
        bb.emit_func_output(y)
    mod = relax.transform.LegalizeOps()(bb.get())
    return [f for g, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)][0]
def inputs(rng):
    return [rng.standard_normal((1, SEQ, H)).astype(np.float32), rng.uniform(0.5, 1.5, (H,)).astype(np.float32)]
def reference(x, w):
    return [x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * w]
def torch_impl(x, w):
    import torch
    return [torch.nn.functional.rms_norm(x, (H,), w, 1e-5)]
