"""Cluster split-K for a row reduction ``out[i] = sum_k f(i, k)`` (row sum, GEMV).

Each cluster owns ``rows_per_cluster`` rows. The K axis is split over the cluster's CTAs: CTA r
reduces columns ``[r*K/S, (r+1)*K/S)`` of every row of the tile into its slice of a DSM buffer
(``rfactor`` over the rank, placed with :func:`~tvm_dsm.schedule.place_in_dsm`); after the cluster
barrier, CTA r adds the S partials of its ``rows_per_cluster / S`` rows by reading its peers'
slices. One kernel, no atomics, no second pass through global memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import s_tir, tirx

from ..errors import ClusterError
from ..schedule import bind_cluster, bind_rank, check_cluster_size, place_in_dsm


@dataclass(frozen=True)
class SplitKReductionConfig:
    """Tunable knobs of the schedule (a point of its design space)."""

    cluster_size: int
    rows_per_cluster: int
    warps: int = 4  # each warp reduces its own rows: lanes split K, a warp shuffle combines

    @property
    def threads(self) -> int:
        return 32 * self.warps


def _reduction_block(sch: s_tir.Schedule) -> tuple[s_tir.schedule.SBlockRV, int, int]:
    """The function's single (rows, k) reduction block, with its two extents."""
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    if len(blocks) != 1:
        raise ClusterError(
            f"split-K reduction expects one block (inline elementwise producers first), got "
            f"{len(blocks)}"
        )
    block = blocks[0]
    iters = sch.get(block).iter_vars
    kinds = [int(iv.iter_type) for iv in iters]
    if kinds != [tirx.IterVar.DataPar, tirx.IterVar.CommReduce]:
        raise ClusterError(
            f"split-K reduction expects iterators (spatial rows, reduce k), got {kinds} "
            f"in block {sch.get(block).name_hint}"
        )
    rows, depth = (int(iv.dom.extent) for iv in iters)
    return block, rows, depth


def check_config(rows: int, depth: int, config: SplitKReductionConfig) -> None:
    """Raise :class:`ClusterError` naming the first constraint ``config`` breaks."""
    s, mt = config.cluster_size, config.rows_per_cluster
    check_cluster_size(s)
    if depth % s:
        raise ClusterError(f"K={depth} is not divisible by the cluster size {s}")
    if mt % s:
        raise ClusterError(f"rows_per_cluster={mt} is not divisible by the cluster size {s}")
    if rows % mt:
        raise ClusterError(f"M={rows} rows are not divisible by rows_per_cluster={mt}")
    if not 1 <= config.warps <= 32:
        raise ClusterError(f"warps={config.warps} must be in [1, 32]")


def schedule_split_k_reduction(
    func: tirx.PrimFunc, config: SplitKReductionConfig
) -> s_tir.Schedule:
    """Schedule ``func`` (one row-reduction block) as a cluster split-K kernel."""
    sch = s_tir.Schedule(func)
    block, rows, depth = _reduction_block(sch)
    check_config(rows, depth, config)
    s, warps = config.cluster_size, config.warps
    row_loop, k_loop = sch.get_loops(block)
    k_rank, _ = sch.split(k_loop, [s, None])
    partial = sch.rfactor(k_rank, factor_axis=0)
    row_loop, _ = sch.get_loops(block)
    cta, row_in_cta = sch.split(row_loop, [None, config.rows_per_cluster // s])
    cluster_loop, _ = bind_cluster(sch, cta, s)
    # Before the consumer's thread split: compute_at's region ignores split predicates.
    sch.compute_at(partial, cluster_loop, preserve_unit_loops=True)
    # Both stages use the same (32, warps) thread shape: UnifyThreadBinding needs equal extents.
    _, row_warp, row_lane = sch.split(row_in_cta, [None, warps, 32])
    sch.bind(row_warp, "threadIdx.y")
    sch.bind(row_lane, "threadIdx.x")
    rank_loop, rows, k_in_cta = sch.get_loops(partial)[1:]
    bind_rank(sch, rank_loop)
    _, row_warp = sch.split(rows, [None, warps])
    sch.bind(row_warp, "threadIdx.y")
    # Unrolled: several independent loads per lane in flight ahead of the dependent adds.
    unroll = max(1, min(8, depth // s // 32))
    _, k_unrolled, k_lane = sch.split(k_in_cta, [None, unroll, 32])
    sch.bind(k_lane, "threadIdx.x")
    sch.unroll(k_unrolled)
    place_in_dsm(sch, partial, 0)
    return sch
