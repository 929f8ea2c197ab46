"""Relax attention probabilities: R.astype(scores fp16->fp32) -> R.nn.softmax(axis=-1) -> R.astype(fp16), FuseOps + FuseTIR -> the fused_softmax_cast PrimFunc (fp32 scores in, fp16 probs out; FuseOps keeps the first cast apart), scores [1,32,n,n] with symbolic n (int64) (hand-written Relax attention, Llama-2-7B heads), n typically 512..4096."""
import numpy as np
import tvm
from tvm import relax, tirx
HEADS, SEQ = 32, 2048
SMALL = dict(HEADS=2, SEQ=7)
def make():
    n = tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    s = relax.Var("scores", relax.TensorType((1, HEADS, n, n), "float16"))
    with bb.function("main", [s]):
        with bb.dataflow():
            a = bb.emit(relax.op.astype(s, "float32"))
            p = bb.emit(relax.op.nn.softmax(a, axis=-1))
            o = bb.emit_output(relax.op.astype(p, "float16"))
        bb.emit_func_output(o)
    mod = relax.transform.LegalizeOps()(bb.get())
    mod = relax.transform.AnnotateTIROpPattern()(mod)
    mod = relax.transform.FuseOps()(mod)
    mod = relax.transform.FuseTIR()(mod)
    fs = [f for g_, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)]
    return [f for g_, f in mod.functions.items() if g_.name_hint.startswith("fused_softmax")][0]
def inputs(rng):
    return [rng.standard_normal((1, HEADS, SEQ, SEQ)).astype(np.float32) * 3]
def reference(s):
    p = np.exp(s - s.max(-1, keepdims=True)); return [p / p.sum(-1, keepdims=True)]
def torch_impl(s):
    import torch
    return [torch.softmax(s, -1).half()]
