"""GPT-2 input embedding: wte[ids[b,s]] + wpe[start[b] + s] with per-sequence position offsets start [B] (int32 ids), TVMScript, fp16, B=4 S=512 V=50257 P=1024 H=768 (GPT-2 small)."""
import numpy as np
from tvm.script import tirx as T
B, S, V, P, H = 4, 512, 50257, 1024, 768
SMALL = dict(B=2, S=5, V=50, P=16, H=8)
def make():
    b_, s_, v_, p_, h_ = B, S, V, P, H
    @T.prim_func(s_tir=True)
    def main(ids: T.Buffer((b_, s_), "int32"), start: T.Buffer((b_,), "int32"), wte: T.Buffer((v_, h_), "float16"),
             wpe: T.Buffer((p_, h_), "float16"), out: T.Buffer((b_, s_, h_), "float16")):
        for b, s, h in T.grid(b_, s_, h_):
            with T.sblock("embed"):
                vb, vs, vh = T.axis.remap("SSS", [b, s, h])
                out[vb, vs, vh] = wte[ids[vb, vs], vh] + wpe[start[vb] + vs, vh]
    return main
def inputs(rng):
    return [rng.integers(0, V, (B, S)).astype(np.int32), rng.integers(0, P - S + 1, (B,)).astype(np.int32),
            (rng.standard_normal((V, H)) * 0.1).astype(np.float32), (rng.standard_normal((P, H)) * 0.02).astype(np.float32)]
def reference(ids, start, wte, wpe):
    pos = start.astype(np.int64)[:, None] + np.arange(S)[None]
    return [wte[ids.astype(np.int64)] + wpe[pos]]
def torch_impl(ids, start, wte, wpe):
    import torch
    pos = start.long()[:, None] + torch.arange(S, device=ids.device)[None]
    return [torch.nn.functional.embedding(ids.long(), wte) + torch.nn.functional.embedding(pos, wpe)]
