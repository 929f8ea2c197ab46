"""TVM's StorageRewrite, skipped where a global allocation is reached by another name.

StorageRewrite follows each allocation through its own buffer only. Two of tvm-dsm's
schedules reach an allocation otherwise, and StorageRewrite then breaks them:

* a TMA main loop (:mod:`tvm_dsm.transform.tma_pipeline`) reads its source through a tensor
  map encoded on the host before the kernels launch, so the workspace a gather kernel writes
  for it looks dead after the gather and StorageRewrite hands its memory to a later allocation
  (measured on the C6 convolution chain: the chain's fp32 partials took it, and TVM rejected
  the retyped buffer; with equal types the partials would have overwritten the operand);
* buffers declared on a workspace's data (the convolution chain's kernels run on views of
  their workspaces): StorageRewrite retypes the allocation to vectors of the widest store and
  TVM's async-copy injection then fails on the views' loads (C1, C5).

Such functions keep their allocations as scheduled; shared memory is still overlaid by
liveness in MergeSharedMemoryAllocations.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from ..ir import find_all

_ENCODE = "runtime.cuTensorMapEncodeTiled"


def _buffer_of(data) -> tirx.Var | None:
    """The buffer whose data ``data`` (``tirx.buffer_data(B)``) is, or None."""
    is_data = isinstance(data, tvm.ir.Call) and data.op.name == "tirx.buffer_data"
    return data.args[0] if is_data else None


def _is_encode(call: tvm.ir.Call) -> bool:
    """Whether ``call`` is the host call encoding a tensor map."""
    return (call.op.name == "tirx.tvm_call_packed" and isinstance(call.args[0], tvm.ir.StringImm)
            and call.args[0].value == _ENCODE)


def aliased_allocations(func: tirx.PrimFunc) -> list[tirx.Var]:
    """The global buffers ``func`` allocates itself that a tensor map or another buffer
    declared on their data also reaches."""
    views = {d.buffer: _buffer_of(d.data) for d in find_all(func.body, tirx.DeclBuffer)}
    allocated = {a.buffer for a in find_all(func.body, tirx.AllocBuffer)
                 if str(a.buffer.ty.storage_scope) == "global"}
    encodes = find_all(func.body, tvm.ir.Call, _is_encode)
    found = []
    for buffer in [*views.values(), *(_buffer_of(e.args[4]) for e in encodes)]:
        while buffer in views:
            buffer = views[buffer]
        if buffer in allocated:
            found.append(buffer)
    return found


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.StorageRewrite")
def StorageRewrite(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """TVM's StorageRewrite on every PrimFunc without :func:`aliased_allocations`."""
    rewritable = {gv: f for gv, f in mod.functions.items()
                  if isinstance(f, tirx.PrimFunc) and not aliased_allocations(f)}
    if not rewritable:
        return mod
    rewritten = tirx.transform.StorageRewrite()(tvm.IRModule(rewritable, attrs=mod.attrs))
    return tvm.IRModule({gv: rewritten[gv] if gv in rewritable else f for gv, f in mod.functions.items()},
                        attrs=mod.attrs)
