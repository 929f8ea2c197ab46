"""Relax as torch.export / the PyTorch frontend emits a Conv2d: R.nn.conv2d(x, w [C,1,7,7], padding 3, groups=C) in fp16 (legalize accumulates in fp16) + bias [1,C,1,1], LegalizeOps + AnnotateTIROpPattern + FuseOps + FuseTIR, the single fused PrimFunc (a depthwise 7x7 convolution with int64 indices), fp16, [B,C,H,W] = [32,96,56,56] (ConvNeXt-T stage-1 dwconv)."""
import numpy as np
from tvm import relax, tirx
B, C, H, W, KS = 32, 96, 56, 56, 7
SMALL = dict(B=2, C=4, H=9, W=10, KS=7)
def make():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((B, C, H, W), "float16"))
    w = relax.Var("w", relax.TensorType((C, 1, KS, KS), "float16"))
    b = relax.Var("b", relax.TensorType((1, C, 1, 1), "float16"))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, strides=1, padding=KS // 2, groups=C))
            out = bb.emit_output(relax.op.add(y, b))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    mod = relax.transform.AnnotateTIROpPattern()(mod)
    mod = relax.transform.FuseOps()(mod)
    mod = relax.transform.FuseTIR()(mod)
    fs = {g.name_hint: f for g, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}
    conv = [f for name, f in fs.items() if "conv2d" in name]
    assert len(conv) == 1, list(fs)
    return conv[0]
def inputs(rng):
    return [rng.uniform(-1, 1, (B, C, H, W)).astype(np.float32), (rng.uniform(-1, 1, (C, 1, KS, KS)) / KS).astype(np.float32),
            rng.uniform(-0.5, 0.5, (1, C, 1, 1)).astype(np.float32)]
def reference(x, w, b):
    p = KS // 2
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    y = np.zeros((B, C, H, W))
    for i in range(KS):
        for j in range(KS):
            y += xp[:, :, i:i + H, j:j + W] * w[None, :, 0, i, j, None, None]
    return [y + b]
def torch_impl(x, w, b):
    import torch
    return [torch.nn.functional.conv2d(x, w, b.reshape(C), padding=KS // 2, groups=C)]
