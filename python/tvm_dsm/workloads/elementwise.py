"""Elementwise functions as TE writes them: the SwiGLU activation over a projection holding gate
and up side by side (how ``relax.frontend.nn`` Llama models write their MLP), and a cast."""

from __future__ import annotations

from tvm import te, tirx


def split_silu_mul(m, n: int, dtype: str = "float16") -> tirx.PrimFunc:
    """``silu(x[:, :n]) * x[:, n:]`` of ``x[m, 2n]``, in ``dtype`` (``m`` an int or a Var)."""
    x = te.placeholder((m, 2 * n), dtype, name="x")
    gate = te.compute((m, n), lambda i, j: x[i, j], name="gate")
    up = te.compute((m, n), lambda i, j: x[i, j + n], name="up")
    return te.create_prim_func([x, te.compute((m, n), lambda i, j: gate[i, j] * te.sigmoid(gate[i, j]) * up[i, j],
                                              name="h")])


def cast(m, n: int, source: str = "float32", target: str = "float16") -> tirx.PrimFunc:
    """``x.astype(target)`` of ``x[m, n]``."""
    x = te.placeholder((m, n), source, name="x")
    return te.create_prim_func([x, te.compute((m, n), lambda i, j: x[i, j].astype(target), name="y")])
