"""GEMM chains as a user writes them in TE: the FFN ``act(A @ W1^T) @ W2^T``, its gated form, and
FlashFuser's convolution chains.

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


def conv_chain(ic: int, hw: int, oc1: int, oc2: int, k1: int, k2: int, batch: int = 1,
               activation: str = "relu", dtype: str = "float16") -> tirx.PrimFunc:
    """FlashFuser's convolution chain ``Out = conv_k2(act(conv_k1(X, W1)), W2)``: NHWC input
    ``X[batch, hw, hw, ic]``, OHWI weights ``W1[oc1, k1, k1, ic]``, ``W2[oc2, k2, k2, oc1]``, stride
    1 and "same" zero padding (k odd), accumulated in float32, the intermediate rounded to
    ``dtype`` as an unfused model does."""

    def conv(x: te.Tensor, w: te.Tensor, k: int, name: str) -> te.Tensor:
        pad = k // 2
        channels = x.shape[3]
        padded = te.compute(
            (batch, hw + 2 * pad, hw + 2 * pad, channels),
            lambda n, h, v, c: tirx.if_then_else(
                tirx.all(h >= pad, h < hw + pad, v >= pad, v < hw + pad),
                x[n, h - pad, v - pad, c], tirx.const(0, dtype)),
            name=f"{name}_pad",
        ) if pad else x
        c = te.reduce_axis((0, channels), name=f"c_{name}")
        r = te.reduce_axis((0, k), name=f"r_{name}")
        s = te.reduce_axis((0, k), name=f"s_{name}")
        return te.compute(
            (batch, hw, hw, w.shape[0]),
            lambda n, h, v, o: te.sum(
                padded[n, h + r, v + s, c].astype("float32") * w[o, r, s, c].astype("float32"),
                axis=[r, s, c]),
            name=name,
        )

    x = te.placeholder((batch, hw, hw, ic), dtype, name="X")
    w1 = te.placeholder((oc1, k1, k1, ic), dtype, name="W1")
    w2 = te.placeholder((oc2, k2, k2, oc1), dtype, name="W2")
    c1 = conv(x, w1, k1, "C")
    act = ACTIVATIONS[activation]
    h = te.compute(c1.shape, lambda n, y, x_, o: act(c1[n, y, x_, o]).astype(dtype), name="H")
    e = conv(h, w2, k2, "E")
    out = te.compute(e.shape, lambda n, y, x_, o: e[n, y, x_, o].astype(dtype), name="Out")
    return te.create_prim_func([x, w1, w2, out])


#: FlashFuser's conv chains (IC, H=W, OC1, OC2, k1, k2).
CONV_CHAINS = {
    "C1": (64, 56, 256, 64, 1, 1), "C2": (128, 28, 512, 128, 1, 1), "C3": (256, 14, 1024, 256, 1, 1),
    "C4": (512, 7, 2048, 512, 1, 1), "C5": (64, 56, 64, 256, 3, 1), "C6": (128, 28, 128, 512, 3, 1),
    "C7": (256, 14, 256, 1024, 3, 1), "C8": (512, 7, 512, 2048, 3, 1),
}
