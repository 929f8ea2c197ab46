"""Hoist warp-scope fragment buffers above the kernel's ``threadIdx.x`` launch.

TVM's LowerWarpMemory looks for the ``threadIdx.x`` launch *inside* a warp buffer's scope. A
kernel whose CTA-level blocks (a fused loop's states, set before the loop and read after it)
are bound to threads gets its launch above that loop, and the mma fragments allocated in the
loop body fall inside it: LowerWarpMemory stops ("Cannot find warp index"). Fragments are
registers of one warp either way, so allocating them once per kernel changes nothing else.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

from ..ir import find_all, seq


def _is_warp_buffer(stmt) -> bool:
    return isinstance(stmt, tirx.AllocBuffer) and str(stmt.buffer.ty.storage_scope) == "warp"


def _is_lane_launch(stmt) -> bool:
    return (isinstance(stmt, tirx.AttrStmt) and stmt.attr_key == "thread_extent"
            and stmt.node.thread_tag == "threadIdx.x")


def _hoisted(launch: tirx.AttrStmt) -> tirx.Stmt:
    """``launch`` with the warp buffers allocated inside it moved in front of it."""
    inside = find_all(launch.body, tirx.AllocBuffer, _is_warp_buffer)
    if not inside:
        return launch

    def drop(stmts: tirx.SeqStmt):
        kept = [s for s in stmts.seq if not _is_warp_buffer(s)]
        return stmts if len(kept) == len(stmts.seq) else seq(kept)

    body = tvm_ffi.structural_map(launch.body, [(tirx.SeqStmt, drop)])
    return tirx.SeqStmt([*inside, tirx.AttrStmt(launch.node, launch.attr_key, launch.value, body)])


def hoist_warp_buffers(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """Every kernel's lane launch of ``func`` with its warp buffers hoisted (a function may
    launch several kernels: a gather kernel before a GEMM chain's, say)."""
    launches = find_all(func.body, tirx.AttrStmt, _is_lane_launch)
    hoisted = [(launch, _hoisted(launch)) for launch in launches]
    if all(new.same_as(launch) for launch, new in hoisted):
        return func

    def on_attr(node: tirx.AttrStmt):
        return next((new for launch, new in hoisted if node.same_as(launch)), node)

    return func.with_body(tvm_ffi.structural_map(func.body, [(tirx.AttrStmt, on_attr)], order="pre"))


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.HoistWarpBuffers")
def HoistWarpBuffers(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """:func:`hoist_warp_buffers` on every PrimFunc of ``mod``."""
    return tvm.IRModule({gv: hoist_warp_buffers(f) if isinstance(f, tirx.PrimFunc) else f
                         for gv, f in mod.functions.items()}, attrs=mod.attrs)
