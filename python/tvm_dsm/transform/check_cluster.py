"""Check cluster schedules before lowering, and mark the stages that run once per cluster.

Runs first on the s_tir form, where loops, blocks and annotations are still visible. It rejects
what stock TVM would compile into wrong kernels, and marks every block computed at a cluster loop
but outside any rank loop that writes DSM: s_tir runs such a block once per cluster, while every
CTA of the cluster would execute it on the GPU, so the lowering runs it on rank 0 only. The
same holds for such a block that writes global memory (a read-modify-write, e.g. an accumulation,
would be applied once per CTA). Blocks writing CTA-local memory (shared, local) stay on every CTA:
each CTA needs its own copy.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import SBlock

from ..errors import ClusterError
from ..ir import find_all, with_block_fields
from ..schedule.cluster import MAX_CLUSTER_SIZE, RANK_TAG
from ..annotations import CLUSTER_SIZE_KEY
from ..schedule.dsm import DSM_SCOPE
from ..annotations import ROOT_ONLY_KEY


#: Shared-memory scopes TVM's CUDA codegen really places in shared memory. Any other "shared..."
#: scope (e.g. "shared.cluster", "shared::cta") is silently lowered to a per-thread array by stock
#: TVM 0.27, so it is rejected here.
_SHARED_SCOPES = ("shared", "shared.dyn", DSM_SCOPE)


def _thread_tag(loop: tirx.For) -> str | None:
    if loop.kind != tirx.ForKind.THREAD_BINDING or loop.thread_binding is None:
        return None
    return str(loop.thread_binding.thread_tag)


def check_function(func: tirx.PrimFunc) -> list[SBlock]:
    """Raise :class:`ClusterError` for unsupported cluster bindings or storage scopes; return the
    blocks that run once per cluster and write DSM or global memory."""
    cluster_stack: list[int | None] = []
    in_rank: list[bool] = []
    root_only: list[SBlock] = []
    errors: list[str] = []  # raised after the walk: exceptions do not cross the FFI callback

    def visit_for(loop: tirx.For, visitor) -> None:
        tag = _thread_tag(loop)
        if tag is not None and tag.startswith("clusterCtaIdx") and tag != RANK_TAG:
            errors.append(f"only 1-D clusters are supported; loop bound to {tag}")
        if tag == "blockIdx.x":
            size = loop.annotations.get(CLUSTER_SIZE_KEY)
            cluster_stack.append(None if size is None else int(size))
            visitor.default_visit(loop)
            cluster_stack.pop()
            return
        if tag == RANK_TAG:
            in_rank.append(True)
            size = cluster_stack[-1] if cluster_stack else None
            if size is None:
                errors.append(
                    f"loop {loop.loop_var} is bound to {RANK_TAG} without "
                    "tvm_dsm.schedule.bind_cluster: TVM launches blockIdx.x's extent as the total "
                    "CTA count, so this kernel would run only 1/cluster of its iterations"
                )
            elif not 1 <= size <= MAX_CLUSTER_SIZE:
                errors.append(f"cluster size {size} is out of range 1..{MAX_CLUSTER_SIZE}")
            elif int(loop.extent) != size:
                errors.append(
                    f"rank loop {loop.loop_var} has extent {loop.extent} but its cluster has "
                    f"{size} CTAs"
                )
            visitor.default_visit(loop)
            in_rank.pop()
            return
        visitor.default_visit(loop)

    def visit_block(block, visitor) -> None:
        in_cluster = bool(cluster_stack) and cluster_stack[-1] is not None
        writes_cluster_wide = any(
            str(w.source.ty.storage_scope) in (DSM_SCOPE, "global") for w in block.writes
        )
        # A block whose own body binds the rank (a fused cascade's row) leaves that to its children.
        ranks_inside = find_all(block.body, tirx.For, lambda f: _thread_tag(f) == RANK_TAG)
        if in_cluster and not in_rank and writes_cluster_wide and not ranks_inside:
            root_only.append(block)
        visitor.default_visit(block)

    def visit_var(var: tirx.Var, _visitor) -> None:
        if not isinstance(var.ty, tirx.BufferType):  # TVM 0.27: a buffer is a Var of BufferType
            return
        scope = str(var.ty.storage_scope)
        if scope.startswith("shared") and scope not in _SHARED_SCOPES:
            errors.append(
                f"buffer {var.name} has storage scope {scope!r}, which TVM would lower to a "
                f"per-thread array; use one of {_SHARED_SCOPES} (DSM: tvm_dsm.schedule.place_in_dsm)"
            )

    tvm_ffi.structural_visit(
        func.body, [(tirx.For, visit_for), (SBlock, visit_block), (tirx.Var, visit_var)]
    )
    if errors:
        raise ClusterError(errors[0])
    return root_only


@tirx.transform.prim_func_pass(opt_level=0, name="tvm_dsm.CheckClusterSchedule")
def CheckClusterSchedule(func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx) -> tirx.PrimFunc:
    """Pass form of :func:`check_function`; marks once-per-cluster DSM writers (by identity: the
    branches of a function dispatching on its row count hold blocks of one name)."""
    root_only = check_function(func)
    if not root_only:
        return func

    def mark(block: SBlock) -> SBlock:
        if not any(block.same_as(b) for b in root_only):
            return block
        return with_block_fields(block, annotations={**block.annotations, ROOT_ONLY_KEY: 1})

    return func.with_body(tvm_ffi.structural_map(func.body, [(SBlock, mark)], order="pre"))
