"""Token embedding lookup topi.take(table [V,H], ids [n], axis=0) with symbolic token count n = te.var, int32 ids, fp16, V=128256 H=4096 (Llama-3-8B embed_tokens), n typically 1..8192."""
import numpy as np
from tvm import te, topi
V, H, NTOK = 128256, 4096, 2048
SMALL = dict(V=50, H=64, NTOK=7)
def make():
    n = te.var("n")
    table = te.placeholder((V, H), "float16", name="embed")
    ids = te.placeholder((n,), "int32", name="ids")
    return te.create_prim_func([table, ids, topi.take(table, ids, axis=0)])
def inputs(rng):
    return [rng.standard_normal((V, H)).astype(np.float32), rng.integers(0, V, (NTOK,)).astype(np.int32)]
def reference(table, ids):
    return [table[ids]]
def torch_impl(table, ids):
    import torch
    return [torch.nn.functional.embedding(ids.long(), table)]
