"""Relax R.nn.linear(x, W, b) -> R.nn.gelu_tanh, LegalizeOps + AnnotateTIROpPattern + FuseOps + FuseTIR, the fused_matmul_add_gelu_tanh PrimFunc (FuseOps leaves the weight transpose in its own kernel, so it reads W^T [K,N]), fp16, x [4,256,1024] W [4096,1024] (GPT-2-medium c_fc + gelu_new)."""
import numpy as np
import tvm
from tvm import relax, tirx
B, S, K, N = 4, 256, 1024, 4096
SMALL = dict(B=1, S=5, K=64, N=48)
def make():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((B, S, K), "float16"))
    w = relax.Var("w", relax.TensorType((N, K), "float16"))
    b = relax.Var("b", relax.TensorType((N,), "float16"))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            h = bb.emit(relax.op.linear(x, w, b))
            y = bb.emit_output(relax.op.nn.gelu_tanh(h))
        bb.emit_func_output(y)
    mod = relax.transform.LegalizeOps()(bb.get())
    mod = relax.transform.AnnotateTIROpPattern()(mod)
    mod = relax.transform.FuseOps()(mod)
    mod = relax.transform.FuseTIR()(mod)
    fs = {g.name_hint: f for g, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}
    return fs["fused_matmul_add_gelu_tanh"]
def inputs(rng):
    return [rng.uniform(-1, 1, (B, S, K)).astype(np.float32), (rng.uniform(-1, 1, (K, N)) / np.sqrt(K)).astype(np.float32),
            rng.uniform(-0.5, 0.5, (N,)).astype(np.float32)]
def reference(x, w, b):
    h = x @ w + b
    return [0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))]
def torch_impl(x, w, b):
    import torch
    return [torch.nn.functional.gelu(x @ w + b, approximate="tanh")]
