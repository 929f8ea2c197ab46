"""Relax R.matmul(x[B,S,K], W[K,N]) + b -> R.nn.gelu (erf), LegalizeOps + AnnotateTIROpPattern + FuseOps + FuseTIR, the fused_matmul_add_gelu PrimFunc (int64 indices), fp16, B=8 S=128 K=1024 N=4096 (BERT-large intermediate dense)."""
import numpy as np
import tvm
from tvm import relax, tirx
B, S, K, N = 8, 128, 1024, 4096
SMALL = dict(B=1, S=5, K=64, N=48)
def make():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((B, S, K), "float16"))
    w = relax.Var("w", relax.TensorType((K, N), "float16"))
    b = relax.Var("b", relax.TensorType((N,), "float16"))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            h = bb.emit(relax.op.add(relax.op.matmul(x, w), b))
            y = bb.emit_output(relax.op.nn.gelu(h))
        bb.emit_func_output(y)
    mod = relax.transform.LegalizeOps()(bb.get())
    mod = relax.transform.AnnotateTIROpPattern()(mod)
    mod = relax.transform.FuseOps()(mod)
    mod = relax.transform.FuseTIR()(mod)
    fs = {g.name_hint: f for g, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}
    return fs["fused_matmul_add_gelu"]
def inputs(rng):
    return [rng.uniform(-1, 1, (B, S, K)).astype(np.float32), (rng.uniform(-1, 1, (K, N)) * 2 / np.sqrt(K)).astype(np.float32),
            rng.uniform(-0.5, 0.5, (N,)).astype(np.float32)]
def reference(x, w, b):
    from math import erf
    h = x @ w + b
    return [0.5 * h * (1 + np.vectorize(erf)(h / np.sqrt(2)))]
def torch_impl(x, w, b):
    import torch
    return [torch.nn.functional.gelu(x @ w + b)]
