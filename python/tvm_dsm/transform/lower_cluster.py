"""Lower cluster-bound kernels: real CTAs, DSM slices, remote accesses and cluster barriers.

Runs after ``LowerOpaqueBlock`` (block variables are gone, thread bindings are ``thread_extent``
attributes, indices are still multi-dimensional) and before ``LowerThreadAllreduce``. For each
kernel whose ``blockIdx.x`` (extent C) encloses a ``clusterCtaIdx.x`` binding (extent S):

* the kernel launches C*S CTAs: ``blockIdx.x`` is rebound so that the old cluster index is
  ``blockIdx.x // S`` and the rank is ``blockIdx.x % S`` (CUDA's ``%cluster_ctarank`` for 1-D
  clusters); the ``clusterCtaIdx`` binding is removed, which also keeps stock
  ``LowerThreadAllreduce`` (which rejects thread scopes of rank 2) working inside clusters, and
  an attribute records S for :mod:`tvm_dsm.transform.cluster_launch`;
* every ``shared::cluster`` buffer ``B[S, ...]`` becomes the CTA's own slice ``B[...]`` in
  ``shared``; an access ``B[r, i]`` stays local when ``r`` is provably the CTA's rank and otherwise
  becomes ``mapa`` + ``ld/st.shared::cluster`` (TVM's own ``T.ptx`` intrinsics);
* every stage (statement of the CTA-uniform sequence) that touches a peer's slice is fenced by
  ``barrier.cluster`` arrive/wait before (peers have written, and have started) and after (peers
  have finished reading before anyone overwrites or exits);
* a copy loop marked for bulk transfer becomes mbarrier-completed ``cp.async.bulk`` pushes
  (:mod:`tvm_dsm.transform.bulk_copy`), always preceded by ``fence.proxy.async`` and a barrier.

One kernel's lowering is :mod:`tvm_dsm.transform.kernel_lowering`; its slices
:mod:`tvm_dsm.transform.dsm_buffer`, its barriers :mod:`tvm_dsm.transform.cluster_barriers`.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from ..errors import ClusterError
from ..ir import find_all, is_thread_extent, replace_node
from ..schedule.cluster import RANK_TAG
from ..schedule.dsm import DSM_SCOPE
from .kernel_lowering import ClusterKernelLowering

__all__ = ["LowerCluster", "lower_cluster_function"]


def lower_cluster_function(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """Apply the lowering described in the module docstring to every cluster kernel of ``func``."""

    body = func.body  # lowered outside map callbacks: exceptions do not cross the FFI boundary
    for kernel in find_all(func.body, tirx.AttrStmt, lambda a: is_thread_extent(a, "blockIdx.x")):
        ranks = find_all(kernel.body, tirx.AttrStmt, lambda a: is_thread_extent(a, RANK_TAG))
        if ranks:
            body = replace_node(body, kernel, ClusterKernelLowering(kernel, ranks).lower())
    stray = find_all(
        body, tirx.AllocBuffer, lambda a: str(a.buffer.ty.storage_scope) == DSM_SCOPE
    )
    if stray:
        raise ClusterError(
            f"buffer {stray[0].buffer.name} is placed in DSM but its kernel has no cluster; bind "
            "one with tvm_dsm.schedule.bind_cluster"
        )
    return func.with_body(body)


@tirx.transform.prim_func_pass(opt_level=0, name="tvm_dsm.LowerCluster")
def LowerCluster(func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx) -> tirx.PrimFunc:
    """Pass form of :func:`lower_cluster_function`."""
    return lower_cluster_function(func)
