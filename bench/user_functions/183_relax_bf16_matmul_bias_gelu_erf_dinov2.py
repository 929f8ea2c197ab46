"""Relax bf16 FFN fc1: R.matmul(x[B,S,K], W[K,N], out_dtype=fp32) + R.astype(b, fp32) -> R.nn.gelu (erf) -> R.astype(bf16), LegalizeOps + AnnotateTIROpPattern + FuseOps + FuseTIR, the fused_matmul_cast_add_gelu_cast PrimFunc (int64 indices), B=4 S=257 K=1024 N=4096 (DINOv2-L/14 mlp.fc1, 224px)."""
import numpy as np
from tvm import relax, tirx
B, S, K, N = 4, 257, 1024, 4096
SMALL = dict(B=2, S=5, K=64, N=48)
def make():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((B, S, K), "bfloat16"))
    w = relax.Var("w", relax.TensorType((K, N), "bfloat16"))
    b = relax.Var("b", relax.TensorType((N,), "bfloat16"))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(x, w, out_dtype="float32"))
            h = bb.emit(relax.op.add(h, relax.op.astype(b, "float32")))
            y = bb.emit_output(relax.op.astype(relax.op.nn.gelu(h), "bfloat16"))
        bb.emit_func_output(y)
    mod = relax.transform.LegalizeOps()(bb.get())
    mod = relax.transform.AnnotateTIROpPattern()(mod)
    mod = relax.transform.FuseOps()(mod)
    mod = relax.transform.FuseTIR()(mod)
    fs = [f for g, f in mod.functions.items() if isinstance(f, tirx.PrimFunc) and g.name_hint.startswith("fused_matmul")]
    assert len(fs) == 1, [g.name_hint for g in mod.functions]
    return fs[0]
def inputs(rng):
    return [rng.uniform(-1, 1, (B, S, K)).astype(np.float32), (rng.uniform(-1, 1, (K, N)) * 2 / np.sqrt(K)).astype(np.float32),
            rng.uniform(-0.5, 0.5, (N,)).astype(np.float32)]
def reference(x, w, b):
    from math import erf
    h = x @ w + b
    return [0.5 * h * (1 + np.vectorize(erf)(h / np.sqrt(2)))]
def torch_impl(x, w, b):
    import torch
    return [torch.nn.functional.gelu((x @ w).float() + b.float()).to(torch.bfloat16)]
