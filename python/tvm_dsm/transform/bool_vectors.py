"""Loops that read or write a bool buffer unrolled instead of vectorized.

TVM 0.27's CUDA code generator types a bool vector of 2 or 4 lanes ``ushort2`` / ``ushort4``,
two bytes a lane, and loads or stores one through a pointer of that type, where a bool buffer
holds one byte an element: a vectorized read of a bool mask (``where(mask, fill, scores)`` in a
vectorized epilogue, as dlight's matmul rule writes one) reads twice the bytes, its lanes are
byte pairs (a wrong mask), and an address two bytes past a four-byte boundary faults
(``cudaErrorMisalignedAddress``). Building the vector from one-byte loads does not compile
either (a ``select`` on it declares it in the select's type). So, before vectorization, a
vectorized loop whose body accesses a bool buffer is unrolled: its accesses one element each,
the other operands' too (a mask's loop is an epilogue's few lanes).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

from ..ir import find_all


def _accesses_bools(stmt) -> bool:
    return bool(find_all(stmt, tvm.ir.TensorLoad, lambda ld: str(ld.ty.dtype).startswith("bool"))
                or find_all(stmt, tirx.stmt.BufferStore, lambda st: str(st.value.ty.dtype).startswith("bool")))


def bool_vectors(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every vectorized loop that accesses a bool buffer unrolled."""

    def unroll(loop):
        if loop.kind != tirx.ForKind.VECTORIZED or not _accesses_bools(loop.body):
            return loop
        return tirx.stmt.For(loop.loop_var, loop.min, loop.extent, tirx.ForKind.UNROLLED, loop.body,
                             loop.thread_binding, loop.annotations, loop.step)

    body = tvm_ffi.structural_map(func.body, [(tirx.stmt.For, unroll)])
    return func if body.same_as(func.body) else func.with_body(body)


@tirx.transform.prim_func_pass(opt_level=0, name="tvm_dsm.BoolVectors")
def BoolVectors(func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx) -> tirx.PrimFunc:  # noqa: N802 - TVM pass style
    """Pass form of :func:`bool_vectors`."""
    return bool_vectors(func)
