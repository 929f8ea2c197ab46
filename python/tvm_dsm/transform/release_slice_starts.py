"""Let TVM's shared-memory merge overlay a DSM slice no peer writes on buffers dead before the
slice's first access (see :func:`release_slice_starts`)."""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx
from tvm.script import tirx as T

from ..annotations import RELEASABLE_START_KEY
from ..ir import is_barrier, uses


def _touched_buffer(touch: tirx.Evaluate):
    """The buffer a slice touch (``tvm_access_ptr``) names, as the IR has it now."""
    return touch.value.args[1]


def release_slice_starts(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """Drop the marked first touch of each slice no peer writes, and put a CTA barrier before
    the slice's first real access, so MergeSharedMemoryAllocations may overlay the slice on
    buffers dead by then (a GEMM's operand pipeline: the partial tile then costs no SMEM of its
    own, and two CTAs fit per SM). Safe after ThreadSync: peers only read the slice after the
    cluster barrier that follows this CTA's own writes, the end touch keeps it live until the
    kernel ends, and the barrier keeps a warp's first write after every warp's last read of
    what the slice overlays. Runs right before MergeSharedMemoryAllocations."""

    def on_seq(seq: tirx.SeqStmt):
        items = list(seq.seq)
        marked = [i for i, s in enumerate(items)
                  if isinstance(s, tirx.AttrStmt) and s.attr_key == RELEASABLE_START_KEY]
        if not marked:
            return seq
        out = []
        pending = []  # buffers whose first access is still ahead in this sequence
        for i, stmt in enumerate(items):
            if i in marked:
                pending.append(_touched_buffer(stmt.body))
                continue
            first = [b for b in pending if uses(stmt, b)]
            if first:
                if not (out and is_barrier(out[-1])):
                    out.append(tirx.Evaluate(T.tvm_storage_sync("shared")))
                pending = [b for b in pending if not any(b.same_as(f) for f in first)]
            out.append(stmt)
        return tirx.SeqStmt(out)

    return func.with_body(tvm_ffi.structural_map(func.body, [(tirx.SeqStmt, on_seq)]))


@tirx.transform.prim_func_pass(opt_level=0, name="tvm_dsm.ReleaseSliceStarts")
def ReleaseSliceStarts(func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx) -> tirx.PrimFunc:
    """Pass form of :func:`release_slice_starts`."""
    return release_slice_starts(func)
