"""DSM collectives as s_tir schedule primitives.

A collective is a block that reads a DSM tile ``X[rank, ...]`` (one slice per CTA of the cluster)
and writes the CTA's own slice of a result ``Y[rank, ...]``, computed at the cluster loop. Who
sends what to whom follows from the block's indices; the primitive checks the pattern, then
schedules the block for bandwidth with recorded instructions only (so traces replay):

* ``all_exchange``   ``Y[r, i] = sum_p X[p, i]``: every CTA reads every peer's whole tile;
* ``reduce_scatter`` ``Y[r, j] = sum_p X[p, r*m + j]``: CTA r reads part r of every peer's tile;
* ``all_gather``     ``Y[r, i] = Z[i // m, i % m]``: every CTA reads part q from rank q; after a
  ``reduce_scatter`` it completes an all-exchange with 2 (S - 1) / S of the traffic;
* ``broadcast``      ``Y[r, i] = X[root, i]``: scatter from the root, then all-gather;
* ``shuffle``        ``Y[r, i] = f(X[(r + t) % S, i] for t in rounds)``: ring order, CTA r reads
  the tile of rank r+t in round t, so each round every CTA reads a different peer;
* ``inter_cluster_reduce`` ``O[i] = sum_k P[k, i]`` over partials that clusters wrote to global
  memory: a deterministic second kernel that adds them in cluster order (no atomics; a TMA
  bulk reduce-add into global memory would be non-deterministic in its order).

Scheduling: the rank loop is bound to the cluster rank, the element loop is split over threads
with an innermost vector of 16 bytes (lowered to ``ld.shared::cluster.v4``/``.v2``), and the peer
loop of an order-free sum is annotated so each CTA starts at its own rank (no hot peer).
Remote reads are fenced by cluster barriers by the lowering (tvm_dsm.transform.lower_cluster).

Pure copies (``all_gather``, ``broadcast``; any block through ``bulk_copy``) can instead move
through the copy engine: ``bulk=True`` marks them for ``cp.async.bulk.shared::cluster`` pushes
that complete on the receiver's mbarrier (tvm_dsm.transform.bulk_copy), so no thread loads or
stores the data and each transfer is one instruction of up to the whole slice.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.tirx import IndexMap

from ..errors import ClusterError
from ..ir import is_reduction
from .cluster import bind_rank
from ..annotations import CLUSTER_SIZE_KEY
from .dsm import DSM_SCOPE
from ..annotations import BULK_COPY_KEY, ROTATE_PEERS_KEY



def _dsm_reads(sch: s_tir.Schedule, block) -> list:
    return [
        region
        for region in sch.get(block).reads
        if str(region.source.ty.storage_scope) == DSM_SCOPE
    ]


def _check_reads_dsm(sch: s_tir.Schedule, block, collective: str) -> None:
    if not _dsm_reads(sch, block):
        raise ClusterError(
            f"{collective}: block {sch.get(block).name_hint} reads no DSM buffer; place the tile "
            "in DSM first (tvm_dsm.schedule.place_in_dsm)"
        )


def _element_bytes(sch: s_tir.Schedule, block) -> int:
    """The wider of the DSM element and the result element: vectors of either stay <= 16 B
    (TVM 0.27's CUDA codegen emits invalid code for wider ones, e.g. a float32x8 broadcast)."""
    read = _dsm_reads(sch, block)[0].source
    written = sch.get(block).writes[0].source
    return max(tvm.DataType(str(b.ty.dtype)).bits // 8 for b in (read, written))


def _schedule_elements(sch, block, element_loop, threads: int, vector_bytes: int, elem_bytes: int):
    """Split the element loop into (outer, thread, chunk, vector): threads, a few unrolled chunks
    per thread, and a 16-byte (or smaller) innermost vector. ``chunk`` is None when a thread
    has a single chunk."""
    if vector_bytes % elem_bytes or vector_bytes not in (4, 8, 16):
        raise ClusterError(
            f"vector of {vector_bytes} B: DSM vectors are 4, 8 or 16 B of {elem_bytes}-B elements"
        )
    extent = int(sch.get(element_loop).extent)
    lanes = vector_bytes // elem_bytes
    if extent % lanes:
        raise ClusterError(
            f"tile of {extent} elements per CTA is not a multiple of the {lanes}-element vector "
            f"({vector_bytes} B): DSM slices move in whole vectors"
        )
    outer, thread, vector = sch.split(element_loop, [None, threads, lanes])
    sch.bind(thread, "threadIdx.x")
    # Several vectors per thread in flight: remote loads take ~180 cycles.
    chunks = int(sch.get(outer).extent)
    unrolled = next(f for f in (4, 2, 1) if chunks % f == 0)
    if unrolled == 1:
        return outer, thread, None, vector
    outer, chunk = sch.split(outer, [None, unrolled])
    sch.reorder(outer, thread, chunk)
    sch.unroll(chunk)
    return outer, thread, chunk, vector


def _cluster_size(sch: s_tir.Schedule, block, collective: str) -> int:
    loops = sch.get_loops(block)
    size = sch.get(loops[0]).annotations.get(CLUSTER_SIZE_KEY) if loops else None
    if size is None:
        raise ClusterError(
            f"{collective}: block {sch.get(block).name_hint} is not computed at a cluster loop "
            "(tvm_dsm.schedule.bind_cluster, then compute_at)"
        )
    if int(size) < 2:
        raise ClusterError(f"{collective} needs a cluster of at least 2 CTAs, got {int(size)}")
    return int(size)


def _dsm_read_cache(sch: s_tir.Schedule, block, collective: str):
    """(a DSM copy of the block's DSM operand, made by ``cache_read`` at the block, cluster size)."""
    _check_reads_dsm(sch, block, collective)
    size = _cluster_size(sch, block, collective)
    read_index = next(
        n for n, region in enumerate(sch.get(block).reads)
        if str(region.source.ty.storage_scope) == DSM_SCOPE
    )
    return sch.cache_read(block, read_index, DSM_SCOPE), size


def _own_parts_by_rank(sch: s_tir.Schedule, cache, m: int) -> None:
    """Lay the cache out so that part ``i // m`` of its last axis lives in the CTA of that rank."""
    ndim = len(sch.get(cache).writes[0].source.ty.shape)
    sch.transform_layout(
        cache,
        ("write", 0),
        IndexMap.from_func(
            lambda *i: (i[-1] // m, *i[:-1], i[-1] % m), ndim=ndim, index_dtype="int32"
        ),
    )


def _collective(sch, block, name: str, threads: int, vector_bytes: int, rotate: bool) -> None:
    _check_reads_dsm(sch, block, name)
    _cluster_size(sch, block, name)
    elem_bytes = _element_bytes(sch, block)
    loops = sch.get_loops(block)
    kinds = [int(iv.iter_type) for iv in sch.get(block).iter_vars]
    reduce = kinds[-1] == tirx.IterVar.CommReduce
    if len(loops) < 3:
        raise ClusterError(f"{name}: compute the block at the cluster loop first (compute_at)")
    rank, element = loops[1], loops[-2] if reduce else loops[-1]
    bind_rank(sch, rank)
    _, thread, chunk, vector = _schedule_elements(
        sch, block, element, threads, vector_bytes, elem_bytes
    )
    if not reduce:
        sch.vectorize(vector)
        return
    per_vector = chunk if chunk is not None else thread  # the loop right above the peers
    peer = sch.get_loops(block)[-1]
    sch.reorder(per_vector, peer, vector)
    sch.unroll(peer)  # every peer's vector requested before the first add waits
    # Accumulate in registers and write the CTA's result slice once per vector.
    result = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(result, per_vector)
    sch.vectorize(sch.get_loops(result)[-1])
    sch.vectorize(vector)  # before decompose_reduction: vectorize needs a reduction block
    sch.decompose_reduction(block, peer)
    if rotate:
        sch.annotate(peer, ROTATE_PEERS_KEY, 1)


def all_exchange(sch: s_tir.Schedule, block, *, threads: int = 128, vector_bytes: int = 16) -> None:
    """Schedule ``Y[r, i] = combine_p X[p, i]``: each CTA reads all S-1 peers' tiles."""
    _collective(sch, block, "all_exchange", threads, vector_bytes, rotate=True)


def reduce_scatter(
    sch: s_tir.Schedule, block, *, threads: int = 128, vector_bytes: int = 16, bulk: bool = False
) -> None:
    """Schedule ``Y[r, j] = sum_p X[p, r*m + j]``: CTA r reads part r of every peer's tile.

    ``bulk``: PTX's bulk reduction into shared::cluster is integer-only, so a float sum is a
    copy and a local add: every CTA p pushes part r of its tile into CTA r's staging buffer
    ``S[r, p, j]`` (``cache_read`` + ``transform_layout``, a bulk copy), and CTA r adds its
    staging rows from its own SMEM.
    """
    if not bulk:
        _collective(sch, block, "reduce_scatter", threads, vector_bytes, rotate=True)
        return
    staging, size = _dsm_read_cache(sch, block, "reduce_scatter")
    peer, *middle, elements = sch.get_loops(staging)[1:]
    m = int(sch.get(elements).extent) // size
    _own_parts_by_rank(sch, staging, m)
    owner, _ = sch.split(elements, [size, m])
    sch.reorder(owner, peer, *middle)
    bulk_copy(sch, staging)
    _collective(sch, block, "reduce_scatter", threads, vector_bytes, rotate=False)


def all_gather(
    sch: s_tir.Schedule, block, *, threads: int = 128, vector_bytes: int = 16, bulk: bool = False
) -> None:
    """Schedule ``Y[r, i] = Z[i // m, i % m]``: CTA r reads part q of the tile from rank q
    (``bulk``: rank q pushes its part to every CTA through the copy engine)."""
    if bulk:
        bulk_copy(sch, block)
    else:
        _collective(sch, block, "all_gather", threads, vector_bytes, rotate=False)


def bulk_copy(sch: s_tir.Schedule, block) -> None:
    """Mark a copy ``Y[r, ...] = X[q, ...]`` between DSM buffers, computed at the cluster loop,
    for bulk transfer: CTA q pushes each contiguous run to CTA r with one
    ``cp.async.bulk.shared::cluster`` completing on r's mbarrier. Runs must be multiples of 16 B
    (checked when lowering); the copy runs once per launch (not inside a loop)."""
    _check_reads_dsm(sch, block, "bulk_copy")
    _cluster_size(sch, block, "bulk_copy")
    stmt = sch.get(block)
    if len(stmt.reads) != 1 or str(stmt.writes[0].source.ty.storage_scope) != DSM_SCOPE:
        raise ClusterError(
            f"bulk_copy: block {stmt.name_hint} must copy one DSM buffer into a DSM buffer "
            "(place the result in DSM with tvm_dsm.schedule.place_in_dsm)"
        )
    if is_reduction(stmt):
        raise ClusterError(f"bulk_copy: block {stmt.name_hint} reduces; only copies move in bulk")
    loops = sch.get_loops(block)
    if len(loops) < 3:
        raise ClusterError("bulk_copy: compute the block at the cluster loop first (compute_at)")
    rank, *elements = loops[1:]
    bind_rank(sch, rank)
    sch.annotate(sch.fuse(*elements) if len(elements) > 1 else elements[0], BULK_COPY_KEY, 1)


def broadcast(
    sch: s_tir.Schedule, block, *, threads: int = 128, vector_bytes: int = 16, bulk: bool = False
) -> None:
    """Schedule ``Y[r, i] = X[root, i]`` in two phases, so the root serves its tile once.

    Scatter: a DSM copy of the root's tile (``cache_read``) is laid out with element i owned by
    rank ``i // m`` (``transform_layout``, m = n / S), and CTA r pulls part r from the root.
    All-gather: every CTA reads the S parts from their owners. The root sends n elements instead
    of (S - 1) n, and each CTA's SMEM serves n (S - 1) / S. ``bulk``: both phases are
    bulk pushes (the root's copy engine sends each part once).
    """
    parts, size = _dsm_read_cache(sch, block, "broadcast")
    elements = sch.get_loops(parts)[-1]
    n = int(sch.get(elements).extent)
    lanes = vector_bytes // _element_bytes(sch, block)
    if n % (size * lanes):
        raise ClusterError(
            f"broadcast: a tile of {n} elements does not split into {size} parts of whole "
            f"{vector_bytes}-byte vectors"
        )
    if not bulk and n % (size * lanes * threads):
        raise ClusterError(
            f"broadcast: each of the {size} parts of a {n}-element tile must fill {threads} "
            f"threads x {lanes}-element vectors (a larger tile, fewer CTAs, or bulk=True)"
        )
    m = n // size
    _own_parts_by_rank(sch, parts, m)
    owner, part = sch.split(elements, [size, m])
    if bulk:
        sch.reorder(owner, *sch.get_loops(parts)[1:-2])  # the owner loop is the rank loop
        bulk_copy(sch, parts)
        bulk_copy(sch, block)
        return
    bind_rank(sch, owner)
    *_, vector = _schedule_elements(sch, parts, part, threads, vector_bytes, _element_bytes(sch, block))
    sch.vectorize(vector)
    _collective(sch, block, "broadcast", threads, vector_bytes, rotate=False)


def shuffle(sch: s_tir.Schedule, block, *, threads: int = 128, vector_bytes: int = 16) -> None:
    """Schedule a ring pass ``Y[r, i] = f(X[(r + t) % S, i] for t)``: round t reads rank r+t."""
    _collective(sch, block, "shuffle", threads, vector_bytes, rotate=False)


def inter_cluster_reduce(sch: s_tir.Schedule, block, *, threads: int = 128) -> None:
    """Schedule ``O[i] = sum_k P[k, i]``, P being clusters' partials in global memory, as its own
    kernel: one thread per output element, adding the partials in order (deterministic)."""
    stmt = sch.get(block)
    kinds = [int(iv.iter_type) for iv in stmt.iter_vars]
    partials = [r.source for r in stmt.reads if str(r.source.ty.storage_scope) == "global"]
    if kinds[-1] != tirx.IterVar.CommReduce or not partials:
        raise ClusterError(
            f"inter_cluster_reduce: block {stmt.name_hint} must reduce (last iterator) over "
            "partials in global memory"
        )
    *spatial, _ = sch.get_loops(block)
    grid, thread = sch.split(sch.fuse(*spatial), [None, threads])
    sch.bind(grid, "blockIdx.x")
    sch.bind(thread, "threadIdx.x")
    result = sch.cache_write(block, 0, "local")  # accumulate in a register, store once
    sch.reverse_compute_at(result, thread)
