"""Schedule a fused cascade (FuseCascadedReductions with ``parts`` or ``lanes`` > 1) on the GPU.

One CTA per row, one cluster per row when the cascade was fused with ``ranks`` > 1, or
``rows_per_cta`` rows per CTA (``threadIdx.z``) when it was fused with that. Every thread block
of the fused nest (``*_part``, ``*_merge*``, ``*_final``) loops over (part, lane): parts go to
``threadIdx.y`` (and part p to rank p % ranks), lanes to ``threadIdx.x``, so the lanes of a part
are adjacent threads of one warp (their shuffles stay inside it). Partial states live in shared
memory; with ranks they are DSM buffers ``[ranks, ...]`` so that the final merge reads each CTA's
last partial through DSM. With several rows per CTA they stay in registers: the fused block
allocates them per row, so in shared memory the rows would collide, and the rewrite allows it
only where each thread reads back its own.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ..errors import ClusterError
from ..annotations import RANKS_ATTR, ROWS_PER_CTA_ATTR
from ..schedule.cluster import bind_clusters, bind_rank
from ..schedule.dsm import DSM_SCOPE
from ..transform.buffers import STATIC_SLICES_BUDGET, buffer_bytes

_THREAD_BLOCKS = ("_part", "_merge", "_final")


def schedule_fused_rows(func: tirx.PrimFunc) -> s_tir.Schedule:
    """Bind every fused cascade's rows to CTAs (clusters) and its thread blocks to threads."""
    sch = s_tir.Schedule(func)
    parts = [rv for rv in _all_blocks(sch) if sch.get(rv).name_hint.endswith("_part")]
    if not parts:
        raise ClusterError("no split cascade: run FuseCascadedReductions(parts=P) with P > 1 first")
    row_loops, threads = [], None
    for part in parts:
        name = sch.get(part).name_hint[: -len("_part")]
        fused = sch.get_sblock(name)
        blocks = [rv for rv in _all_blocks(sch) if any(
            sch.get(rv).name_hint.startswith(name + suffix) for suffix in _THREAD_BLOCKS)]
        rows = sch.get_loops(fused)
        row = sch.fuse(*rows) if len(rows) > 1 else rows[0]
        n_parts = _extent(sch, sch.get_loops(part)[-2])
        final = sch.get(sch.get_sblock(name + "_final")).annotations
        ranks = int(final[RANKS_ATTR])
        rows_per_cta = int(final.get(ROWS_PER_CTA_ATTR, 1))
        if ranks > 1:
            bind_clusters(sch, row, ranks)
        elif rows_per_cta > 1:
            if _extent(sch, row) % rows_per_cta:
                raise ClusterError(f"{name}: {_extent(sch, row)} rows do not split into CTAs of {rows_per_cta}")
            cta, row = sch.split(row, [None, rows_per_cta])
            sch.bind(cta, "blockIdx.x")
            sch.bind(row, "threadIdx.z")
        else:
            sch.bind(row, "blockIdx.x")
        row_loops.append(row)
        slices = 0
        for block in blocks:
            part_loop, lane_loop = sch.get_loops(block)[-2:]
            threads = (n_parts // ranks, _extent(sch, lane_loop))
            if ranks > 1:
                group, rank = sch.split(part_loop, [None, ranks])  # part p on rank p % ranks
                sch.bind(group, "threadIdx.y")
                bind_rank(sch, rank)
            else:
                sch.bind(part_loop, "threadIdx.y")
            sch.bind(lane_loop, "threadIdx.x")
            if sch.get(block).name_hint.endswith("_final"):
                continue
            for index in range(len(sch.get(block).writes)):  # partial states, between threads
                if ranks > 1:
                    slices += buffer_bytes(sch.get(block).writes[index].source) // ranks
                    sch.transform_layout(block, ("write", index),
                                         lambda p, *rest: (p % ranks, p // ranks, *rest))
                sch.set_scope(block, index, DSM_SCOPE if ranks > 1 else "local" if rows_per_cta > 1 else "shared")
        # A copy ring (FuseCascadedReductions' copy_stages) is static shared memory beside them.
        ring = sum(buffer_bytes(b) for b in sch.get(part).alloc_buffers if str(b.ty.storage_scope) == "shared")
        if ranks > 1 and slices + ring > STATIC_SLICES_BUDGET:
            raise ClusterError(
                f"{name}: the partial states take {slices} B per CTA"
                + (f" and the copy ring {ring} B" if ring else "")
                + f"; a cluster merge keeps them in static shared memory ({STATIC_SLICES_BUDGET} B): "
                "use fewer parts per CTA" + (" or copy stages" if ring else ""))
        # Intermediate results (not parameters) stay in the row's CTA for its epilogue.
        params = list(func.params)
        for index, region in enumerate(sch.get(fused).writes):
            if not any(region.source.same_as(p) for p in params):
                sch.set_scope(fused, index, "shared")
    # Element-wise stages after the cascade (e.g. o / l) run in the row's CTA, on its threads.
    fused_names = {sch.get(p).name_hint[: -len("_part")] for p in parts}
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        if sch.get(block).name_hint in fused_names:
            continue
        for row in row_loops:
            try:
                sch.reverse_compute_at(block, row)
                break
            except Exception:  # noqa: BLE001 - not a consumer of this row: try the next
                continue
        else:
            raise ClusterError(
                f"stage {sch.get(block).name_hint} is not a per-row consumer of the fused "
                "cascade; schedule it separately"
            )
        loops = sch.get_loops(block)
        loops = loops[[sch.get(loop).same_as(sch.get(row)) for loop in loops].index(True) + 1:]
        if loops:
            inner = sch.fuse(*loops) if len(loops) > 1 else loops[0]
            _, y, x = sch.split(inner, [None, *threads])
            sch.bind(y, "threadIdx.y")
            sch.bind(x, "threadIdx.x")
    return sch


def _extent(sch: s_tir.Schedule, loop) -> int:
    return int(sch.get(loop).extent)


def _all_blocks(sch: s_tir.Schedule) -> list:
    found, stack = [], [sch.get_sblock("root")]
    while stack:
        for child in sch.get_child_blocks(stack.pop()):
            found.append(child)
            stack.append(child)
    return found
