"""Give cluster kernels their launch dimension and check their shared memory fits one CTA.

Runs after ``LowerThreadAllreduce`` (which rejects thread scopes of rank 2 such as
``clusterCtaIdx``) and before ``SplitHostDevice``, which turns every ``thread_extent`` attribute
into a launch parameter: ``clusterCtaIdx.x`` = S makes TVM's CUDA runtime launch with
``cudaLaunchAttributeClusterDimension`` (and, above 8, allow non-portable cluster sizes). The
shared-memory limit checked is that of the :class:`~tvm_dsm.hardware.Hardware` the pass is given.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir import Range

from ..errors import ClusterError
from ..hardware import Hardware
from ..ir import find_all
from ..schedule.cluster import RANK_TAG
from .buffers import MAX_STATIC_SMEM, shared_bytes
from ..annotations import CLUSTER_LAUNCH_KEY


def check_shared_memory(body, cluster_size: int, hw: Hardware) -> None:
    """Raise :class:`ClusterError` if a cluster kernel's CTA needs more SMEM than a CTA of ``hw``
    may use, or more static SMEM than CUDA allows."""
    static, dynamic = shared_bytes(body, "shared"), shared_bytes(body, "shared.dyn")
    if static > MAX_STATIC_SMEM:
        raise ClusterError(
            f"cluster kernel (cluster {cluster_size}) uses {static} B of static shared memory per "
            f"CTA; CUDA allows {MAX_STATIC_SMEM} B static: use scope 'shared.dyn' beyond that"
        )
    if static + dynamic > hw.smem_per_cta:
        raise ClusterError(
            f"cluster kernel (cluster {cluster_size}) uses {static + dynamic} B of shared memory "
            f"per CTA; an {hw.device} CTA has at most {hw.smem_per_cta} B"
        )


def attach_cluster_launch(func: tirx.PrimFunc, hw: Hardware) -> tirx.PrimFunc:
    """Replace each cluster marker with the ``clusterCtaIdx.x`` launch dimension, checking each
    cluster kernel's shared memory against ``hw``."""
    def is_marker(attr) -> bool:
        return attr.attr_key == CLUSTER_LAUNCH_KEY

    # Checked outside the map callback (exceptions do not cross FFI), on the whole kernel:
    # StorageRewrite hoists shared allocations to the outermost thread_extent, above the marker.
    for kernel in find_all(func.body, tirx.AttrStmt, lambda a: a.attr_key == "thread_extent"):
        markers = find_all(kernel.body, tirx.AttrStmt, is_marker)
        if markers:
            check_shared_memory(kernel.body, int(markers[0].value), hw)

    def on_attr(attr):
        if not is_marker(attr):
            return attr
        size = int(attr.value)
        rank = tirx.Var("cluster_rank", "int32")
        node = tirx.IterVar(Range(0, size), rank, tirx.IterVar.ThreadIndex, RANK_TAG)
        return tirx.AttrStmt(node, "thread_extent", size, attr.body)

    return func.with_body(tvm_ffi.structural_map(func.body, [(tirx.AttrStmt, on_attr)]))


def AttachClusterLaunch(hw: Hardware) -> tvm.transform.Pass:
    """Pass form of :func:`attach_cluster_launch` for the GPU ``hw`` describes."""

    @tirx.transform.prim_func_pass(opt_level=0, name="tvm_dsm.AttachClusterLaunch")
    def attach(func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx) -> tirx.PrimFunc:
        return attach_cluster_launch(func, hw)

    return attach
