"""Zero-filled tile copies that TVM 0.27 would leave as code nvcc rejects, as predicated cp.async.

A GEMM's operand tile that runs past M, N or K is copied to shared memory as
``S[i] = if_then_else(inside, A[j], 0)`` (the zeros add nothing to the sums). TVM 0.27's
InjectPTXAsyncCopy turns such a copy into a predicated ``cp.async`` (which writes zeros where
the predicate is false) only inside a pipeline's asynchronous stages and only where the zero is
a float. Any other copy stays a plain vector load, and TVM's CUDA printer writes 16 one-byte
zeros as a ``make_int4`` of 16 arguments, which nvcc rejects. That happens to an int8 tile
anywhere, and to an fp8 tile outside the asynchronous stages (a pipeline's first steps, or an
unpipelined kernel). :func:`ZeroFilledCopies` issues those copies as the ``cp_async_raw`` call the
pass makes for a float tile (bytes are bytes). It runs before the pass, and a copy outside the
asynchronous stages is waited for where it is issued.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx
from tvm.script import tirx as T

from ..ir import IF_THEN_ELSE, is_zero

_CP_ASYNC = "tirx.s_tir.cp_async_raw"
_BUFFER_DATA = "tirx.buffer_data"
_COPY_BYTES = (4, 8, 16)  # what one cp.async moves
_INTEGERS = (tvm.runtime.DataTypeCode.INT, tvm.runtime.DataTypeCode.UINT)


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


def _scalar(value):
    """``value``'s one lane where it is a broadcast."""
    return value.value if isinstance(value, tirx.Broadcast) else value


def _pointer(buffer):
    """The address of ``buffer``'s data, typed by its element (cp.async's offsets count elements)."""
    element = tvm.ir.PointerType(tvm.ir.PrimType(str(buffer.ty.dtype)), str(buffer.ty.storage_scope))
    return tvm.ir.Call(tvm.ir.Op.get(_BUFFER_DATA), [buffer], ret_ty=element)


def _as_cp_async(store, awaited: bool):
    """``store`` as a predicated cp.async where it copies a contiguous vector of 16, 8 or 4 bytes
    from global into shared memory with a zero fill under a scalar predicate, and is of a type
    TVM's pass leaves (an integer; outside the asynchronous stages, ``awaited``, any of one
    byte): committed and waited for at once where ``awaited``; else ``store``."""
    value = store.value
    if not (isinstance(value, tvm.ir.Call) and value.op.same_as(IF_THEN_ELSE)
            and isinstance(value.args[1], tvm.ir.TensorLoad) and is_zero(_scalar(value.args[2]))):
        return store
    load, predicate = value.args[1], value.args[0]
    vector = tvm.runtime.DataType(str(value.ty))
    element = tvm.runtime.DataType(str(store.buffer.ty.dtype))
    taken = element.type_code in _INTEGERS or (awaited and element.bits == 8)
    if (not taken or not str(store.buffer.ty.storage_scope).startswith("shared")
            or str(load.source.ty.storage_scope) != "global" or str(load.source.ty.dtype) != str(element)
            or tvm.runtime.DataType(str(predicate.ty)).lanes != 1
            or len(store.indices) != 1 or len(load.indices) != 1):
        return store
    dst, src = _first_lane(store.indices[0]), _first_lane(load.indices[0])
    size = vector.bits * vector.lanes // 8
    if dst is None or src is None or element.lanes != 1 or size not in _COPY_BYTES:
        return store
    call = tvm.ir.Call(tvm.ir.Op.get(_CP_ASYNC),
                       [_pointer(store.buffer), dst, _pointer(load.source), src, tirx.IntImm("int32", size), predicate],
                       ret_ty=tvm.ir.PrimType(str(element)))
    if not awaited:
        return tirx.Evaluate(call)
    return tirx.SeqStmt([tirx.Evaluate(call), tirx.Evaluate(T.ptx.cp.async_.commit_group()),
                         tirx.Evaluate(T.ptx.cp.async_.wait_group(0))])


def _async_scope(attr):
    if attr.attr_key != "async_scope":
        return attr
    return tirx.AttrStmt(attr.node, attr.attr_key, attr.value,
                         tvm_ffi.structural_map(attr.body, [(tirx.BufferStore, lambda s: _as_cp_async(s, False))]))


@tirx.transform.prim_func_pass(opt_level=0, name="tvm_dsm.ZeroFilledCopies")
def ZeroFilledCopies(func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx) -> tirx.PrimFunc:
    """Each zero-filled tile copy TVM's pass would leave unprintable as a predicated cp.async
    (see the module): in an asynchronous stage as the stage's other copies, elsewhere waited
    for where it is issued."""
    body = tvm_ffi.structural_map(func.body, [(tirx.AttrStmt, _async_scope)])
    return func.with_body(tvm_ffi.structural_map(body, [(tirx.BufferStore, lambda s: _as_cp_async(s, True))]))
