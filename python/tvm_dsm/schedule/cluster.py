"""Bind schedule loops to thread-block clusters with CUDA's launch semantics.

Stock s_tir accepts ``sch.bind(loop, "clusterCtaIdx.x")`` but TVM's runtime launches
``blockIdx.x``'s extent as the *total* CTA count and the cluster extent only as the cluster shape,
so a ``blockIdx.x(C) x clusterCtaIdx.x(S)`` nest runs C CTAs instead of C*S and leaves most of the
output unwritten. :func:`bind_cluster` records the intent as an annotation; tvm-dsm's lowering
(:mod:`tvm_dsm.transform.lower_cluster`) then launches C*S CTAs and derives the cluster index and
the rank from ``blockIdx.x``.
"""

from __future__ import annotations

from tvm import s_tir
from tvm.s_tir.schedule import ExprRV, LoopRV

from ..errors import ClusterError
from ..annotations import CLUSTER_SIZE_KEY

#: Thread tag whose loop variable is a CTA's rank inside its cluster.
RANK_TAG = "clusterCtaIdx.x"
#: Hopper launches clusters of up to 16 CTAs; above 8 the size is non-portable (the TVM CUDA
#: runtime then sets cudaFuncAttributeNonPortableClusterSizeAllowed itself).
MAX_CLUSTER_SIZE = 16
MAX_PORTABLE_CLUSTER_SIZE = 8


def check_cluster_size(size: int) -> None:
    """Raise :class:`ClusterError` unless ``size`` CTAs can form one cluster on Hopper."""
    if not isinstance(size, int) or not 1 <= size <= MAX_CLUSTER_SIZE:
        raise ClusterError(
            f"cluster size {size!r} is out of range: Hopper clusters hold 1 to "
            f"{MAX_CLUSTER_SIZE} CTAs (above {MAX_PORTABLE_CLUSTER_SIZE} is non-portable)"
        )


def _const_extent(sch: s_tir.Schedule, loop: LoopRV) -> int:
    extent = sch.get(loop).extent
    if not hasattr(extent, "value"):
        raise ClusterError(f"cluster loops need a constant extent, got {extent}")
    return int(extent.value)


def bind_cluster(
    sch: s_tir.Schedule, loop: LoopRV, cluster_size: int | ExprRV
) -> tuple[LoopRV, LoopRV]:
    """Launch one CTA per iteration of ``loop``, grouped into clusters of ``cluster_size``.

    ``loop`` iterates over all CTAs of the grid. It is split into ``(cluster, rank)``: the cluster
    loop is bound to ``blockIdx.x`` and annotated with the cluster size, the rank loop to
    ``clusterCtaIdx.x``. The rank loop's variable is the CTA's rank in its cluster; compute other
    stages under the cluster loop and bind their rank loops with :func:`bind_rank`. Only
    instructions MetaSchedule records (split, bind, annotate) are used, so traces replay; a
    sampled ``cluster_size`` (an ExprRV) stays a decision of the trace.

    Returns
    -------
    (cluster_loop, rank_loop)
    """
    size = int(sch.get(cluster_size)) if isinstance(cluster_size, ExprRV) else cluster_size
    check_cluster_size(size)
    grid = _const_extent(sch, loop)
    if grid % size:
        raise ClusterError(
            f"grid of {grid} CTAs is not divisible by cluster size {size}: every cluster "
            "must be full"
        )
    cluster_loop, rank_loop = sch.split(loop, [None, cluster_size])
    _bind_nest(sch, cluster_loop, rank_loop, cluster_size)
    return cluster_loop, rank_loop


def bind_cluster_nest(sch: s_tir.Schedule, cluster_loop: LoopRV, rank_loop: LoopRV) -> None:
    """Like :func:`bind_cluster` for a schedule that already has the two loops: ``cluster_loop``
    over the clusters and, directly inside it, ``rank_loop`` over the CTAs of one (its extent is
    the cluster size). Keeping them apart keeps the block bindings free of the ``// S`` and
    ``% S`` a split of one fused loop leaves, which TVM's buffer compaction cannot bound."""
    size = _const_extent(sch, rank_loop)
    check_cluster_size(size)
    _bind_nest(sch, cluster_loop, rank_loop, size)


def _bind_nest(sch, cluster_loop: LoopRV, rank_loop: LoopRV, size: int | ExprRV) -> None:
    bind_clusters(sch, cluster_loop, size)
    sch.bind(rank_loop, RANK_TAG)


def bind_clusters(sch: s_tir.Schedule, loop: LoopRV, size: int | ExprRV) -> None:
    """Launch one cluster of ``size`` CTAs per iteration of ``loop``, for stages whose rank
    loops sit inside child blocks (bind each with :func:`bind_rank`)."""
    check_cluster_size(int(sch.get(size)) if isinstance(size, ExprRV) else size)
    sch.bind(loop, "blockIdx.x")
    sch.annotate(loop, CLUSTER_SIZE_KEY, size)  # an ExprRV stays a trace decision


def bind_rank(sch: s_tir.Schedule, loop: LoopRV) -> None:
    """Bind another stage's loop over the cluster's CTAs (extent = cluster size) to the rank.

    Use it for a producer computed at the cluster loop (``compute_at``) whose outer loop runs over
    the ranks, the way a second stage's loop is bound to ``threadIdx.x``. The extent is checked
    against the enclosing cluster when the function is lowered.
    """
    check_cluster_size(_const_extent(sch, loop))
    sch.bind(loop, RANK_TAG)
