"""A DSM buffer of a cluster kernel as each CTA holds it: its own slice in shared memory, and
the PTX (``mapa`` + ``ld/st.shared::cluster``, TVM's own ``T.ptx`` intrinsics) that reaches a
peer's copy of that slice."""

from __future__ import annotations

import math

import tvm
from tvm import tirx
from tvm.script import tirx as T

from ..errors import ClusterError

#: Markers around the PTX of one remote access (node: the slice), read by the barrier placement
#: (:mod:`tvm_dsm.transform.cluster_barriers`) and removed before the lowering returns.
REMOTE_LOAD = "tvm_dsm.remote_load"
REMOTE_STORE = "tvm_dsm.remote_store"

# PTX type of a remote ld/st per element dtype. 16-bit floats move as raw b16 bits.
_PTX_TYPES = {
    "float32": "f32",
    "float64": "f64",
    "int32": "s32",
    "uint32": "u32",
    "int64": "s64",
    "uint64": "u64",
    "int16": "s16",
    "uint16": "u16",
    "float16": "b16",
    "bfloat16": "b16",
}
_BITS16 = {"float16", "bfloat16"}


def moves_through_dsm(dtype: str) -> bool:
    """Whether a DSM buffer holds elements of ``dtype`` (a remote load and store has a PTX type
    for it: not 8-bit integers or bools)."""
    return str(dtype) in _PTX_TYPES


class DSMBuffer:
    """One DSM buffer of a kernel: the per-CTA slice and how to reach a peer's copy of it.

    Index r of the leading axis lives in the CTA of rank r. Buffer compaction may shorten the axis
    (a buffer only rank 0 writes) or shift it; it shifts every access alike, so each element still
    has one home CTA that writers and readers agree on.
    """

    def __init__(self, buffer: tirx.Var, cluster_size: int, scope: str = "shared.dyn"):
        shape = list(buffer.ty.shape)
        if not shape or not isinstance(shape[0], tirx.IntImm) or int(shape[0]) > cluster_size:
            raise ClusterError(
                f"DSM buffer {buffer.name} has shape {shape}: its leading axis indexes the owning "
                f"CTA, so its extent must be at most {cluster_size} (the cluster size)"
            )
        self.dtype = str(buffer.ty.dtype)
        if not moves_through_dsm(self.dtype):
            raise ClusterError(f"DSM buffer {buffer.name}: dtype {self.dtype} is not supported")
        self.buffer = buffer
        # a padded layout (storage_align: rows apart by more than their length, so a warp's
        # stores down a column fall in different banks) keeps its strides in the slice
        padded = list(buffer.ty.strides)[1:]
        self.slice = tirx.decl_buffer(shape[1:], self.dtype, f"{buffer.name}_slice", strides=padded or None,
                                      scope=scope)
        self.strides = padded or [math.prod(shape[a + 1:]) for a in range(1, len(shape))]

    def offset(self, indices) -> tvm.ir.PrimExpr:
        """The element offset of slice ``indices`` (without the rank) in the slice."""
        return sum((i * s for i, s in zip(indices, self.strides)), tirx.const(0, "int32"))

    def _peer_address(self, indices, rank, peer: tirx.Var, mask: str) -> tirx.Evaluate:
        # ``mask`` tells ThreadSync whether the CTA's own slice is read or written here (it is
        # neither; the peer's is), so loads do not get __syncthreads between iterations.
        offset = self.offset(indices)
        local = T.cuda.cvta_generic_to_shared(self.slice.access_ptr(mask, offset=offset))
        return tirx.Evaluate(
            T.ptx.mapa.shared__cluster.u32(peer[0], local, tirx.Cast("uint32", rank))
        )

    def _ptx(self, op, lanes: int = 1):
        """``op.shared::cluster[.vN].type`` moving ``lanes`` elements (16-bit ones as b32 pairs)."""
        space = getattr(op, "shared__cluster")
        if self.dtype in _BITS16 and lanes > 1:
            words = lanes // 2
            return getattr(getattr(space, f"v{words}"), "b32") if words > 1 else space.b32
        if lanes > 1:
            space = getattr(space, f"v{lanes}")
        return getattr(space, _PTX_TYPES[self.dtype])

    def registers(self, lanes: int) -> tuple[list, tirx.Var, list]:
        """Local registers for ``lanes`` elements: (allocations, element view, PTX operands)."""
        if self.dtype in _BITS16 and lanes > 1:
            words = tirx.decl_buffer((lanes // 2,), "uint32", "dsm_words", scope="local")
            view = tirx.decl_buffer((lanes,), self.dtype, "dsm_value", data=words.data, scope="local")
            decl = tirx.DeclBuffer(view, data=words.data)
            return [tirx.AllocBuffer(words), decl], view, [words[w] for w in range(lanes // 2)]
        raw = "uint16" if self.dtype in _BITS16 else self.dtype
        regs = tirx.decl_buffer((lanes,), raw, "dsm_value", scope="local")
        return [tirx.AllocBuffer(regs)], regs, [regs[v] for v in range(lanes)]

    def remote_load(self, indices, rank, lanes: int = 1) -> tuple[list, tirx.Var]:
        """Statements loading ``lanes`` elements of peer ``rank`` from ``indices`` into registers,
        and the registers (a ``lanes``-element local buffer of the element type)."""
        peer = tirx.decl_buffer((1,), "uint32", "dsm_peer_addr", scope="local")
        allocs, view, operands = self.registers(lanes)
        access = [self._peer_address(indices, rank, peer, "r"),
                  tirx.Evaluate(self._ptx(T.ptx.ld, lanes)(*operands, peer[0]))]
        marked = tirx.AttrStmt(self.slice, REMOTE_LOAD, 0, tirx.SeqStmt(access))
        return [tirx.AllocBuffer(peer), *allocs, marked], view

    def remote_load_scalar(self, indices, rank) -> tuple[list, tvm.ir.PrimExpr]:
        stmts, regs = self.remote_load(indices, rank)
        value = regs[0]
        if str(regs.ty.dtype) != self.dtype:
            value = tirx.call_intrin(self.dtype, "tirx.reinterpret", value)
        return stmts, value

    def remote_store(self, indices, rank, operands: list, lanes: int = 1) -> list:
        """Statements storing ``lanes`` elements (PTX ``operands``) to peer ``rank``'s slice."""
        peer = tirx.decl_buffer((1,), "uint32", "dsm_peer_addr", scope="local")
        if lanes == 1 and self.dtype in _BITS16:
            operands = [tirx.call_intrin("uint16", "tirx.reinterpret", operands[0])]
        access = [self._peer_address(indices, rank, peer, "w"),
                  tirx.Evaluate(self._ptx(T.ptx.st, lanes)(peer[0], *operands))]
        marked = tirx.AttrStmt(self.slice, REMOTE_STORE, 0, tirx.SeqStmt(access))
        return [tirx.AllocBuffer(peer), marked]

    def vector_lanes(self, extent: int) -> int | None:
        """Elements per remote vector access for a vectorized loop of ``extent``, if PTX has one."""
        nbytes = extent * tvm.DataType(self.dtype).bits // 8
        return extent if nbytes in (4, 8, 16) and extent > 1 else None
