"""SwiGLU FFN input with the merged gate_up weight [2I,H] cut by topi.split(axis=0) into gate and up, two topi.nn.dense (fp32 out), silu(gate) * up -> fp16, fp16, M=512 H=1536 I=8960 (Qwen2-1.5B mlp)."""
import numpy as np
from tvm import te, topi
M, H, I = 512, 1536, 8960
SMALL = dict(M=7, H=64, I=24)
def make():
    x = te.placeholder((M, H), "float16", name="x")
    w = te.placeholder((2 * I, H), "float16", name="gate_up_proj")
    wg, wu = topi.split(w, 2, axis=0)
    g = topi.nn.dense(x, wg, out_dtype="float32")
    u = topi.nn.dense(x, wu, out_dtype="float32")
    o = te.compute((M, I), lambda i, j: (g[i, j] * te.sigmoid(g[i, j]) * u[i, j]).astype("float16"), name="swiglu")
    return te.create_prim_func([x, w, o])
def inputs(rng):
    return [rng.uniform(-1, 1, (M, H)).astype(np.float32), (rng.uniform(-1, 1, (2 * I, H)) * 2 / np.sqrt(H)).astype(np.float32)]
def reference(x, w):
    g, u = x @ w[:I].T, x @ w[I:].T
    return [g / (1 + np.exp(-g)) * u]
def torch_impl(x, w):
    import torch
    g, u = torch.nn.functional.linear(x, w).chunk(2, dim=-1)
    return [torch.nn.functional.silu(g) * u]
