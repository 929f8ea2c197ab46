"""Row reductions as a user writes them in TE: the first users of cluster split-K."""

from __future__ import annotations

from tvm import te, tirx


def row_sum(m: int, k: int, dtype: str = "float32") -> tirx.PrimFunc:
    """``B[i] = sum_k A[i, k]``, accumulated in float32."""
    a = te.placeholder((m, k), dtype, name="A")
    r = te.reduce_axis((0, k), name="k")
    b = te.compute((m,), lambda i: te.sum(a[i, r].astype("float32"), axis=r), name="B")
    return te.create_prim_func([a, b])


def gemv(m: int, k: int, dtype: str = "float32") -> tirx.PrimFunc:
    """``y[i] = sum_k A[i, k] * x[k]`` (matrix-vector product), accumulated in float32."""
    a = te.placeholder((m, k), dtype, name="A")
    x = te.placeholder((k,), dtype, name="x")
    r = te.reduce_axis((0, k), name="k")
    y = te.compute(
        (m,), lambda i: te.sum(a[i, r].astype("float32") * x[r].astype("float32"), axis=r), name="y"
    )
    return te.create_prim_func([a, x, y])
