"""Give cluster kernels their launch dimension and check their shared memory fits one CTA.

Runs after ``LowerThreadAllreduce`` (which rejects thread scopes of rank 2 such as
``clusterCtaIdx``) and before ``SplitHostDevice``, which turns every ``thread_extent`` attribute
into a launch parameter: ``clusterCtaIdx.x`` = S makes TVM's CUDA runtime launch with
``cudaLaunchAttributeClusterDimension`` (and, above 8, allow non-portable cluster sizes).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir import Range

from ..errors import ClusterError
from ..ir import find_all, replace_node
from ..schedule.cluster import RANK_TAG
from .lower_cluster import CLUSTER_LAUNCH_KEY, MAX_STATIC_SMEM, shared_bytes
from .tma_pipeline import MULTICAST_LAUNCH_KEY

#: Hopper: 227 KB of shared memory per CTA (opt-in).
MAX_SMEM_PER_CTA = 227 * 1024


def check_shared_memory(body, cluster_size: int) -> None:
    """Raise :class:`ClusterError` if a cluster kernel's CTA needs more SMEM than Hopper has."""
    static, dynamic = shared_bytes(body, "shared"), shared_bytes(body, "shared.dyn")
    if static > MAX_STATIC_SMEM:
        raise ClusterError(
            f"cluster kernel (cluster {cluster_size}) uses {static} B of static shared memory per "
            f"CTA; CUDA allows {MAX_STATIC_SMEM} B static: use scope 'shared.dyn' beyond that"
        )
    if static + dynamic > MAX_SMEM_PER_CTA:
        raise ClusterError(
            f"cluster kernel (cluster {cluster_size}) uses {static + dynamic} B of shared memory "
            f"per CTA; an H100 CTA has at most {MAX_SMEM_PER_CTA} B"
        )


def attach_cluster_launch(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """Replace each cluster marker with the ``clusterCtaIdx.x`` launch dimension. A kernel
    whose TMA pipeline multicasts (tvm_dsm.transform.tma_pipeline) launches clusters of the
    multicast's size; its CTAs must not also split work over a cluster of their own."""
    def is_marker(attr) -> bool:
        return attr.attr_key == CLUSTER_LAUNCH_KEY

    def is_multicast(attr) -> bool:
        return attr.attr_key == MULTICAST_LAUNCH_KEY

    # Checked outside the map callback (exceptions do not cross FFI), on the whole kernel:
    # StorageRewrite hoists shared allocations to the outermost thread_extent, above the marker.
    body = func.body
    for kernel in _kernels(func.body):
        markers = find_all(kernel.body, tirx.AttrStmt, is_marker)
        sizes = {int(m.value) for m in find_all(kernel.body, tirx.AttrStmt, is_multicast)}
        if len(sizes) > 1 or (sizes and markers and int(markers[0].value) != 1):
            raise ClusterError(f"one kernel multicasts over clusters of {sorted(sizes)} and splits "
                               f"work over clusters of {[int(m.value) for m in markers]}")
        if sizes:  # the multicast sets the kernel's cluster (one marker, at its top)
            size = sizes.pop()
            launch = markers[0].body if markers else kernel.body
            marker = tirx.AttrStmt(tvm.ir.StringImm("cluster"), CLUSTER_LAUNCH_KEY, size, launch)
            body = replace_node(body, markers[0], marker) if markers else replace_node(
                body, kernel, tirx.AttrStmt(kernel.node, kernel.attr_key, kernel.value, marker))
            markers = [marker]
        if markers:
            check_shared_memory(kernel.body, int(markers[0].value))

    def on_attr(attr):
        if is_multicast(attr):
            return attr.body
        if not is_marker(attr):
            return attr
        size = int(attr.value)
        rank = tirx.Var("cluster_rank", "int32")
        node = tirx.IterVar(Range(0, size), rank, tirx.IterVar.ThreadIndex, RANK_TAG)
        return tirx.AttrStmt(node, "thread_extent", size, attr.body)

    return func.with_body(tvm_ffi.structural_map(body, [(tirx.AttrStmt, on_attr)]))


def _kernels(body) -> list:
    """The outermost ``blockIdx`` launch attributes of ``body``: one per kernel."""
    grids = find_all(body, tirx.AttrStmt, lambda a: a.attr_key == "thread_extent"
                     and str(a.node.thread_tag).startswith("blockIdx"))
    return [g for g in grids if not any(o is not g and find_all(o.body, tirx.AttrStmt, g.same_as)
                                        for o in grids)]


@tirx.transform.prim_func_pass(opt_level=0, name="tvm_dsm.AttachClusterLaunch")
def AttachClusterLaunch(func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx) -> tirx.PrimFunc:
    """Pass form of :func:`attach_cluster_launch`."""
    return attach_cluster_launch(func)
