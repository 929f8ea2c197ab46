"""Row-wise normalizations as TOPI writes them (what Relax legalizes ``R.nn.softmax``,
``R.nn.log_softmax``, ``R.nn.rms_norm`` and ``R.nn.layer_norm`` to), composed of TOPI's
element-wise operators with ``keepdims``, and fused add-RMSNorm returning its sum."""

from __future__ import annotations

from tvm import te, tirx, topi

#: TOPI's default epsilon of rms_norm and layer_norm.
EPS = 1e-5


def topi_norm(operator: str, rows: int, width: int, dtype: str = "float32") -> tirx.PrimFunc:
    """TOPI's ``operator`` ("softmax", "log_softmax", "rms_norm" or "layer_norm") over the last
    axis of [rows, width], with a weight (and for LayerNorm a bias) of width elements."""
    x = te.placeholder((rows, width), dtype, name="x")
    w = te.placeholder((width,), dtype, name="w")
    b = te.placeholder((width,), dtype, name="b")
    if operator == "softmax":
        return te.create_prim_func([x, topi.nn.softmax(x)])
    if operator == "log_softmax":
        return te.create_prim_func([x, topi.nn.log_softmax(x)])
    if operator == "rms_norm":
        return te.create_prim_func([x, w, topi.nn.rms_norm(x, w, axis=[1], epsilon=EPS)])
    return te.create_prim_func([x, w, b, topi.nn.layer_norm(x, w, b, axis=[1], epsilon=EPS)])


def composed_norm(operator: str, rows, width: int, dtype: str = "float32") -> tirx.PrimFunc:
    """``operator`` ("softmax", "log_softmax", "rms_norm") over [rows, width] composed of TOPI's
    element-wise operators and reductions that keep the reduced dimension (``keepdims=True``),
    in fp32."""
    x = te.placeholder((rows, width), dtype, name="x")
    xf = topi.cast(x, "float32")
    if operator == "rms_norm":
        w = te.placeholder((width,), dtype, name="w")
        mean_square = topi.divide(topi.sum(topi.multiply(xf, xf), axis=-1, keepdims=True), float(width))
        y = topi.multiply(topi.multiply(xf, topi.rsqrt(topi.add(mean_square, EPS))), topi.cast(w, "float32"))
        return te.create_prim_func([x, w, topi.cast(y, dtype)])
    shifted = topi.subtract(xf, topi.max(xf, axis=-1, keepdims=True))
    total = topi.sum(topi.exp(shifted), axis=-1, keepdims=True)
    y = topi.divide(topi.exp(shifted), total) if operator == "softmax" else topi.subtract(shifted, topi.log(total))
    return te.create_prim_func([x, topi.cast(y, dtype)])


def residual_rms_norm_returned(rows, width: int, dtype: str = "float16") -> tirx.PrimFunc:
    """Fused add-RMSNorm as an LLM layer writes it: ``h = x + r`` returned (the next layer's
    residual) and normalized; the statistics read the output ``h``."""
    x = te.placeholder((rows, width), dtype, name="x")
    r = te.placeholder((rows, width), dtype, name="residual")
    w = te.placeholder((width,), dtype, name="w")
    h = te.compute((rows, width), lambda i, j: x[i, j] + r[i, j], name="h")
    k = te.reduce_axis((0, width), "k")
    total = te.compute((rows,), lambda i: te.sum(h[i, k].astype("float32") * h[i, k].astype("float32"), axis=k),
                       name="sum_squares")
    y = te.compute((rows, width), lambda i, j: (h[i, j].astype("float32") * te.rsqrt(total[i] / width + EPS)
                                             * w[j].astype("float32")).astype(dtype), name="y")
    return te.create_prim_func([x, r, w, h, y])
