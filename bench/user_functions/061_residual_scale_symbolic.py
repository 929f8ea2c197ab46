"""Elementwise residual + scaled branch (x + alpha * y, alpha a [H] vector, LayerScale) with symbolic rows n = te.var, TE, fp16, hidden 4096, n in 1..4096."""
import numpy as np
from tvm import te
Hd = 4096
SMALL = dict(Hd=16)
SYMBOLIC = {"n": [1, 127, 4096]}
def make():
    n = te.var("n")
    x = te.placeholder((n, Hd), "float16", name="x")
    y = te.placeholder((n, Hd), "float16", name="y")
    a = te.placeholder((Hd,), "float16", name="alpha")
    return te.create_prim_func([x, y, a, te.compute((n, Hd), lambda i, j: x[i, j] + a[j] * y[i, j], name="o")])
def inputs(rng, n):
    return [rng.standard_normal((n, Hd)).astype(np.float32), rng.standard_normal((n, Hd)).astype(np.float32),
            rng.uniform(0, 1, (Hd,)).astype(np.float32)]
def reference(x, y, a, n):
    return [x + (a * y).astype(np.float16).astype(np.float64)]
def torch_impl(x, y, a, n):
    return [x + a * y]
