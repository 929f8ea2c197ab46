"""Integer tile copies with a zero fill as predicated cp.async.

A GEMM's operand tile that runs past M, N or K is copied to shared memory as
``S[i] = if_then_else(inside, A[j], 0)`` (the zeros add nothing to the sums). TVM 0.27's
InjectPTXAsyncCopy turns that copy into a predicated ``cp.async`` (which writes zeros where the
predicate is false) only where the zero is a float: an int8 tile's copy stays a plain vector
load, and TVM's CUDA printer writes its 16 int8 zeros as a ``make_int4`` of 16 arguments, which
nvcc rejects. :func:`IntegerTileCopies` issues those copies as the same ``cp_async_raw`` call
the pass makes for a float tile (bytes are bytes), before the pass runs; a copy outside the
pipeline's asynchronous stages (its first steps, an unpipelined kernel) is waited for at once.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx
from tvm.script import tirx as T

_CP_ASYNC = "tirx.s_tir.cp_async_raw"
_BUFFER_DATA = "tirx.buffer_data"
_COPY_BYTES = (4, 8, 16)  # what one cp.async moves
_IF_THEN_ELSE = tvm.ir.Op.get("prim.if_then_else")


def _first_lane(index) -> tvm.ir.PrimExpr | None:
    """The scalar first element of a contiguous vector index (``Ramp(b, 1, n)``, plus a
    broadcast offset), or None."""
    if isinstance(index, tirx.Ramp):
        return index.base if isinstance(index.stride, tirx.IntImm) and index.stride.value == 1 else None
    if isinstance(index, tirx.Add):
        for ramp, offset in ((index.a, index.b), (index.b, index.a)):
            if isinstance(offset, tirx.Broadcast):
                base = _first_lane(ramp)
                return None if base is None else base + offset.value
    return None


def _is_zero(value) -> bool:
    if isinstance(value, tirx.Broadcast):
        value = value.value
    return isinstance(value, tirx.IntImm) and value.value == 0


def _buffer_data(buffer):
    return tvm.ir.Call(tvm.ir.Op.get(_BUFFER_DATA), [buffer], ret_ty=buffer.ty)


def _as_cp_async(store, awaited: bool = False):
    """``store`` as a predicated cp.async where it copies a contiguous integer vector from global
    memory into shared memory with a zero fill (``awaited``: committed and waited for at once,
    a copy outside the asynchronous stages); else ``store``."""
    value = store.value
    if not (isinstance(value, tvm.ir.Call) and isinstance(value.op, tvm.ir.Op) and value.op.same_as(_IF_THEN_ELSE)
            and isinstance(value.args[1], tvm.ir.TensorLoad) and _is_zero(value.args[2])):
        return store
    load, dtype = value.args[1], tvm.runtime.DataType(str(store.buffer.ty.dtype))
    scope = str(store.buffer.ty.storage_scope)
    if (dtype.type_code not in (tvm.runtime.DataTypeCode.INT, tvm.runtime.DataTypeCode.UINT)
            or not scope.startswith("shared") or len(store.indices) != 1 or len(load.indices) != 1):
        return store
    lanes = tvm.runtime.DataType(str(store.indices[0].ty)).lanes
    dst, src = _first_lane(store.indices[0]), _first_lane(load.indices[0])
    if dst is None or src is None or lanes * dtype.bits // 8 not in _COPY_BYTES:
        return store
    call = tvm.ir.Call(tvm.ir.Op.get(_CP_ASYNC),
                       [_buffer_data(store.buffer), dst, _buffer_data(load.source), src,
                        tirx.IntImm("int32", lanes * dtype.bits // 8), value.args[0]],
                       ret_ty=tvm.ir.PrimType(str(store.buffer.ty.dtype)))
    if not awaited:
        return tirx.Evaluate(call)
    return tirx.SeqStmt([tirx.Evaluate(call), tirx.Evaluate(T.ptx.cp.async_.commit_group()),
                         tirx.Evaluate(T.ptx.cp.async_.wait_group(0))])


def _async_scope(attr):
    if attr.attr_key != "async_scope":
        return attr
    return tirx.AttrStmt(attr.node, attr.attr_key, attr.value,
                         tvm_ffi.structural_map(attr.body, [(tirx.BufferStore, _as_cp_async)]))


@tirx.transform.prim_func_pass(opt_level=0, name="tvm_dsm.IntegerTileCopies")
def IntegerTileCopies(func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx) -> tirx.PrimFunc:
    """Each zero-filled integer tile copy as a predicated cp.async (see the module): in an
    asynchronous stage as the stage's other copies, elsewhere (a pipeline's first steps, an
    unpipelined kernel) waited for where it is issued."""
    body = tvm_ffi.structural_map(func.body, [(tirx.AttrStmt, _async_scope)])
    return func.with_body(tvm_ffi.structural_map(body, [(tirx.BufferStore, lambda s: _as_cp_async(s, True))]))
