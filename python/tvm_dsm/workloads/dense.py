"""Dense layers as a user writes them in TE: the GEMM every fused kernel's main loop is."""

from __future__ import annotations

from tvm import te, tirx

#: Epilogues a dense layer may end with (applied to the fp32 accumulator, before the cast).
ACTIVATIONS = {
    "identity": lambda x: x,
    "relu": lambda x: tirx.max(x, tirx.const(0, x.dtype)),
    "silu": lambda x: x * tirx.sigmoid(x),
    "gelu": lambda x: x * tirx.const(0.5, x.dtype) * (tirx.const(1, x.dtype) + tirx.erf(x * tirx.const(0.7071067811865476, x.dtype))),
}


def dense(
    m: int,
    n: int,
    k: int,
    dtype: str = "float16",
    out_dtype: str | None = None,
    weight_layout: str = "nk",
    bias: bool = False,
    activation: str = "identity",
) -> tirx.PrimFunc:
    """``Y = act(X @ W^T + b)`` with ``X[m, k]``, ``W[n, k]`` (``weight_layout="nk"``, torch's
    ``nn.Linear``) or ``W[k, n]`` (``"kn"``), accumulated in float32 and cast to ``out_dtype``
    (default: the input dtype)."""
    out_dtype = out_dtype or dtype
    x = te.placeholder((m, k), dtype, name="X")
    w = te.placeholder((n, k) if weight_layout == "nk" else (k, n), dtype, name="W")
    r = te.reduce_axis((0, k), name="k")

    def weight(j, kk):
        return w[j, kk] if weight_layout == "nk" else w[kk, j]

    acc = te.compute(
        (m, n),
        lambda i, j: te.sum(x[i, r].astype("float32") * weight(j, r).astype("float32"), axis=r),
        name="acc",
    )
    params = [x, w]
    if bias:
        b = te.placeholder((n,), dtype, name="bias")
        params.append(b)
        biased = te.compute((m, n), lambda i, j: acc[i, j] + b[j].astype("float32"), name="biased")
    else:
        biased = acc
    act = ACTIVATIONS[activation]
    y = te.compute((m, n), lambda i, j: act(biased[i, j]).astype(out_dtype), name="Y")
    return te.create_prim_func([*params, y])
