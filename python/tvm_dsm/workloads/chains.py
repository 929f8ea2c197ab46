"""GEMM chains as a user writes them in TE: the FFN ``act(A @ W1^T) @ W2^T`` and its gated form.

Weights are stored the way ``torch.nn.Linear`` stores them (``[out_features, in_features]``); the
intermediate is rounded to the input dtype between the two GEMMs, as an unfused model does.
"""

from __future__ import annotations

from tvm import te, tirx

from .dense import ACTIVATIONS


def _matmul(x: te.Tensor, w: te.Tensor, name: str) -> te.Tensor:
    """``x @ w^T`` accumulated in float32."""
    m, depth = x.shape
    r = te.reduce_axis((0, depth), name=f"k_{name}")
    return te.compute(
        (m, w.shape[0]),
        lambda i, j: te.sum(x[i, r].astype("float32") * w[j, r].astype("float32"), axis=r),
        name=name,
    )


def gemm_chain(m: int, n: int, k: int, l: int, activation: str = "relu",
               dtype: str = "float16") -> tirx.PrimFunc:
    """``E = act(A @ W1^T) @ W2^T`` with ``A[m, k]``, ``W1[n, k]``, ``W2[l, n]``."""
    a = te.placeholder((m, k), dtype, name="A")
    w1 = te.placeholder((n, k), dtype, name="W1")
    w2 = te.placeholder((l, n), dtype, name="W2")
    c = _matmul(a, w1, "C")
    act = ACTIVATIONS[activation]
    h = te.compute((m, n), lambda i, j: act(c[i, j]).astype(dtype), name="H")
    e = _matmul(h, w2, "E")
    out = te.compute((m, l), lambda i, j: e[i, j].astype(dtype), name="Out")
    return te.create_prim_func([a, w1, w2, out])


def swiglu_ffn(m: int, n: int, k: int, l: int, dtype: str = "float16") -> tirx.PrimFunc:
    """``E = (silu(A @ Wg^T) * (A @ Wu^T)) @ W2^T`` (Llama's MLP) with ``Wg, Wu[n, k]``, ``W2[l, n]``."""
    a = te.placeholder((m, k), dtype, name="A")
    wg = te.placeholder((n, k), dtype, name="Wg")
    wu = te.placeholder((n, k), dtype, name="Wu")
    w2 = te.placeholder((l, n), dtype, name="W2")
    gate, up = _matmul(a, wg, "G"), _matmul(a, wu, "U")
    silu = ACTIVATIONS["silu"]
    h = te.compute((m, n), lambda i, j: (silu(gate[i, j]) * up[i, j]).astype(dtype), name="H")
    e = _matmul(h, w2, "E")
    out = te.compute((m, l), lambda i, j: e[i, j].astype(dtype), name="Out")
    return te.create_prim_func([a, wg, wu, w2, out])
