"""Row-wise normalizations as TOPI writes them (what Relax legalizes ``R.nn.softmax``,
``R.nn.log_softmax``, ``R.nn.rms_norm`` and ``R.nn.layer_norm`` to)."""

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
