"""Relax R.matmul(x[1,n,K], W[K,N], out_dtype='float32') with a symbolic sequence n (int64), LegalizeOps -> PrimFunc, fp16 operands fp32 out, K=4096 N=14336 (Llama-3-8B up_proj, x @ W layout), n typically 1..8192."""
import numpy as np
import tvm
from tvm import relax, tirx
K, N, SEQ = 4096, 14336, 2048
SMALL = dict(K=64, N=48, SEQ=5)
def make():
    n = tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, n, K), "float16"))
    w = relax.Var("w", relax.TensorType((K, N), "float16"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.matmul(x, w, out_dtype="float32"))
        bb.emit_func_output(y)
    mod = relax.transform.LegalizeOps()(bb.get())
    return [f for g, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)][0]
def inputs(rng):
    return [rng.uniform(-1, 1, (1, SEQ, K)).astype(np.float32), (rng.uniform(-1, 1, (K, N)) / np.sqrt(K)).astype(np.float32)]
def reference(x, w):
    return [x @ w]
def torch_impl(x, w):
    return [(x @ w).float()]
