"""TVM's StorageRewrite, run per kernel where a global allocation is reached by another name.

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

In such functions StorageRewrite runs inside each kernel only, where it sees the kernel's
shared and local allocations and none of the function's global ones: a gated chain's kernel
still runs its gate and up main loops in one set of pipeline buffers (without it, 64x64
tiles took 76,832 B of shared memory where one set needs 67,632, and two CTAs fit on an SM
where three were planned).
"""

from __future__ import annotations

import tvm
from tvm import tirx

from ..ir import find_all, replace_node
from .buffers import buffers_used

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


def _is_launch(stmt) -> bool:
    return isinstance(stmt, tirx.AttrStmt) and stmt.attr_key == "thread_extent"


def _rewrite_kernels(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """TVM's StorageRewrite on each kernel of ``func`` (an outermost ``thread_extent``) alone:
    with the on-chip buffers it uses (allocated at the function's level until StorageRewrite
    moves them into their kernel), the function's other buffers as parameters. A kernel it
    does not return whole with those allocations inside is left as scheduled."""
    launches = find_all(func.body, tirx.AttrStmt, _is_launch)
    inner = {hash(a) for launch in launches for a in find_all(launch.body, tirx.AttrStmt, _is_launch)}
    kernels = [a for a in launches if hash(a) not in inner]
    inside = {hash(a) for k in kernels for a in find_all(k, tirx.AllocBuffer)}
    on_chip = {hash(a.buffer): a for a in find_all(func.body, tirx.AllocBuffer)
               if hash(a) not in inside and str(a.buffer.ty.storage_scope) != "global"}
    body = func.body
    for kernel in kernels:
        own = {hash(a.buffer) for a in find_all(kernel, (tirx.AllocBuffer, tirx.DeclBuffer))}
        used = {hash(b): b for b in _buffers_reached(kernel) if hash(b) not in own}
        allocs = [on_chip[key] for key in used if key in on_chip]
        params = [b for key, b in used.items() if key not in on_chip]
        alone = tirx.PrimFunc(params, tirx.SeqStmt([*allocs, kernel]) if allocs else kernel)
        rewritten = tirx.transform.StorageRewrite()(tvm.IRModule({"kernel": alone}))["kernel"].body
        if not _is_launch(rewritten):
            continue
        body = replace_node(body, kernel, rewritten)
        for alloc in allocs:  # now inside the kernel
            body = replace_node(body, alloc, tirx.Evaluate(0))
    return func.with_body(body)


def _buffers_reached(stmt) -> list:
    """The buffers ``stmt`` loads, stores or declares a view of."""
    views = [b for b in (_buffer_of(d.data) for d in find_all(stmt, tirx.DeclBuffer)) if b is not None]
    return buffers_used(stmt) + views


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.StorageRewrite")
def StorageRewrite(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """TVM's StorageRewrite on every PrimFunc without :func:`aliased_allocations`, and inside
    each kernel of those with them."""
    funcs = {gv: f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}
    whole = {gv: f for gv, f in funcs.items() if not aliased_allocations(f)}
    rewritten = tirx.transform.StorageRewrite()(tvm.IRModule(whole, attrs=mod.attrs)) if whole else {}
    return tvm.IRModule({gv: rewritten[gv] if gv in whole else _rewrite_kernels(f) if gv in funcs else f
                         for gv, f in mod.functions.items()}, attrs=mod.attrs)
