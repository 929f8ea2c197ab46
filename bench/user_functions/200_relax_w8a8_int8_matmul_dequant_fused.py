"""Relax W8A8: R.matmul(x int8 [1,S,K], W int8 [K,N], out_dtype='int32') -> R.astype fp32 * per-token scale [1,S,1] * per-channel scale [N] -> R.astype fp16, LegalizeOps + AnnotateTIROpPattern + FuseOps + FuseTIR, the single fused PrimFunc (int64 indices), S=2048 K=4096 N=4096 (Llama-2-7B SmoothQuant o_proj)."""
import numpy as np
from tvm import relax, tirx
S, K, N = 2048, 4096, 4096
SMALL = dict(S=7, K=64, N=40)
def make():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, S, K), "int8"))
    w = relax.Var("w", relax.TensorType((K, N), "int8"))
    sx = relax.Var("sx", relax.TensorType((1, S, 1), "float32"))
    sw = relax.Var("sw", relax.TensorType((N,), "float32"))
    with bb.function("main", [x, w, sx, sw]):
        with bb.dataflow():
            acc = bb.emit(relax.op.matmul(x, w, out_dtype="int32"))
            y = bb.emit(relax.op.multiply(relax.op.multiply(relax.op.astype(acc, "float32"), sx), sw))
            out = bb.emit_output(relax.op.astype(y, "float16"))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    mod = relax.transform.AnnotateTIROpPattern()(mod)
    mod = relax.transform.FuseOps()(mod)
    mod = relax.transform.FuseTIR()(mod)
    fs = [f for g, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)]
    assert len(fs) == 1, [g.name_hint for g in mod.functions]
    return fs[0]
def inputs(rng):
    return [rng.integers(-127, 128, (1, S, K)).astype(np.int8), rng.integers(-127, 128, (K, N)).astype(np.int8),
            rng.uniform(0.5, 1.5, (1, S, 1)).astype(np.float32) / 127, rng.uniform(0.5, 1.5, (N,)).astype(np.float32) / (127 * np.sqrt(K))]
def reference(x, w, sx, sw):
    return [x.astype(np.float64) @ w.astype(np.float64) * sx * sw]
def torch_impl(x, w, sx, sw):
    import torch
    acc = torch._int_mm(x[0], w)
    return [(acc.float() * sx[0] * sw)[None].half()]
