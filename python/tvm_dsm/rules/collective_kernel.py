"""Schedule the collective workloads (tvm_dsm.workloads.collectives) as one cluster kernel each.

Stage X loads each CTA's tile into DSM, the collective block computes the CTA's result slice Y
(with the matching primitive of tvm_dsm.schedule.collectives), stage O stores it. All three are
computed at the cluster loop; loops over ranks are bound to the rank, element loops to 128 threads
with 16-byte vectors.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ..schedule import bind_cluster, bind_rank, place_in_dsm
from ..schedule import collectives as primitives

THREADS = 128


def _tile_stage(sch: s_tir.Schedule, block, vector_lanes: int) -> None:
    """Rank loop (if it spans the cluster) to the rank, elements to threads x vectors."""
    rank, *_, elements = sch.get_loops(block)[1:]
    if int(sch.get(rank).extent) > 1:
        bind_rank(sch, rank)
    _, thread, vector = sch.split(elements, [None, THREADS, vector_lanes])
    sch.bind(thread, "threadIdx.x")
    sch.vectorize(vector)


#: Collectives whose data movement ``bulk=True`` sends by cp.async.bulk (copies, and the copy
#: half of a float reduce-scatter).
BULK_KINDS = ("broadcast", "all_exchange_rs_ag", "reduce_scatter")


def schedule_collective_kernel(
    func: tirx.PrimFunc, kind: str, cluster_size: int, bulk: bool = False
) -> s_tir.Schedule:
    """A cluster kernel for ``collective(kind, ...)``; ``copy`` is the no-exchange baseline.
    ``bulk``: the copy phase of a collective in BULK_KINDS moves by cp.async.bulk."""
    if bulk and kind not in BULK_KINDS:
        raise ValueError(f"bulk transfer applies to the copy phases of {BULK_KINDS}, not {kind!r}")
    sch = s_tir.Schedule(func)
    out = sch.get_sblock("O")
    cluster_tile, rank, elements = sch.get_loops(out)
    tile_dtype = str(sch.get(sch.get_sblock("X")).writes[0].source.ty.dtype)
    out_lanes = 8 if tile_dtype in ("float16", "bfloat16") else 4
    cluster, _ = bind_cluster(sch, sch.fuse(cluster_tile, rank), cluster_size)
    if len(sch.get(out).writes[0].source.ty.shape) == 2:  # resident: O is the CTA's sum
        _, thread = sch.split(elements, [None, THREADS])
        sch.bind(thread, "threadIdx.x")
    else:
        _, thread, vector = sch.split(elements, [None, THREADS, out_lanes])
        sch.bind(thread, "threadIdx.x")
        sch.vectorize(vector)
    stages = ("Y", "Z", "X") if kind == "all_exchange_rs_ag" else ("Y", "X")
    for name in stages:
        sch.compute_at(sch.get_sblock(name), cluster, preserve_unit_loops=True)
        place_in_dsm(sch, sch.get_sblock(name), 0)
    _tile_stage(sch, sch.get_sblock("X"), out_lanes)
    y = sch.get_sblock("Y")
    if kind == "copy":
        _tile_stage(sch, y, 4)
    elif kind == "all_exchange_rs_ag":
        primitives.reduce_scatter(sch, sch.get_sblock("Z"), threads=THREADS, bulk=bulk)
        primitives.all_gather(sch, y, threads=THREADS, bulk=bulk)
    elif kind in ("broadcast", "reduce_scatter"):
        getattr(primitives, kind)(sch, y, threads=THREADS, bulk=bulk)
    elif kind == "gated":  # an all-exchange whose combine is elementwise (no peer loop)
        primitives.all_exchange(sch, y, threads=THREADS)
    else:
        getattr(primitives, kind)(sch, y, threads=THREADS)
    return sch


def schedule_split_sum(func: tirx.PrimFunc, cluster_size: int) -> s_tir.Schedule:
    """``split_sum``: a reduce-scatter inside each cluster writes the cluster's partial to global
    memory (stage P, under the rank), then ``inter_cluster_reduce`` sums the clusters'."""
    sch = s_tir.Schedule(func)
    partial = sch.get_sblock("P")
    clusters, _, elements = sch.get_loops(partial)
    cluster, _ = bind_cluster(sch, sch.fuse(clusters, sch.get_loops(partial)[1]), cluster_size)
    _, thread, vector = sch.split(elements, [None, THREADS, 4])
    sch.bind(thread, "threadIdx.x")
    sch.vectorize(vector)
    for name in ("Z", "X"):
        sch.compute_at(sch.get_sblock(name), cluster, preserve_unit_loops=True)
        place_in_dsm(sch, sch.get_sblock(name), 0)
    _tile_stage(sch, sch.get_sblock("X"), 4)
    primitives.reduce_scatter(sch, sch.get_sblock("Z"), threads=THREADS)
    primitives.inter_cluster_reduce(sch, sch.get_sblock("O"), threads=THREADS)
    return sch
