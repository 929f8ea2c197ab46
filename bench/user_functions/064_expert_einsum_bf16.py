"""Expert-batched matmul einsum('etk,enk->etn') for MoE experts, TE explicit casts, bf16, E=8 experts x T=127 tokens x K=4096 x N=1408 (Qwen1.5-MoE expert width)."""
import numpy as np
from tvm import te
E, T_, K, N = 8, 127, 4096, 1408
SMALL = dict(E=2, T_=5, K=16, N=8)
def make():
    a = te.placeholder((E, T_, K), "bfloat16", name="x")
    b = te.placeholder((E, N, K), "bfloat16", name="w")
    k = te.reduce_axis((0, K), name="k")
    c = te.compute((E, T_, N), lambda e, t, n: te.sum(a[e, t, k].astype("float32") * b[e, n, k].astype("float32"), axis=k), name="c")
    return te.create_prim_func([a, b, te.compute((E, T_, N), lambda e, t, n: c[e, t, n].astype("bfloat16"), name="o")])
def inputs(rng):
    return [rng.uniform(-1, 1, (E, T_, K)).astype(np.float32), (rng.uniform(-1, 1, (E, N, K)) / np.sqrt(K)).astype(np.float32)]
def reference(a, b):
    return [a @ b.swapaxes(-1, -2)]
def torch_impl(a, b):
    import torch
    return [torch.einsum("etk,enk->etn", a, b)]
