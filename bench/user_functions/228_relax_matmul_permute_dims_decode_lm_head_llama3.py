"""Relax decode LM head: R.matmul(x [1,1,K], R.permute_dims(W [V,K])) in fp16 (no out_dtype: an fp16 sum), LegalizeOps then Relax's fusion passes (which leave the transpose apart), the legalized "matmul" PrimFunc reading the transposed weight W^T [K,V] (int64 indices), K=4096 V=128256 (Llama-3-8B lm_head at a decode step)."""
import numpy as np
from tvm import relax
K, V = 4096, 128256
SMALL = dict(K=64, V=72)
def make():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 1, K), "float16"))
    w = relax.Var("w", relax.TensorType((V, K), "float16"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, relax.op.permute_dims(w)))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    mod = relax.transform.AnnotateTIROpPattern()(mod)
    mod = relax.transform.FuseOps()(mod)
    mod = relax.transform.FuseTIR()(mod)
    return mod["matmul"]
def inputs(rng):
    return [rng.uniform(-1, 1, (1, 1, K)).astype(np.float32), (rng.uniform(-1, 1, (K, V)) * 2 / np.sqrt(K)).astype(np.float32)]
def reference(x, wt):
    return [x @ wt]
def torch_impl(x, wt):
    return [x @ wt]
