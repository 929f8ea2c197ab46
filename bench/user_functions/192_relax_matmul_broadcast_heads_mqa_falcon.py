"""Relax R.matmul with a broadcast batch axis: MQA scores q [B,71,S,D] @ k^T [B,1,D,S] (one KV head broadcast over 71 query heads, k pre-transposed in the cache), out_dtype fp32, LegalizeOps -> PrimFunc (int64 indices, the broadcast as index 0), fp16 operands, B=1 S=2048 D=64 (Falcon-7B)."""
import numpy as np
from tvm import relax, tirx
B, H, S, D = 1, 71, 2048, 64
SMALL = dict(H=3, S=9, D=16)
def make():
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((B, H, S, D), "float16"))
    kt = relax.Var("k_t", relax.TensorType((B, 1, D, S), "float16"))
    with bb.function("main", [q, kt]):
        with bb.dataflow():
            o = bb.emit_output(relax.op.matmul(q, kt, out_dtype="float32"))
        bb.emit_func_output(o)
    mod = relax.transform.LegalizeOps()(bb.get())
    return [f for g, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)][0]
def inputs(rng):
    return [rng.uniform(-1, 1, (B, H, S, D)).astype(np.float32), rng.uniform(-1, 1, (B, 1, D, S)).astype(np.float32)]
def reference(q, kt):
    return [q @ kt]
def torch_impl(q, kt):
    import torch
    return [torch.matmul(q.float(), kt.float())]
