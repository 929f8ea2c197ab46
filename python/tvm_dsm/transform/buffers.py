"""Buffers of a lowered kernel: their sizes, the shared memory a CTA allocates, and which
buffers a statement accesses."""

from __future__ import annotations

import math

import tvm
from tvm import tirx

from ..ir import find_all

#: CUDA's limit on static (``__shared__``) shared memory per CTA.
MAX_STATIC_SMEM = 48 * 1024
#: Static shared memory DSM slices may take (:mod:`tvm_dsm.transform.kernel_lowering`): later
#: passes add static buffers of their own, so the slices keep 8 KB of the limit free.
STATIC_SLICES_BUDGET = 40 * 1024


def element_bytes(buffer) -> int:
    """Bytes of one of ``buffer``'s elements (a sub-byte type, such as bool, takes one)."""
    return -(-tvm.DataType(str(buffer.ty.dtype)).bits // 8)


def element_offset(buffer):
    """``buffer``'s element offset from its data pointer, None where it is provably 0."""
    offset = getattr(buffer.ty, "elem_offset", None)
    return None if offset is None or (isinstance(offset, tirx.IntImm) and int(offset) == 0) else offset


def buffer_bytes(buffer) -> int:
    """Bytes of ``buffer``'s elements, with the padding of a strided layout."""
    shape, strides = buffer.ty.shape, buffer.ty.strides
    elements = int(shape[0]) * int(strides[0]) if len(strides) else math.prod(int(d) for d in shape)
    return elements * tvm.DataType(str(buffer.ty.dtype)).bits // 8


def shared_bytes(body, scope: str) -> int:
    """Bytes of the ``scope`` buffers allocated in ``body``."""
    return sum(buffer_bytes(a.buffer) for a in find_all(
        body, tirx.AllocBuffer, lambda a: str(a.buffer.ty.storage_scope) == scope))


def buffers_used(stmt) -> list:
    """The buffers ``stmt`` loads or stores."""
    return ([ld.source for ld in find_all(stmt, tvm.ir.TensorLoad)]
            + [st.buffer for st in find_all(stmt, tirx.BufferStore)])
