"""Cluster split-K for a row reduction ``out[i] = sum_k f(i, k)`` (row sum, GEMV).

Each cluster owns ``rows_per_cluster`` rows. The K axis is split over the cluster's CTAs: CTA r
reduces columns ``[r*K/S, (r+1)*K/S)`` of every row of the tile into its slice of a DSM buffer
(``rfactor`` over the rank, placed with :func:`~tvm_dsm.schedule.place_in_dsm`); after the cluster
barrier, CTA r adds the S partials of its ``rows_per_cluster / S`` rows by reading its peers'
slices. One kernel, no atomics, no second pass through global memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx

from ..errors import ClusterError
from ..ir import uses
from tvm.s_tir.schedule import ExprRV

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


def reduction_block(sch: s_tir.Schedule) -> tuple[s_tir.schedule.SBlockRV, int, int]:
    """The function's single (rows, k) reduction block, with its two extents, its element-wise
    producers (``sum(x * x)`` as Relax fuses it: a multiply, then the sum) inlined into it."""
    for block in sch.get_child_blocks(sch.get_sblock("root"))[:-1]:  # the producers, in order
        try:
            sch.compute_inline(block)
        except tvm.s_tir.schedule.ScheduleError:
            break
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    if len(blocks) != 1:
        raise ClusterError(
            f"split-K reduction expects one reduction block after element-wise producers, got "
            f"{len(blocks)} blocks"
        )
    return (blocks[0], *reduction_extents(sch, blocks[0]))


def reduction_extents(sch: s_tir.Schedule, block) -> tuple[int, int]:
    """(rows, K) of a (spatial rows, reduce k) block; ClusterError for any other block."""
    iters = sch.get(block).iter_vars
    kinds = [int(iv.iter_type) for iv in iters]
    if kinds != [tirx.IterVar.DataPar, tirx.IterVar.CommReduce]:
        raise ClusterError(
            f"split-K reduction expects iterators (spatial rows, reduce k), got {kinds} "
            f"in block {sch.get(block).name_hint}"
        )
    rows, depth = (int(iv.dom.extent) for iv in iters)
    return rows, depth


CLUSTER_SIZES = (1, 2, 4, 8, 16)
ROWS_PER_CTA = (1, 2, 4, 8, 16)


def decision_candidates(rows: int, depth: int) -> tuple[list[int], list[int]]:
    """(cluster sizes, rows per CTA) whose every combination is a valid configuration."""
    sizes = [s for s in CLUSTER_SIZES if depth % s == 0]
    largest = max(sizes, default=1)
    per_cta = [r for r in ROWS_PER_CTA if rows % (largest * r) == 0]
    return sizes, per_cta


def candidate_configs(rows: int, depth: int) -> list[SplitKReductionConfig]:
    """Every configuration the rule can sample for a rows x depth reduction."""
    sizes, per_cta = decision_candidates(rows, depth)
    configs = [SplitKReductionConfig(s, s * r) for s in sizes for r in per_cta]
    for config in configs:
        check_config(rows, depth, config)  # the pruning guarantees validity
    return configs


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
    """Schedule ``func`` (one row-reduction block, after element-wise producers) as a cluster
    split-K kernel."""
    sch = s_tir.Schedule(func)
    block, rows, depth = reduction_block(sch)
    check_config(rows, depth, config)  # before rows_per_cluster is divided among the ranks
    s = config.cluster_size
    apply_split_k_reduction(sch, block, s, config.rows_per_cluster // s, config.warps)
    return sch


def _reads_along_reduction(block) -> list[int]:
    """The positions of ``block``'s reads whose region moves with its reduction iterators."""
    reduced = [iv.var for iv in block.iter_vars if iv.iter_type != tirx.IterVar.DataPar]
    return [i for i, region in enumerate(block.reads)
            if any(uses(r.min, v) for r in region.region for v in reduced)]


def apply_split_k_reduction(
    sch: s_tir.Schedule, block, cluster_size, rows_per_cta, warps: int = 4
) -> None:
    """Schedule ``block`` of ``sch`` in place. ``cluster_size`` and ``rows_per_cta`` may be
    sampled ExprRVs (MetaSchedule decisions): they become the split factors and the cluster
    annotation themselves, so replaying another decision reschedules accordingly."""
    rows, depth = reduction_extents(sch, block)
    s, per_cta = (int(sch.get(v)) if isinstance(v, ExprRV) else v for v in (cluster_size, rows_per_cta))
    check_config(rows, depth, SplitKReductionConfig(s, s * per_cta, warps))
    row_loop, k_loop = sch.get_loops(block)
    k_rank, _ = sch.split(k_loop, [cluster_size, None])
    partial = sch.rfactor(k_rank, factor_axis=0)
    row_loop, _ = sch.get_loops(block)
    cta, row_in_cta = sch.split(row_loop, [None, rows_per_cta])
    cluster_loop, _ = bind_cluster(sch, cta, cluster_size)
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
    # Each lane loads 16 contiguous bytes of every operand (staged in registers), a few such
    # vectors unrolled so that they are in flight ahead of the dependent adds (a non-dividing
    # factor under another decision only adds a predicate).
    # A per-row operand (a variance's mean) is read where it is used, not staged with the row.
    along_k = _reads_along_reduction(sch.get(partial))
    lanes = 16 // max(tvm.DataType(str(sch.get(partial).reads[i].source.ty.dtype)).bits // 8 for i in along_k)
    unroll = max(1, min(4, depth // s // (32 * lanes)))
    _, k_unrolled, k_lane, _ = sch.split(k_in_cta, [None, unroll, 32, lanes])
    sch.bind(k_lane, "threadIdx.x")
    sch.unroll(k_unrolled)
    for index in along_k:
        staged = sch.cache_read(partial, index, "local")
        sch.compute_at(staged, k_lane)
        sch.vectorize(sch.get_loops(staged)[-1])
    place_in_dsm(sch, partial, 0)
